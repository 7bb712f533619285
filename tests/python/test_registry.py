"""The Python package through the etcd registry: Client(cluster="etcd://...")
against real units registered in a real etcd (skipped where etcd is not
installed); tensors and arrays round-trip byte for byte, and a registry that
cannot be reached or holds no units is a clear error."""
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request

import numpy as np
import pytest
import torch

import dataplane

# Units are separate programs: they do not get the sanitizer runtime this
# interpreter may have preloaded (scripts/pytest-asan.sh).
UNIT_ENV = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}

ETCD = "/usr/bin/etcd"


def _port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


@pytest.fixture
def etcd():
    if not os.access(ETCD, os.X_OK):
        pytest.skip("etcd is not installed (scripts/deps.sh installs etcd-server)")
    d = tempfile.mkdtemp(prefix="dp-etcd-py-")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    # Ports picked here may be taken by another process before etcd binds
    # them: etcd then exits, and is started again on two other ports.
    for attempt in range(3):
        cp, pp = _port(), _port()
        proc = subprocess.Popen(
            [ETCD, "--name=t", f"--data-dir={d}/data{attempt}",
             f"--listen-client-urls=http://127.0.0.1:{cp}",
             f"--advertise-client-urls=http://127.0.0.1:{cp}",
             f"--listen-peer-urls=http://127.0.0.1:{pp}",
             f"--initial-advertise-peer-urls=http://127.0.0.1:{pp}",
             f"--initial-cluster=t=http://127.0.0.1:{pp}",
             "--logger=zap", f"--log-outputs={d}/etcd{attempt}.log"],
            stdout=subprocess.DEVNULL, env=UNIT_ENV)
        # Ready when its gateway answers a range (a leader is elected), not
        # when its port takes connections.
        deadline = time.monotonic() + 20
        while proc.poll() is None:
            try:
                req = urllib.request.Request(f"http://127.0.0.1:{cp}/v3/kv/range",
                                             data=b'{"key":"eA=="}', method="POST")
                opener.open(req, timeout=1).read()
                break
            except OSError:
                assert time.monotonic() < deadline, "etcd did not start"
                time.sleep(0.1)
        if proc.poll() is None:
            break
        assert attempt < 2, "etcd exited at start three times: " + open(
            f"{d}/etcd{attempt}.log").read()[-2000:]
    yield f"127.0.0.1:{cp}"
    proc.kill()
    proc.wait()
    shutil.rmtree(d, ignore_errors=True)


def _units(cli, url, n, replicas=1):
    procs = []
    for k in range(n):
        p = subprocess.Popen([cli, "unit", "--slab", "32M", "--registry", url,
                              "--registry-ttl", "2", "--unit-id", str(k), "--units", str(n),
                              "--replicas", str(replicas)],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                             env=UNIT_ENV)
        line = p.stdout.readline()
        assert line.startswith("tcp://"), f"unit {k} did not start: {line!r}"
        procs.append(p)
    return procs


def test_client_through_the_registry(etcd):
    cli = os.environ.get("DP_CLI") or os.path.join(os.environ.get("DP_BUILD", "build"), "dataplane")
    url = f"etcd://{etcd}/py"
    procs = _units(cli, url, 2)
    try:
        ids = [torch.randint(0, 50000, (int(n),), dtype=torch.int64) for n in (5, 300, 1, 77)]
        lp = np.random.default_rng(3).standard_normal((4, 16)).astype(np.float32)
        with dataplane.Client(cluster=url, timeout_s=10) as c:
            assert len(c.stats()) == 2
            c.put(range(4), {"ids": ids, "lp": lp})
            got = c.get(range(4), ["ids", "lp"])
        for a, b in zip(ids, got["ids"]):
            assert torch.equal(a, b)
        for i in range(4):
            assert np.array_equal(lp[i], got["lp"][i])
    finally:
        for p in procs:
            p.terminate()
            p.wait()


def test_registry_errors(etcd):
    with pytest.raises(dataplane.NotFound) as e:
        dataplane.Client(cluster=f"etcd://{etcd}/empty", connect_timeout_s=0.5)
    assert "no unit is registered" in str(e.value)
    with pytest.raises(dataplane.Timeout) as e:
        dataplane.Client(cluster="etcd://127.0.0.1:1/x", connect_timeout_s=0.5)
    assert "no etcd endpoint answered" in str(e.value)
    with pytest.raises(dataplane.Error) as e:
        dataplane.Client(cluster="etcd://127.0.0.1:2379/bad/name")
    assert "cluster name" in str(e.value)


def test_registry_records_carry_replicas(etcd):
    """Units of a registry cluster with --replicas 2: the records say so, a
    client takes it, a row survives its first unit's death, and a unit
    started with another --replicas is refused while the others live."""
    cli = os.environ.get("DP_CLI") or os.path.join(os.environ.get("DP_BUILD", "build"), "dataplane")
    url = f"etcd://{etcd}/reps"
    procs = _units(cli, url, 3, replicas=2)
    try:
        x = torch.arange(6 * 256, dtype=torch.float32).reshape(6, 256)
        with dataplane.Client(cluster=url, timeout_s=10) as c:
            assert c.replicas == 2
            c.put(range(6), {"x": x})
            procs[0].kill()
            procs[0].wait()
            got = c.get(range(6), ["x"], stack=True)["x"]
            assert torch.equal(got, x)
        r = subprocess.run([cli, "unit", "--slab", "32M", "--registry", url, "--unit-id", "0",
                            "--units", "3", "--registry-wait-s", "5"], capture_output=True,
                           text=True, env=UNIT_ENV, timeout=60)
        assert r.returncode != 0
        assert "--replicas 1" in r.stderr and "give it --units 3 --replicas 2" in r.stderr
    finally:
        for p in procs:
            p.terminate()
            p.wait()
