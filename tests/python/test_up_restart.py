"""`dataplane up --restart`: a unit that dies is started again on its port.

A long-lived client keeps working across the restart: the operation that
meets the new process fails for that unit's rows with dataplane.Restarted
(never with wrong bytes), the next one works, rows of the other unit are
untouched, the cluster file names the new pid and incarnation, and a fresh
client works. With --max-restarts 0 the first death stops the cluster;
--max-restarts counts within --restart-window.
"""

import json
import os
import signal
import subprocess
import time

import pytest
import torch

import dataplane

from conftest import _cli, _tail


def _env():
    # Not the sanitizer runtime this interpreter may have preloaded (pytest-asan.sh).
    return {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}


def _start(tmp_path, *extra):
    d = tmp_path / "c"
    log = tmp_path / "up.log"
    proc = subprocess.Popen([_cli(), "up", "--units", "2", "--slab", "64M", "--dir", str(d),
                             *extra], stdin=subprocess.DEVNULL, stdout=open(log, "wb"),
                            stderr=subprocess.STDOUT, start_new_session=True, env=_env())
    end = time.monotonic() + 60
    while not (d / "cluster.json").exists():
        assert proc.poll() is None, _tail(log)
        assert time.monotonic() < end, _tail(log)
        time.sleep(0.05)
    return proc, d, log


def _units(d):
    with open(d / "cluster.json") as f:
        return json.load(f)["units"]


def _stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _kill_and_wait_restart(proc, d, log, unit):
    """SIGKILL unit and wait until cluster.json names its next process; the
    units it names then."""
    pid = _units(d)[unit]["pid"]
    os.kill(pid, signal.SIGKILL)
    end = time.monotonic() + 60
    while True:
        try:
            now = _units(d)
            if now[unit]["pid"] != pid:
                return now
        except (OSError, ValueError):
            pass  # the file is being replaced
        assert proc.poll() is None, _tail(log)
        assert time.monotonic() < end, _tail(log)
        time.sleep(0.05)


def test_restart_keeps_the_cluster_and_the_client(tmp_path):
    proc, d, log = _start(tmp_path, "--restart")
    try:
        before = _units(d)
        c = dataplane.Client(d, timeout_s=10)
        rows = list(range(16))  # even rows on unit 0, odd on unit 1
        x = torch.randn(16, 4096)
        c.put(rows, {"x": x})
        now = _kill_and_wait_restart(proc, d, log, 0)
        assert now[0]["zmq"] == before[0]["zmq"]
        assert now[0]["incarnation"] != before[0]["incarnation"]
        assert now[1] == before[1]
        # the old client: unit 0's part fails once, clearly; unit 1's rows are intact
        odd = rows[1::2]
        got = c.get(odd, ["x"])["x"]
        assert all(torch.equal(g, x[r]) for g, r in zip(got, odd))
        with pytest.raises((dataplane.Restarted, dataplane.NotFound)) as e:
            c.get(rows[0::2], ["x"])
        if isinstance(e.value, dataplane.Restarted):
            with pytest.raises(dataplane.NotFound):  # what the dead process held is gone
                c.get(rows[0::2], ["x"])
        # and then works: put and get every row again
        y = torch.randn(16, 4096)
        for _ in range(2):
            try:
                c.put(rows, {"x": y})
                break
            except dataplane.Restarted:
                continue
        got = c.get(rows, ["x"])["x"]
        assert all(torch.equal(g, y[r]) for g, r in zip(got, rows))
        assert c.counters()["restarts_seen"] >= 1
        with dataplane.Client(d, timeout_s=10) as fresh:
            got = fresh.get(rows, ["x"])["x"]
            assert all(torch.equal(g, y[r]) for g, r in zip(got, rows))
        c.close()
        assert "restarting unit 0" in _tail(log)
    finally:
        _stop(proc)


def test_max_restarts_stops_the_cluster(tmp_path):
    proc, d, log = _start(tmp_path, "--restart", "--max-restarts", "0")
    try:
        os.kill(_units(d)[1]["pid"], signal.SIGKILL)
        assert proc.wait(30) == 1
        assert not (d / "cluster.json").exists()
        assert "--max-restarts 0" in _tail(log)
    finally:
        _stop(proc)


def test_restart_window_forgets_old_restarts(tmp_path):
    """--max-restarts counts within --restart-window: a unit that died once a
    window ago is started again (no timing is asserted: the sleep outlasts
    the window, however long restarts take)."""
    proc, d, log = _start(tmp_path, "--restart", "--max-restarts", "1",
                          "--restart-window", "2")
    try:
        _kill_and_wait_restart(proc, d, log, 0)  # 1 of 1 in this window
        time.sleep(2.5)  # the window ends
        _kill_and_wait_restart(proc, d, log, 0)  # 1 of 1 in a new window
        assert proc.poll() is None, _tail(log)
    finally:
        _stop(proc)


@pytest.mark.parametrize("window, says", [
    ("600", ["died 2 times in", "--restart-window 600 s"]),
    ("never", ["died 2 times (--max-restarts 1)"]),  # a unit's whole life
])
def test_restarts_past_the_limit_within_the_window_stop_up(tmp_path, window, says):
    proc, d, log = _start(tmp_path, "--restart", "--max-restarts", "1",
                          "--restart-window", window)
    try:
        _kill_and_wait_restart(proc, d, log, 1)
        os.kill(_units(d)[1]["pid"], signal.SIGKILL)  # 2 of 1
        assert proc.wait(30) == 1
        assert not (d / "cluster.json").exists()
        out = _tail(log)
        assert all(w in out for w in says), out
    finally:
        _stop(proc)


def test_restart_window_refuses_a_bad_value(tmp_path):
    r = subprocess.run([_cli(), "up", "--restart", "--restart-window", "0",
                        "--dir", str(tmp_path / "c")], capture_output=True, text=True,
                       timeout=30, env=_env())
    assert r.returncode == 2 and "--restart-window" in r.stderr, (r.returncode, r.stderr)


def test_client_opens_while_a_unit_does_not_answer(tmp_path):
    """A unit that does not answer when the client opens (stopped here) does
    not fail the open: that unit's rows fail, naming them, the other unit's
    land; once it answers, the same client reaches it (no Restarted)."""
    proc, d, log = _start(tmp_path)
    try:
        units = _units(d)
        os.kill(units[1]["pid"], signal.SIGSTOP)
        try:
            c = dataplane.Client(d, timeout_s=3, connect_timeout_s=1)
            assert c.unit_path(1) == "not connected (down)"
            rows = list(range(8))  # even rows on unit 0, odd on unit 1
            x = torch.randn(8, 1024)
            with pytest.raises(dataplane.Timeout) as e:
                c.put(rows, {"x": x})
            assert sorted(e.value.landed) == rows[0::2]
            assert sorted(e.value.rows) == rows[1::2]
            got = c.get(rows[0::2], ["x"])["x"]
            assert all(torch.equal(g, x[r]) for g, r in zip(got, rows[0::2]))
        finally:
            os.kill(units[1]["pid"], signal.SIGCONT)
        c.put(rows, {"x": x})
        got = c.get(rows, ["x"])["x"]
        assert all(torch.equal(g, x[r]) for g, r in zip(got, rows))
        assert c.counters()["restarts_seen"] == 0
        assert c.unit_path(1) != "not connected (down)"
        c.close()
    finally:
        _stop(proc)
