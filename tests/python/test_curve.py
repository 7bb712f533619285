"""CURVE on the control plane: `dataplane keygen`, units that serve only
allowed client keys (`--curve-secret`, `--curve-allow`), clients taking their
key from DP_CURVE_SECRET and the units' public keys from the cluster file.
An allowed key works byte for byte; a stranger's key and no key are refused
at once with a message saying so and read nothing; the unit counts the
refusals; SIGHUP re-reads the allow list."""
import json
import os
import shutil
import signal
import subprocess
import time

import numpy as np
import pytest

import dataplane

UNIT_ENV = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "DP_CURVE_SECRET")}


def _cli():
    return os.environ.get("DP_CLI") or os.path.join(os.environ.get("DP_BUILD", "build"),
                                                    "dataplane")


def _run(*args, env=None):
    return subprocess.run([_cli(), *args], capture_output=True, text=True, timeout=60,
                          env={**UNIT_ENV, **(env or {})})


@pytest.fixture
def keys(tmp_path):
    for name in ("unit", "client", "stranger"):
        r = _run("keygen", "--out", str(tmp_path / name))
        assert r.returncode == 0, r.stderr
        assert len(r.stdout.strip()) == 40
    assert oct((tmp_path / "client.key").stat().st_mode & 0o777) == "0o600"
    r = _run("keygen", "--out", str(tmp_path / "client"))
    assert r.returncode == 1 and "exists" in r.stderr
    allow = tmp_path / "allow"
    allow.mkdir()
    shutil.copy(tmp_path / "client.pub", allow / "client.pub")
    return tmp_path


class _Env:
    """DP_CURVE_SECRET set for the library of this process, then restored."""

    def __init__(self, value):
        self.value = value

    def __enter__(self):
        self.old = os.environ.get("DP_CURVE_SECRET")
        if self.value is None:
            os.environ.pop("DP_CURVE_SECRET", None)
        else:
            os.environ["DP_CURVE_SECRET"] = str(self.value)

    def __exit__(self, *exc):
        if self.old is None:
            os.environ.pop("DP_CURVE_SECRET", None)
        else:
            os.environ["DP_CURVE_SECRET"] = self.old


def _open(cluster, secret, **kw):
    with _Env(secret):
        return dataplane.Client(cluster=str(cluster), timeout_s=10, connect_timeout_s=10, **kw)


def test_up_with_curve(keys):
    d = keys / "cluster"
    log = open(keys / "up.log", "wb")
    up = subprocess.Popen([_cli(), "up", "--units", "2", "--slab", "64M", "--dir", str(d),
                           "--curve-secret", str(keys / "unit.key"),
                           "--curve-allow", str(keys / "allow")],
                          stdout=log, stderr=subprocess.STDOUT, env=UNIT_ENV)
    try:
        deadline = time.monotonic() + 60
        while not (d / "cluster.json").exists():
            assert up.poll() is None, open(keys / "up.log").read()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        cl = json.loads((d / "cluster.json").read_text())
        pub = (keys / "unit.pub").read_text().strip()
        assert [u["pubkey"] for u in cl["units"]] == [pub, pub]

        vals = [np.arange(100 * (i + 1), dtype=np.int64) for i in range(6)]
        with _open(d, keys / "client.key") as c:
            c.put(range(6), {"x": vals})
            got = c.get(range(6), ["x"])
            assert all(np.array_equal(a, b) for a, b in zip(vals, got["x"]))
        # The key as an argument instead of the environment.
        with _open(d, None, curve_secret=keys / "client.key") as c:
            got = c.get(range(6), ["x"])
            assert all(np.array_equal(a, b) for a, b in zip(vals, got["x"]))

        # A stranger's key and no key: refused at once, saying so; nothing read.
        for secret, words in ((keys / "stranger.key", "refused this client's key"),
                              (None, "requires CURVE")):
            t0 = time.monotonic()
            with pytest.raises(dataplane.PolicyError) as e:
                _open(d, secret)
            assert words in str(e.value), str(e.value)
            assert time.monotonic() - t0 < 5, "refused only after a timeout"
            r = _run("get", "0@x", "--cluster", str(d),
                     env={"DP_CURVE_SECRET": str(secret)} if secret else None)
            assert r.returncode == 1 and r.stdout == "", (r.stdout, r.stderr)
            assert words in r.stderr, r.stderr

        # The units counted the stranger's attempts (and told who they were).
        r = _run("stats", "--cluster", str(d), "--raw",
                 env={"DP_CURVE_SECRET": str(keys / "client.key")})
        assert r.returncode == 0, r.stderr
        line = [x for x in r.stdout.splitlines() if x.startswith("auth_refused")][0]
        assert int(line.split()[-1]) >= 2, line
        assert "refused a client" in open(keys / "up.log").read()

        # A secret key readable by others is refused, saying how to fix it.
        os.chmod(keys / "client.key", 0o644)
        with pytest.raises(dataplane.PolicyError) as e:
            _open(d, keys / "client.key")
        assert "chmod 600" in str(e.value)
        os.chmod(keys / "client.key", 0o600)
    finally:
        up.send_signal(signal.SIGTERM)
        up.wait(30)
        log.close()


def test_sighup_rereads_the_allow_list(keys):
    err = open(keys / "unit.err", "wb")
    u = subprocess.Popen([_cli(), "unit", "--slab", "32M",
                          "--curve-secret", str(keys / "unit.key"),
                          "--curve-allow", str(keys / "allow")],
                         stdout=subprocess.PIPE, stderr=err, text=True, env=UNIT_ENV)
    try:
        addr = u.stdout.readline().strip()
        assert addr.startswith("tcp://")
        pub = (keys / "unit.pub").read_text().strip()
        cf = keys / "cluster.json"
        cf.write_text(json.dumps({"version": 1, "units": [
            {"id": 0, "zmq": addr, "agent": "x", "pubkey": pub}]}))
        with pytest.raises(dataplane.PolicyError):
            _open(cf, keys / "stranger.key")
        shutil.copy(keys / "stranger.pub", keys / "allow" / "stranger.pub")
        u.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while "2 client keys allowed" not in open(keys / "unit.err").read():
            assert time.monotonic() < deadline, open(keys / "unit.err").read()
            time.sleep(0.05)
        with _open(cf, keys / "stranger.key") as c:
            c.put([0], {"v": [b"now allowed"]})
            assert c.get([0], ["v"])["v"] == [b"now allowed"]
        # Taken away again: refused again.
        os.unlink(keys / "allow" / "stranger.pub")
        u.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while "1 client key allowed" not in open(keys / "unit.err").read():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        with pytest.raises(dataplane.PolicyError):
            _open(cf, keys / "stranger.key")
    finally:
        u.terminate()
        assert u.wait(15) == 0
        err.close()


def test_plain_unit_on_a_network_address_warns(tmp_path):
    r = subprocess.Popen([_cli(), "unit", "--slab", "16M", "--bind", "0.0.0.0"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=UNIT_ENV)
    try:
        assert r.stdout.readline().startswith("tcp://")
        time.sleep(0.3)
    finally:
        r.terminate()
        _, err = r.communicate(timeout=15)
    assert "without CURVE" in err, err
