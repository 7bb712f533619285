"""Fixtures of the Python package's tests: a real cluster of two units.

The cluster is started once per session with the dataplane binary
(`$DP_CLI up --units 2 --slab 256M --dir <tmp>`); each test gets its own
Client (closed after it) and its own rows (fresh_rows), cleared after it, so
tests do not see each other's values.
"""

import ctypes
import itertools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(os.environ.get("DP_SOURCE") or Path(__file__).resolve().parents[2])


def _die_with_parent():
    """In a child before exec: SIGTERM it when pytest dies (killed by a
    timeout, say), so that no cluster outlives the run (PR_SET_PDEATHSIG)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)


def _cli():
    p = os.environ.get("DP_CLI")
    if p:
        return p
    build = os.environ.get("DP_BUILD")
    if build and (Path(build) / "dataplane").exists():
        return str(Path(build) / "dataplane")
    return str(REPO / "build" / "dataplane")


# Make `import dataplane` work when pytest runs without PYTHONPATH set.
if not os.environ.get("PYTHONPATH"):
    _pkg = Path(os.environ.get("DP_BUILD") or REPO / "build") / "python"
    if _pkg.is_dir() and str(_pkg) not in sys.path:
        sys.path.insert(0, str(_pkg))
        os.environ["PYTHONPATH"] = str(_pkg)  # for the tests' subprocesses

import dataplane  # noqa: E402


def _tail(path, n=4000):
    try:
        return Path(path).read_text(errors="replace")[-n:]
    except OSError:
        return "(no log)"


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    """The directory of a running 2-unit cluster (holds cluster.json)."""
    cli = _cli()
    if not os.access(cli, os.X_OK):
        pytest.fail(f"dataplane binary not found at {cli} (set DP_CLI or DP_BUILD)")
    base = tmp_path_factory.mktemp("dp")
    d = base / "cluster"
    log_path = base / "up.log"
    log = open(log_path, "wb")
    # The dataplane binary is not the sanitized extension: it must not get the
    # sanitizer runtime this interpreter may have preloaded (pytest-asan.sh).
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    proc = subprocess.Popen([cli, "up", "--units", "2", "--slab", "256M", "--dir", str(d)],
                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True, env=env, preexec_fn=_die_with_parent)
    try:
        deadline = time.monotonic() + 60
        while not (d / "cluster.json").exists():
            if proc.poll() is not None:
                pytest.fail(f"dataplane up exited with {proc.returncode}:\n{_tail(log_path)}")
            if time.monotonic() > deadline:
                pytest.fail(f"no cluster.json after 60 s:\n{_tail(log_path)}")
            time.sleep(0.05)
        yield d
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()


@pytest.fixture(scope="session")
def cluster_dir(cluster):
    """The cluster's directory as a str (the name test_tq.py uses)."""
    return str(cluster)


@pytest.fixture(scope="session")
def admin(cluster):
    """A session-wide client the fixtures use to clear rows after a test."""
    c = dataplane.Client(cluster, timeout_s=20)
    yield c
    c.close()


@pytest.fixture
def client(cluster):
    c = dataplane.Client(cluster, timeout_s=20)
    yield c
    c.close()


_BLOCK = 10000
_next_row = itertools.count(_BLOCK, _BLOCK)


@pytest.fixture
def fresh_rows(admin):
    """fresh_rows(n) -> range of n (<= 10000) rows no other test uses; they are
    cleared after the test."""
    taken = []

    def take(n):
        assert 0 <= n <= _BLOCK
        start = next(_next_row)
        r = range(start, start + n)
        taken.append(r)
        return r

    yield take
    for r in taken:
        if len(r):
            admin.clear(r)
