"""Replicas: a unit's death loses no row (docs/design.md, "Replicas").

Real unit processes started with --replicas; values are checked byte for byte.
Row g lives on units g % N and (g + 1) % N (R = 2): a get of a row whose unit
is down or restarted reads the next one, a put lands on the live units of a row
whose other unit's process is gone (counted as under-replicated), and a row
whose units are all down fails with a clear error naming it.
"""

import collections
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

import dataplane

from conftest import _cli, _die_with_parent, _tail

WIDTH = 1024  # float32 per row: 4 KiB


def _env():
    # Not the sanitizer runtime this interpreter may have preloaded (pytest-asan.sh).
    return {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}


class Units:
    """N `dataplane unit` processes started one by one (no supervisor: a killed
    unit stays dead until start(i) is called again, on its port)."""

    def __init__(self, tmp_path, n, replicas, replicas_of=None, slab="64M", extra=None):
        self.tmp, self.n, self.replicas = tmp_path, n, replicas
        self.replicas_of = replicas_of or {}
        self.slab, self.extra = slab, extra or (lambda i: [])
        self.procs = [None] * n
        self.addrs = [None] * n
        for i in range(n):
            self.start(i)

    def start(self, i):
        port = self.addrs[i].rsplit(":", 1)[1] if self.addrs[i] else "0"
        log = self.tmp / f"unit{i}.log"
        p = subprocess.Popen(
            [_cli(), "unit", "--unit-id", str(i), "--units", str(self.n), "--replicas",
             str(self.replicas_of.get(i, self.replicas)), "--slab", self.slab, "--port", port,
             *self.extra(i)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=open(log, "ab"),
            env=_env(), preexec_fn=_die_with_parent)
        line = p.stdout.readline().decode().strip()
        assert line.startswith("tcp://"), f"unit {i} did not start: {_tail(log)}"
        self.procs[i], self.addrs[i] = p, line

    def kill(self, i):
        self.procs[i].send_signal(signal.SIGKILL)
        self.procs[i].wait()

    def stop(self):
        for p in self.procs:
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            if p is not None:
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


@pytest.fixture
def units3(tmp_path):
    u = Units(tmp_path, 3, 2)
    yield u
    u.stop()


def _rows_of(rows, version):
    """Each row's own content: row g, version v -> g * 1e4 + v + position."""
    t = torch.arange(WIDTH, dtype=torch.float32).repeat(len(rows), 1)
    base = torch.tensor([float(g * 10000 + version) for g in rows]).unsqueeze(1)
    return t + base


def _check(client, rows, version):
    got = client.get(rows, ["x"], stack=True)["x"]
    assert torch.equal(got, _rows_of(rows, version)), "wrong bytes"


def test_units_report_replicas_and_bad_counts_are_refused(tmp_path, units3):
    c = dataplane.Client(units3.addrs, timeout_s=10)
    assert c.replicas == 2
    c.close()
    r = subprocess.run([_cli(), "unit", "--units", "2", "--replicas", "3"],
                       capture_output=True, text=True, env=_env(), timeout=30)
    assert r.returncode != 0
    assert "--replicas 3 needs at least as many units" in r.stderr
    r = subprocess.run([_cli(), "unit", "--units", "5", "--replicas", "4"],
                       capture_output=True, text=True, env=_env(), timeout=30)
    assert r.returncode != 0 and "--replicas" in r.stderr
    r = subprocess.run([_cli(), "up", "--units", "1", "--replicas", "2", "--dir",
                        str(tmp_path / "x")], capture_output=True, text=True, env=_env(),
                       timeout=30)
    assert r.returncode != 0 and "--replicas 2 needs at least as many units" in r.stderr
    # read leases: 3 units or more, replicas, a cluster to ask; seconds >= 0
    for args in (["--units", "2", "--replicas", "2", "--repair-from", "tcp://127.0.0.1:1"],
                 ["--units", "3", "--replicas", "1", "--repair-from", "tcp://127.0.0.1:1"],
                 ["--units", "3", "--replicas", "2"]):
        r = subprocess.run([_cli(), "unit", *args, "--lease", "2"], capture_output=True,
                           text=True, env=_env(), timeout=30)
        assert r.returncode == 2 and "--lease needs --replicas 2 or 3 on at least 3 units" \
            in r.stderr, (args, r.stderr)
    r = subprocess.run([_cli(), "unit", "--units", "3", "--replicas", "2", "--lease", "-1"],
                       capture_output=True, text=True, env=_env(), timeout=30)
    assert r.returncode == 2 and "--lease" in r.stderr, r.stderr


def test_units_that_disagree_on_replicas_are_refused(tmp_path):
    u = Units(tmp_path, 2, 2, replicas_of={1: 1})
    try:
        with pytest.raises(dataplane.ProtocolError, match="same --replicas"):
            dataplane.Client(u.addrs, timeout_s=10)
    finally:
        u.stop()


def test_a_unit_killed_for_good_loses_no_row(units3):
    c = dataplane.Client(units3.addrs, timeout_s=20)
    rows = list(range(60))
    c.put(rows, {"x": _rows_of(rows, 1)})
    _check(c, rows, 1)
    assert c.counters()["under_replicated_rows"] == 0
    units3.kill(1)
    # every row is still had, from its other unit, by this client and a fresh one
    _check(c, rows, 1)
    fresh = dataplane.Client(units3.addrs, timeout_s=20)
    _check(fresh, rows, 1)
    # a put lands on the live units of each row; the rows of unit 1 are counted
    c.put(rows, {"x": _rows_of(rows, 2)})
    short = [g for g in rows if g % 3 in (0, 1)]  # rows with a copy on unit 1
    assert c.counters()["under_replicated_rows"] == len(short)
    _check(c, rows, 2)
    _check(fresh, rows, 2)
    # a clear reaches every live copy: the rows are gone whichever unit answers
    c.clear(rows[:30])
    with pytest.raises(dataplane.NotFound):
        c.get(rows[:30], ["x"])
    _check(fresh, rows[30:], 2)
    c.close()
    fresh.close()


def test_a_restarted_unit_comes_back_empty_and_gets_fall_back(units3):
    c = dataplane.Client(units3.addrs, timeout_s=20)
    rows = list(range(30))
    c.put(rows, {"x": _rows_of(rows, 1)})
    c.put(rows, {"y": _rows_of(rows, 7)[:, :16].clone()})
    units3.kill(0)
    units3.start(0)  # on its port, a new process holding nothing
    copied = c.counters()["copied_bytes"]
    got = c.get(rows, ["x", "y"], stack=True)  # rows 0, 3, 6... from their other unit
    assert torch.equal(got["x"], _rows_of(rows, 1)), "wrong bytes"
    assert torch.equal(got["y"], _rows_of(rows, 7)[:, :16]), "wrong bytes"
    # The second turn's values landed in the places the first kept for them:
    # each field still one view of the fetched memory, nothing copied.
    assert c.counters()["copied_bytes"] == copied
    # Rows of other sizes than their neighbours: a kept place too small is not
    # used (the value lands elsewhere), never written past.
    units3.kill(0)
    units3.start(0)
    jag = [torch.full((1 + (g * 7) % 13,), float(g), dtype=torch.float64) for g in rows]
    c.put(rows, {"z": jag})
    units3.kill(1)
    units3.start(1)
    back = c.get(rows, ["z"])["z"]
    assert all(torch.equal(a, b) for a, b in zip(back, jag)), "wrong bytes"
    c.put(rows, {"x": _rows_of(rows, 2)})  # lands on all three again
    assert c.counters()["under_replicated_rows"] == 0
    units3.kill(1)
    _check(c, rows, 2)
    c.close()


def test_rows_whose_units_are_all_down_fail_clearly(units3):
    c = dataplane.Client(units3.addrs, timeout_s=10)
    rows = list(range(30))
    c.put(rows, {"x": _rows_of(rows, 1)})
    units3.kill(0)
    units3.kill(1)
    lost = [g for g in rows if g % 3 == 0]  # on units 0 and 1
    kept = [g for g in rows if g % 3 != 0]  # a copy on unit 2
    _check(c, kept, 1)
    with pytest.raises(dataplane.TransferError) as e:
        c.get(lost, ["x"])
    assert f"'{lost[0]}@x'" in str(e.value) and "down" in str(e.value)
    with pytest.raises(dataplane.TransferError) as e:
        c.put(lost, {"x": _rows_of(lost, 2)})
    assert "rows not landed:" in str(e.value) and f" {lost[-1]}" in str(e.value)
    c.close()


@pytest.mark.parametrize("n_units", [3, 4])
def test_puts_and_gets_ride_through_units_killed_one_at_a_time(tmp_path, n_units):
    """Two writers while units are SIGKILLed one at a time and started again
    (empty), each unit in turn: every put that returned landed, every get of
    a landed row returns its bytes, nothing wrong is ever read. The writers
    put their rows again and again, so each restarted unit is refilled before
    the next one dies (the repair's job, not built yet)."""
    units = Units(tmp_path, n_units, 2)
    stop = threading.Event()
    landed = {}  # row -> version a successful put wrote (the writers own disjoint rows)
    lock = threading.Lock()
    errors = []
    puts = [0, 0]

    def writer(k):
        c = dataplane.Client(units.addrs, timeout_s=30)
        mine = list(range(k * 100, k * 100 + 48))
        v = 0
        try:
            while not stop.is_set():
                v += 1
                c.put(mine, {"x": _rows_of(mine, v)})
                puts[k] += 1
                with lock:
                    for g in mine:
                        landed[g] = v
                got = c.get(mine, ["x"], stack=True)["x"]
                if not torch.equal(got, _rows_of(mine, v)):
                    errors.append(f"writer {k}: wrong bytes after put {v}")
        except Exception as e:  # noqa: BLE001 - reported by the test
            errors.append(f"writer {k}: {e!r}")
        finally:
            c.close()

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    try:
        for i in range(n_units + 1):
            time.sleep(1.5)
            units.kill(i % n_units)
            time.sleep(1.0)
            units.start(i % n_units)
        time.sleep(1.5)
    finally:
        stop.set()
        for t in threads:
            t.join(120)
    try:
        assert not errors, errors
        assert min(puts) > 10, puts
        c = dataplane.Client(units.addrs, timeout_s=20)
        for g, v in sorted(landed.items()):
            _check(c, [g], v)
        c.close()
    finally:
        units.stop()


_WRITER = """
import sys, torch, dataplane
sys.path.insert(0, sys.argv[2])
from test_replicas import _rows_of
c = dataplane.Client(sys.argv[1].split(","), timeout_s=30)
rows = list(range(64))
v = 0
while True:
    v += 1
    c.put(rows, {"x": _rows_of(rows, v)})
    print(v, flush=True)
"""


def test_a_writer_killed_mid_put_leaves_whole_values_on_every_copy(units3):
    """A writer SIGKILLed in the middle of its puts (R = 2): whichever unit
    answers, each row holds one whole version, never a mix or torn bytes."""
    here = os.path.dirname(os.path.abspath(__file__))
    for attempt in range(3):
        w = subprocess.Popen([sys.executable, "-c", _WRITER, ",".join(units3.addrs), here],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        for _ in range(3 + attempt):  # let it finish a few puts, then kill it in one
            assert w.stdout.readline(), "the writer stopped"
        time.sleep(0.002 * attempt)
        w.send_signal(signal.SIGKILL)
        w.wait()
    c = dataplane.Client(units3.addrs, timeout_s=20)

    def whole_versions():
        got = c.get(list(range(64)), ["x"], stack=True)["x"]
        for g in range(64):
            v = int(got[g, 0].item()) - g * 10000
            assert v >= 1 and torch.equal(got[g], _rows_of([g], v)[0]), f"row {g} torn"

    whole_versions()  # the first copies
    units3.kill(0)  # rows homed on unit 0 now come from unit 1: their second copies
    whole_versions()
    c.close()


def test_checkpoint_keeps_one_copy_and_loads_into_any_count(tmp_path, units3):
    c = dataplane.Client(units3.addrs, timeout_s=20)
    rows = list(range(40))
    c.put(rows, {"x": _rows_of(rows, 1)})
    c.put(rows[:20], {"x": _rows_of(rows[:20], 2)})  # half the first blobs dead
    want = torch.cat([_rows_of(rows[:20], 2), _rows_of(rows[20:], 1)])
    one_copy = len(rows) * WIDTH * 4
    s = c.save(tmp_path / "ck")
    assert s["replicas"] == 2 and s["copies"] == 1 and s["n_units"] == 3
    # each row once (each unit's blobs of its own rows, written anew where they
    # held copies too): about one copy's bytes, not two
    assert one_copy <= s["bytes"] < 1.25 * one_copy, s
    c.clear(rows)
    put_bytes = c.counters()["put_bytes"]
    s = c.load(tmp_path / "ck")  # the same shape: the units load the shards
    assert s["copies"] == 1 and s["loaded"] > 0
    assert c.counters()["put_bytes"] == put_bytes  # nothing through this client
    assert torch.equal(c.get(rows, ["x"], stack=True)["x"], want)
    units3.kill(2)  # both copies came back: any one unit may go
    assert torch.equal(c.get(rows, ["x"], stack=True)["x"], want)
    c.close()
    for reps, sub in ((1, "r1"), (3, "r3")):
        (tmp_path / sub).mkdir()
        other = Units(tmp_path / sub, 3, reps)
        try:
            c1 = dataplane.Client(other.addrs, timeout_s=20)
            assert c1.replicas == reps
            s = c1.load(tmp_path / "ck")  # loaded by the units, not through c1
            assert c1.counters()["put_bytes"] == 0
            assert torch.equal(c1.get(rows, ["x"], stack=True)["x"], want)
            if reps == 3:  # every unit holds every row: two may go
                other.kill(0)
                other.kill(1)
                assert torch.equal(c1.get(rows, ["x"], stack=True)["x"], want)
            c1.close()
        finally:
            other.stop()
    (tmp_path / "n2").mkdir()
    two = Units(tmp_path / "n2", 2, 1)
    try:
        c2 = dataplane.Client(two.addrs, timeout_s=20)
        c2.load(tmp_path / "ck")  # another number of units: re-homed through c2
        assert torch.equal(c2.get(rows, ["x"], stack=True)["x"], want)
        assert c2.counters()["put_bytes"] == one_copy  # each key once
        c2.close()
    finally:
        two.stop()


# ---- repair: `dataplane up --restart` starts a dead unit again and it fills
# itself from its peers (docs/design.md, "Repair") ----


class Up:
    """`dataplane up --restart --replicas 2` of n units."""

    def __init__(self, tmp_path, n, *extra):
        import json
        self.json = json
        self.dir = tmp_path / "up"
        self.log = tmp_path / "up.log"
        self.proc = subprocess.Popen(
            [_cli(), "up", "--units", str(n), "--replicas", "2", "--restart",
             "--slab", "64M", "--dir", str(self.dir), *extra],
            stdin=subprocess.DEVNULL, stdout=open(self.log, "wb"), stderr=subprocess.STDOUT,
            env=_env(), start_new_session=True, preexec_fn=_die_with_parent)
        end = time.monotonic() + 60
        while not (self.dir / "cluster.json").exists():
            assert self.proc.poll() is None, _tail(self.log)
            assert time.monotonic() < end, _tail(self.log)
            time.sleep(0.05)

    def pid(self, i):
        end = time.monotonic() + 60
        while True:
            try:
                return self.json.load(open(self.dir / "cluster.json"))["units"][i]["pid"]
            except (OSError, ValueError, KeyError):
                assert self.proc.poll() is None, _tail(self.log)  # up stopped
                assert time.monotonic() < end, _tail(self.log)
                time.sleep(0.02)  # being replaced

    def kill(self, i, wait=True):
        """SIGKILL unit i; with wait, until up has started it again."""
        p = self.pid(i)
        os.kill(p, signal.SIGKILL)
        end = time.monotonic() + 60
        while wait and self.pid(i) == p:
            assert self.proc.poll() is None, _tail(self.log)
            assert time.monotonic() < end, _tail(self.log)
            time.sleep(0.05)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _repaired(c, i, timeout=60):
    """Unit i's stats once its repair ended (state 2 done, 3 partial)."""
    end = time.monotonic() + timeout
    while True:
        st = c.stats()[i]
        if st["repair_state"] in (2, 3):
            return st
        assert time.monotonic() < end, f"unit {i}'s repair did not end: {st}"
        time.sleep(0.05)


@pytest.fixture
def up3(tmp_path):
    u = Up(tmp_path, 3)
    yield u
    u.stop()


def test_a_restarted_unit_is_repaired_and_a_second_death_loses_nothing(up3):
    c = dataplane.Client(up3.dir, timeout_s=20)
    rows = list(range(90))
    c.put(rows, {"x": _rows_of(rows, 1), "y": _rows_of(rows, 1)[:, :8].clone()})
    up3.kill(1)
    st = _repaired(c, 1)
    held = [g for g in rows if g % 3 in (0, 1)]  # rows with a copy on unit 1
    assert st["repair_state"] == 2 and st["repair_failed"] == 0, st
    assert st["repair_keys"] == 2 * len(held) and st["entries"] == 2 * len(held), st
    up3.kill(2, wait=False)  # the other copy of rows 1, 4, ...: unit 1's must serve them
    _check(c, rows, 1)
    got = c.get(rows, ["y"], stack=True)["y"]
    assert torch.equal(got, _rows_of(rows, 1)[:, :8])
    c.close()


_STUCK_WRITER = """
import sys, torch, dataplane
sys.path.insert(0, sys.argv[2])
from test_replicas import _rows_of
c = dataplane.Client(sys.argv[1], timeout_s=120)
rows = list(range(30))
print("open", flush=True)
sys.stdin.readline()  # the test stopped a unit
c.put(rows, {"x": _rows_of(rows, 2)})
print("returned", flush=True)
"""


def _stats_of_live(addrs):
    """Each unit's stats, None for one that does not answer within 1 s."""
    c = dataplane.Client(addrs, timeout_s=1, connect_timeout_s=2)
    try:
        return c.stats()
    except dataplane.Error as e:
        return [s if s and "commits" in s else None for s in (e.stats or [None] * 3)]
    finally:
        c.close()


def test_a_pass_makes_the_copies_a_dead_writer_left_different_agree(tmp_path):
    """R = 2, a pass every second: a writer's put reaches two of the three
    units (the third is stopped) and the writer dies before it returns, so
    the copies of most of its rows differ (its version on one unit, the one
    before on the stopped one). Once the stopped unit runs again, a pass
    copies the higher version over: every copy of every row holds the
    writer's value, the newer of the two."""
    up = Up(tmp_path, 3, "--repair-every", "1")
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        c = dataplane.Client(up.dir, timeout_s=20)
        rows = list(range(30))
        c.put(rows, {"x": _rows_of(rows, 1)})
        addrs = [u["zmq"] for u in up.json.load(open(up.dir / "cluster.json"))["units"]]
        before = _stats_of_live(addrs)
        w = subprocess.Popen([sys.executable, "-c", _STUCK_WRITER, str(up.dir), here],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL)
        assert w.stdout.readline() == b"open\n", "the writer did not open"
        stopped = up.pid(1)
        os.kill(stopped, signal.SIGSTOP)
        try:
            w.stdin.write(b"go\n")
            w.stdin.flush()
            # The writer's blobs commit on units 0 and 2; unit 1's part waits.
            end = time.monotonic() + 60
            while True:
                now = _stats_of_live(addrs)
                if all(now[i] and now[i]["commits"] > before[i]["commits"] for i in (0, 2)):
                    break
                assert time.monotonic() < end, f"the writer's commits never came: {now}"
                time.sleep(0.1)
            w.send_signal(signal.SIGKILL)
            w.wait()
        finally:
            os.kill(stopped, signal.SIGCONT)
        assert up.pid(1) == stopped  # neither killed nor restarted: it kept version 1
        # Passes: unit 1 copies version 2 of its rows in (from units 0 and 2).
        copied = len([g for g in rows if g % 3 in (0, 1)])
        end = time.monotonic() + 60
        while (st := c.stats()[1])["repair_keys"] < copied:
            assert time.monotonic() < end, f"no pass copied the newer versions: {st}"
            time.sleep(0.1)
        assert st["repair_keys"] == copied and st["repair_passes"] >= 1, st
        # Every copy holds version 2: each row's first copy, then (unit 0 and
        # then unit 2 killed) the second copies of rows homed there.
        _check(c, rows, 2)
        up.kill(0)  # up restarts it: empty, repaired; meanwhile rows 0, 3, ... from unit 1
        _check(c, rows, 2)
        assert _repaired(c, 0)["repair_state"] == 2
        up.kill(1)  # rows 1, 4, ... from unit 2
        _check(c, rows, 2)
        c.close()
    finally:
        up.stop()


def _free_ports(n):
    import socket
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def test_leases_land_puts_without_a_silent_unit_and_no_get_reads_its_older_copy(tmp_path):
    """R = 2 on 3 units with read leases (--lease 2; docs/design.md, "Leases"):
    unit 1 stopped (alive and silent, as a host behind an outage): puts of
    its rows land on their other units once the other two fenced it (counted
    under-replicated), and gets read them there. Once it runs again it holds
    older copies: readers started before it resumes never get one (it answers
    no read until a pass caught it up), and then it serves the new values
    itself. Without leases those puts fail (test_outage)."""
    ports = _free_ports(3)
    addrs = ",".join(f"tcp://127.0.0.1:{p}" for p in ports)
    units = Units(tmp_path, 3, 2, extra=lambda i: [
        "--port", str(ports[i]), "--repair-from", addrs, "--lease", "2"])
    stopped = units.procs[1].pid
    stale, gets, errors = [], [0], []
    stop = threading.Event()
    threads = []
    rows = list(range(60))

    def reader():
        r = dataplane.Client(units.addrs, timeout_s=6)
        want = _rows_of(rows, 3)
        while not stop.is_set():
            try:
                got = r.get(rows, ["x"], stack=True)["x"]
            except dataplane.Error as e:
                errors.append(str(e))
                continue
            gets[0] += 1
            bad = [g for g, a, b in zip(rows, got, want) if not torch.equal(a, b)]
            if bad:
                stale.append(bad)
        r.close()

    try:
        # 6 s: each call waits a third of it for the stopped unit, then fences it
        c = dataplane.Client(units.addrs, timeout_s=6)
        c.put(rows, {"x": _rows_of(rows, 1)})
        os.kill(stopped, signal.SIGSTOP)
        try:
            for v in (2, 3):
                c.put(rows, {"x": _rows_of(rows, v)})
                _check(c, rows, v)
            on_1 = len([g for g in rows if g % 3 in (0, 1)])
            assert c.counters()["under_replicated_rows"] == 2 * on_1
            threads = [threading.Thread(target=reader, daemon=True) for _ in range(2)]
            for t in threads:
                t.start()
            time.sleep(0.5)
        finally:
            os.kill(stopped, signal.SIGCONT)
        # caught up by a pass (or by its repair at start, when that was still
        # running: either copies the newer versions in), it holds a lease again
        end = time.monotonic() + 60
        while not (st := c.stats()[1])["lease_ok"]:
            assert time.monotonic() < end, f"unit 1 never caught up: {st}"
            time.sleep(0.1)
        time.sleep(1)
        stop.set()
        for t in threads:
            t.join()
        assert not errors, errors[:3]
        assert not stale, f"{len(stale)} of {gets[0]} gets read older copies: {stale[:3]}"
        assert gets[0] > 0
        assert all(s["fences"] >= 1 for s in (c.stats()[0], c.stats()[2]))
        units.kill(0)  # rows 0, 3, ... now from unit 1 alone, and 1, 4, ... first there
        mine = [g for g in rows if g % 3 in (0, 1)]
        _check(c, mine, 3)
        c.close()
    finally:
        stop.set()
        for t in threads:
            t.join(30)
        units.stop()


def test_leases_ride_units_stopped_in_turn_with_no_older_read(tmp_path):
    """R = 2 on 3 units with read leases, each unit in turn: SIGSTOPped, every
    row put at a new version (it lands without the stopped unit), the unit
    resumed while two readers get every row, and caught up by its pass
    before the next one stops: no get returns a version older than the last
    one acked before it began (the resumed unit holds the older one until
    then), and every put and get succeeds. DP_LEASE_SOAK_S sets how long
    (12 s)."""
    soak = float(os.environ.get("DP_LEASE_SOAK_S", "12"))
    ports = _free_ports(3)
    addrs = ",".join(f"tcp://127.0.0.1:{p}" for p in ports)
    units = Units(tmp_path, 3, 2, extra=lambda i: [
        "--port", str(ports[i]), "--repair-from", addrs, "--lease", "2"])
    rows = list(range(24))
    acked = [0]  # the last version a put returned for
    lock = threading.Lock()
    stop = threading.Event()
    older, errors, gets = [], [], [0]

    def reader():
        r = dataplane.Client(units.addrs, timeout_s=6)
        base = torch.arange(WIDTH, dtype=torch.float32)
        while not stop.is_set():
            with lock:
                floor = acked[0]
            try:
                got = r.get(rows, ["x"], stack=True)["x"]
            except dataplane.Error as e:
                errors.append(f"get: {e}")
                continue
            gets[0] += 1
            for g, row in zip(rows, got):
                v = int(row[0].item()) - g * 10000  # _rows_of: g * 1e4 + v + position
                if v < floor or not torch.equal(row, base + (g * 10000 + v)):
                    older.append((g, v, floor))
        r.close()

    w = dataplane.Client(units.addrs, timeout_s=6)
    w.put(rows, {"x": _rows_of(rows, 1)})
    acked[0] = 1
    threads = [threading.Thread(target=reader, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    k = 0
    try:
        end = time.monotonic() + soak
        while time.monotonic() < end:
            pid = units.procs[k % 3].pid
            os.kill(pid, signal.SIGSTOP)
            try:
                w.put(rows, {"x": _rows_of(rows, k + 2)})
                with lock:
                    acked[0] = k + 2
            finally:
                os.kill(pid, signal.SIGCONT)
            time.sleep(1)  # readers meet the resumed unit's older copies
            # its pass catches it up before the next unit stops: a row is
            # read while at most one of its units is down or behind
            caught = time.monotonic() + 30
            while not (st := w.stats()[k % 3])["lease_ok"]:
                assert time.monotonic() < caught, f"unit {k % 3} not caught up: {st}"
                time.sleep(0.05)
            k += 1
        under = w.counters()["under_replicated_rows"]
    finally:
        stop.set()
        for t in threads:
            t.join(30)
        w.close()
        units.stop()
    assert not older, f"{len(older)} older values read (row, version, floor): {older[:5]}"
    assert not errors, f"{len(errors)} errors: {errors[:3]}"
    assert gets[0] > 0 and under > 0  # rows landed without a stopped unit
    print(f"{k} units stopped in turn: {gets[0]} gets")


def test_passes_count_the_keys_a_dead_peer_held_copies_of(tmp_path):
    """R = 2 on 3 units, passes every second, no supervisor: unit 2 killed for
    good leaves the keys it shared with units 0 and 1 with one copy, and each
    of them says how many (under_replicated); once unit 2 is started again
    (empty) and repaired, the next passes find every copy and say 0."""
    ports = _free_ports(3)
    addrs = ",".join(f"tcp://127.0.0.1:{p}" for p in ports)
    units = Units(tmp_path, 3, 2, extra=lambda i: [
        "--port", str(ports[i]), "--repair-from", addrs, "--repair-every", "1"])
    try:
        c = dataplane.Client(units.addrs, timeout_s=20)
        rows = list(range(60))
        c.put(rows, {"x": _rows_of(rows, 1), "y": _rows_of(rows, 1)[:, :4].clone()})
        units.kill(2)
        # unit 0 shares rows 2, 5, ... with unit 2; unit 1 rows 1, 4, ...: two keys each
        want = {0: 2 * len([g for g in rows if g % 3 == 2]),
                1: 2 * len([g for g in rows if g % 3 == 1])}
        end = time.monotonic() + 60
        while any((st := _stats_of_live(units.addrs))[i] is None or
                  st[i]["under_replicated"] != want[i] for i in (0, 1)):
            assert time.monotonic() < end, f"under_replicated never said {want}: {st}"
            time.sleep(0.2)
        units.start(2)  # empty: it repairs, then every pass finds both copies
        end = time.monotonic() + 60
        while any(s["under_replicated"] != 0 or s["repair_state"] not in (2, 3)
                  for s in (c.stats()[i] for i in range(3))):
            assert time.monotonic() < end, f"still under-replicated: {c.stats()}"
            time.sleep(0.2)
        units.kill(0)  # the repaired copies serve rows 0, 3, ... now
        _check(c, rows, 1)
        c.close()
    finally:
        units.stop()


def test_a_repair_neither_resurrects_a_clear_nor_undoes_a_put(tmp_path):
    """A slow repair (64 KiB/s) while rows are cleared and put again: once it
    ends, the repaired unit holds the new values and not the cleared rows,
    whichever unit answers."""
    up = Up(tmp_path, 3, "--repair-rate", "64K")
    try:
        c = dataplane.Client(up.dir, timeout_s=20)
        rows = list(range(300))  # 4 KiB a row: a repair of unit 1 takes ~8 s
        c.put(rows, {"x": _rows_of(rows, 1)})
        up.kill(1)
        time.sleep(0.5)
        assert c.stats()[1]["repair_state"] == 1, "the repair should still run"
        mine = [g for g in rows if g % 3 in (0, 1)]
        cleared, rewritten = mine[-40:-20], mine[-20:]  # listed last: copied last
        c.clear(cleared)
        c.put(rewritten, {"x": _rows_of(rewritten, 2)})
        st = _repaired(c, 1)
        # the clears stay recorded for 120 s (passes run every 600 s by default)
        assert st["repair_state"] == 2 and st["repair_cleared"] == len(cleared), st
        # unit 1 holds its rows but the cleared ones: one key a row
        assert st["entries"] == len(mine) - len(cleared), st
        kept = [g for g in mine if g not in cleared and g not in rewritten]
        for i in (0, 2):  # the other copies go: unit 1's answer, or repairs from it
            up.kill(i)
            with pytest.raises(dataplane.NotFound):
                c.get(cleared, ["x"])
            _check(c, rewritten, 2)
            _check(c, kept, 1)
        c.close()
    finally:
        up.stop()


def test_spilled_rows_have_their_copies_too(tmp_path):
    """R = 2 with the SSD tier: rows that do not fit the slabs spill on each of
    their units, and a unit's death still loses none."""
    for i in range(3):
        (tmp_path / f"ssd{i}").mkdir()
    units = Units(tmp_path, 3, 2, slab="8M",
                  extra=lambda i: ["--ssd-dir", str(tmp_path / f"ssd{i}"), "--staging", "16M"])
    try:
        c = dataplane.Client(units.addrs, timeout_s=30)
        rows = list(range(24))  # 24 x 1 MiB, 16 MiB a unit: over its 8 MiB slab
        big = torch.arange(24 * 262144, dtype=torch.float32).reshape(24, 262144)
        for k in range(0, 24, 4):
            c.put(rows[k:k + 4], {"x": big[k:k + 4]})
        assert sum(st["spills"] for st in c.stats()) > 0
        assert torch.equal(c.get(rows, ["x"], stack=True)["x"], big)
        units.kill(1)
        assert torch.equal(c.get(rows, ["x"], stack=True)["x"], big)
        c.close()
    finally:
        units.stop()


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_the_transferqueue_backend_with_replicas(up3):
    """TQ's KV storage manager against R = 2, unchanged; then a unit dies and
    comes back empty between a put and its get: the hints that name it fall
    back to the next copy."""
    from dataplane.tq import DataplaneKVClient, flatten
    from test_tq import _batch, _keys, _same, _shapes_dtypes, _values
    from test_tq import test_driven_as_tq_kv_storage_manager as driven

    driven(str(up3.dir), "flatten")
    kv = DataplaneKVClient({"cluster": str(up3.dir), "client_name": "Dataplane",
                            "timeout_s": 20})
    g, b = list(range(5000, 5024)), _batch(7, 24)
    keys = _keys(g, b)
    meta = kv.put(keys, flatten(b))
    up3.kill(0)
    shapes, dtypes = _shapes_dtypes(b, len(g))
    got = kv.get(keys=keys, shapes=shapes, dtypes=dtypes,
                 custom_backend_meta=meta if meta else [None] * len(keys))
    want = _values(b, g)
    assert len(got) == len(want) and all(_same(x, y) for x, y in zip(want, got))


@pytest.mark.parametrize("n_units", [3, 4])
def test_units_killed_in_turn_and_repaired_lose_no_row(tmp_path, n_units):
    """Two writers put new rows (each once) and clear their oldest, and a
    reader reads back what is live, while units are SIGKILLed in turn, each
    started again by `up` and repaired before the next dies: 0 rows lost, 0
    wrong values, and after the last repair one more death still loses
    nothing. DP_SOAK_S=60 goes on killing in turn for that long (about 1 s
    between kills, then the repair) instead of once per unit."""
    soak = float(os.environ.get("DP_SOAK_S", "0"))
    up = Up(tmp_path, n_units, "--max-restarts", "100000")
    stop = threading.Event()
    live, lock, errors = {}, threading.Lock(), []  # live: rows put and not cleared, in order
    count = {"put": 0, "cleared": 0, "gets": 0}

    def writer(k):
        c = dataplane.Client(up.dir, timeout_s=30)
        g, mine = 100000 * (k + 1), collections.deque()
        try:
            while not stop.is_set():
                rows = list(range(g, g + 16))
                c.put(rows, {"x": _rows_of(rows, 1)})
                with lock:
                    live.update(dict.fromkeys(rows))
                    count["put"] += len(rows)
                mine.append(rows)
                if len(mine) > 64:  # 1,024 rows live per writer: the slabs hold any run
                    old = mine.popleft()
                    with lock:
                        for r in old:
                            del live[r]
                    c.clear(old)
                    count["cleared"] += len(old)
                g += 16
                time.sleep(0.03)
        except Exception as e:  # noqa: BLE001 - reported by the test
            errors.append(f"writer {k}: {e!r}")
        finally:
            c.close()

    def reader():
        c = dataplane.Client(up.dir, timeout_s=30)
        try:
            while not stop.is_set():
                with lock:
                    keys = list(live)
                rows = keys[-64:] + keys[len(keys) // 2:len(keys) // 2 + 16]
                if not rows:
                    continue
                try:
                    got = c.get(rows, ["x"], stack=True)["x"]
                except dataplane.NotFound:
                    with lock:
                        if any(r not in live for r in rows):
                            continue  # cleared meanwhile: it may be missing
                    raise
                count["gets"] += 1
                if not torch.equal(got, _rows_of(rows, 1)):
                    errors.append("reader: wrong bytes")
        except Exception as e:  # noqa: BLE001 - reported by the test
            errors.append(f"reader: {e!r}")
        finally:
            c.close()

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(2)]
    threads.append(threading.Thread(target=reader))
    for t in threads:
        t.start()
    kills, t0 = 0, time.monotonic()
    try:
        admin = dataplane.Client(up.dir, timeout_s=30)
        while kills < n_units or time.monotonic() - t0 < soak:
            time.sleep(1.0)
            up.kill(kills % n_units)
            st = _repaired(admin, kills % n_units)
            assert st["repair_state"] == 2, st
            kills += 1
    finally:
        stop.set()
        for t in threads:
            t.join(120)
    try:
        print(f"{kills} kills in {time.monotonic() - t0:.0f} s; {count}")
        assert not errors, errors
        assert len(live) > 200, len(live)
        up.kill(0, wait=False)  # one more death: every row still has a copy
        rows = list(live)
        for k in range(0, len(rows), 512):
            _check(admin, rows[k:k + 512], 1)
        admin.close()
    finally:
        up.stop()


def test_a_unit_killed_during_its_own_repair_repairs_again(tmp_path):
    up = Up(tmp_path, 3, "--repair-rate", "128K")
    try:
        c = dataplane.Client(up.dir, timeout_s=20)
        rows = list(range(300))  # unit 1's 200 rows of 4 KiB: ~6 s at 128 KiB/s
        c.put(rows, {"x": _rows_of(rows, 1)})
        up.kill(1)
        time.sleep(1.0)
        st = c.stats()[1]
        assert st["repair_state"] == 1 and 0 < st["repair_keys"] < 200, st
        up.kill(1)  # mid-repair: the next process repairs from the start
        st = _repaired(c, 1)
        assert st["repair_state"] == 2 and st["entries"] == 200, st
        up.kill(0, wait=False)
        up.kill(2, wait=False)
        _check(c, [g for g in rows if g % 3 in (0, 1)], 1)  # unit 1's: all there
        c.close()
    finally:
        up.stop()
