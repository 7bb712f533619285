"""stats() and dataplane.stack()."""

import numbers

import numpy as np
import pytest
import torch

import dataplane


def test_stats_one_dict_per_unit(client, fresh_rows):
    rows = fresh_rows(10)
    before = client.stats()
    client.put(rows, {"s": torch.ones(10, 1000)})
    st = client.stats()
    assert isinstance(st, list) and len(st) == client.n_units == 2
    for u, d in enumerate(st):
        assert isinstance(d, dict) and d
        assert d["unit_id"] == u and d["n_units"] == 2
        assert d["slab_bytes"] == 256 << 20
        for k, v in d.items():
            assert isinstance(k, str)
            assert isinstance(v, numbers.Real) and not isinstance(v, bool), (k, v)
            assert v >= 0, (k, v)
    # the put shows in the counters: commits grew, the rows hold bytes
    assert sum(d["commits"] for d in st) > sum(d["commits"] for d in before)
    assert sum(d["allocated_bytes"] for d in st) >= 10 * 4000


def test_stack_torch():
    vals = [torch.full((2, 3), float(i)) for i in range(4)]
    s = dataplane.stack(vals)
    assert isinstance(s, torch.Tensor) and s.shape == (4, 2, 3)
    assert torch.equal(s, torch.stack(vals))


def test_stack_numpy():
    vals = [np.arange(5, dtype=np.int16) + i for i in range(3)]
    s = dataplane.stack(vals)
    assert isinstance(s, np.ndarray) and s.dtype == np.int16 and s.shape == (3, 5)
    assert np.array_equal(s, np.stack(vals))


def test_stack_got_values(client, fresh_rows):
    rows = fresh_rows(5)
    t = torch.randn(5, 7)
    client.put(rows, {"v": t})
    assert torch.equal(dataplane.stack(client.get(rows, ["v"])["v"]), t)


def test_stack_mismatch():
    with pytest.raises(ValueError, match="value 1"):
        dataplane.stack([torch.zeros(2, 3), torch.zeros(3, 2)])
    with pytest.raises(ValueError):
        dataplane.stack([torch.zeros(3), torch.zeros(3, dtype=torch.int32)])
    with pytest.raises(ValueError):
        dataplane.stack([np.zeros(3), np.zeros(4)])
    with pytest.raises(ValueError):
        dataplane.stack([])


def test_python_m_dataplane_runs_the_tool():
    """`python -m dataplane` (what a wheel's console script also does) runs the
    tool in its place: same output and exit status. In a build tree it finds
    the tool as the package's units do ($DP_CLI, else beside the package)."""
    import os
    import subprocess
    import sys

    if os.environ.get("LD_PRELOAD"):
        # the sanitizer run preloads ASan into the interpreter (the package's
        # extension is instrumented); the tool exec'd in its place is not and
        # does not start under it (conftest strips LD_PRELOAD for units)
        pytest.skip("LD_PRELOAD is set (the sanitizer run)")
    r = subprocess.run([sys.executable, "-m", "dataplane", "--version"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"dataplane {dataplane.__version__}"
    r = subprocess.run([sys.executable, "-m", "dataplane", "no-such-command"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "no-such-command" in r.stderr


def test_get_include_and_get_lib_only_where_carried():
    """A wheel carries the headers and libdataplane inside the package; a build
    tree or `make install` does not (pkg-config finds those)."""
    import os

    pkg = os.path.dirname(dataplane.__file__)
    for f, sub in ((dataplane.get_include, "include"), (dataplane.get_lib, "lib")):
        d = f()
        if os.path.isdir(os.path.join(pkg, sub)):
            assert d == os.path.join(pkg, sub) and os.listdir(d)
        else:
            assert d is None


def test_counters_count_resent_requests(client):
    """counters()["resent"]: control requests sent again after a dropped
    connection (none on a quiet loopback cluster)."""
    k = client.counters()
    assert isinstance(k["resent"], int) and k["resent"] == 0


def _prlimit(soft, hard):
    import shutil

    p = shutil.which("prlimit")
    if p is None:
        pytest.skip("no prlimit (util-linux)")
    return [p, f"--nofile={soft}:{hard}"]


def test_a_unit_raises_its_open_file_limit(tmp_path):
    """A unit holds a descriptor per connected client: it raises its soft
    open-file limit to the hard one, and warns when that is low."""
    import json
    import os
    import subprocess
    import time

    from conftest import _cli

    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    for soft, hard, warn in ((512, 8192, False), (256, 1024, True)):
        d = tmp_path / f"c{hard}"
        log = tmp_path / f"up{hard}.log"
        p = subprocess.Popen(_prlimit(soft, hard) + [_cli(), "up", "--units", "1", "--slab",
                                                     "16M", "--dir", str(d)],
                             stdout=open(log, "wb"), stderr=subprocess.STDOUT, env=env)
        try:
            for _ in range(300):
                if (d / "cluster.json").exists():
                    break
                assert p.poll() is None, log.read_text()
                time.sleep(0.1)
            pid = json.load(open(d / "cluster.json"))["units"][0]["pid"]
            line = [x for x in open(f"/proc/{pid}/limits") if x.startswith("Max open files")][0]
            assert line.split()[3:5] == [str(hard), str(hard)], line
        finally:
            p.terminate()
            p.wait(timeout=30)
        assert ("open-file limit is 1024" in log.read_text()) == warn, log.read_text()


def test_a_client_raises_its_open_file_limit(cluster):
    """A client needs about four descriptors per unit: opening raises a soft
    open-file limit below what the cluster needs (never past the hard one), and
    says so when the hard limit is too low."""
    import resource
    import subprocess
    import sys

    code = ("import resource, dataplane, sys\n"
            "c = dataplane.Client(sys.argv[1]); c.close()\n"
            "print(resource.getrlimit(resource.RLIMIT_NOFILE)[0])\n")
    for soft, hard, want in ((64, 4096, 272), (64, 100, 100)):
        def limit(soft=soft, hard=hard):
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

        r = subprocess.run([sys.executable, "-c", code, str(cluster)], preexec_fn=limit,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert int(r.stdout.split()[-1]) == want, (r.stdout, r.stderr)
        assert ("the hard limit is 100" in r.stderr) == (hard == 100), r.stderr


def test_a_unit_gives_back_what_its_clients_took(tmp_path):
    """64 clients connect to a unit and put; half of them are killed
    (SIGKILL), the other half get their rows back byte for byte and quit:
    within a minute the unit's private memory is back within half of what
    they made it take (its ticker gives freed heap back every 10 s)."""
    import json
    import os
    import subprocess
    import time

    from conftest import _cli

    build = os.environ.get("DP_BUILD")
    lc = os.path.join(build, "tests", "dp_longclient") if build else None
    if lc is None or not os.access(lc, os.X_OK):
        pytest.skip("no dp_longclient (set DP_BUILD to a build directory)")
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    d = tmp_path / "c"
    up = subprocess.Popen([_cli(), "up", "--units", "1", "--slab", "64M", "--dir", str(d)],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    ps = []
    try:
        for _ in range(300):
            if (d / "cluster.json").exists():
                break
            time.sleep(0.1)
        pid = json.load(open(d / "cluster.json"))["units"][0]["pid"]

        def anon():
            return [int(x.split()[1]) for x in open(f"/proc/{pid}/status")
                    if x.startswith("RssAnon:")][0]

        time.sleep(1)
        before = anon()
        ps = [subprocess.Popen([lc, "--cluster", str(d), "--timeout", "60"], env=env,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
              for _ in range(64)]
        assert all(p.stdout.readline().startswith("ready ") for p in ps)
        for i, p in enumerate(ps):
            p.stdin.write(f"put {2 * i} 2 65536 1\n")
            p.stdin.flush()
        assert all(p.stdout.readline().startswith("ok ") for p in ps)
        took = anon() - before
        assert took > 0
        for p in ps[::2]:
            p.kill()
        for i, p in enumerate(ps):
            if i % 2:
                p.stdin.write(f"get {2 * i} 2 65536 1\n")
                p.stdin.flush()
        for i, p in enumerate(ps):
            if i % 2:
                line = p.stdout.readline()
                assert line.startswith("ok "), line
        for p in ps[1::2]:
            p.stdin.write("quit\n")
            p.stdin.flush()
        for p in ps:
            p.wait(timeout=60)
        deadline = time.time() + 60
        while anon() - before > took / 2 and time.time() < deadline:
            time.sleep(1)
        assert anon() - before <= took / 2, (before, took, anon())
    finally:
        for p in ps:
            if p.poll() is None:
                p.kill()
        up.terminate()
        up.wait(timeout=30)


def test_a_unit_serves_through_a_storm_of_silent_sockets(tmp_path):
    """2,000 TCP connections to a unit's control port, half silent, half
    sending garbage: the unit keeps serving a real client (values come back
    byte for byte), and once they close, its memory returns within half of
    what they made it take."""
    import json
    import os
    import resource
    import socket
    import subprocess
    import time

    from conftest import _cli

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 2000 + 512
    if hard < want:
        pytest.skip(f"the hard open-file limit {hard} is below {want}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, want), hard))
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    d = tmp_path / "c"
    up = subprocess.Popen([_cli(), "up", "--units", "1", "--slab", "64M", "--dir", str(d)],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    socks = []
    try:
        for _ in range(300):
            if (d / "cluster.json").exists():
                break
            time.sleep(0.1)
        unit = json.load(open(d / "cluster.json"))["units"][0]
        pid, port = unit["pid"], int(unit["zmq"].rsplit(":", 1)[1])

        def anon():
            return [int(x.split()[1]) for x in open(f"/proc/{pid}/status")
                    if x.startswith("RssAnon:")][0]

        time.sleep(1)
        before = anon()
        for i in range(2000):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            if i % 2:
                s.sendall(b"GET / HTTP/1.0\r\n\r\n" + os.urandom(64))
            socks.append(s)
        vals = [os.urandom(3000 + r) for r in range(8)]
        with dataplane.Client(str(d), timeout_s=30) as c:
            c.put(list(range(8)), {"v": vals})
            assert [bytes(x) for x in c.get(list(range(8)), ["v"])["v"]] == vals
        assert up.poll() is None
        took = max(anon() - before, 1)
        for s in socks:
            s.close()
        socks = []
        deadline = time.time() + 60
        while anon() - before > took / 2 and time.time() < deadline:
            time.sleep(1)
        assert anon() - before <= took / 2, (before, took, anon())
        with dataplane.Client(str(d), timeout_s=30) as c:  # still serving
            assert [bytes(x) for x in c.get(list(range(8)), ["v"])["v"]] == vals
    finally:
        for s in socks:
            s.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        up.terminate()
        up.wait(timeout=30)
