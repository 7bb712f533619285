"""Runs TransferQueue's own e2e suites, unmodified, on the Dataplane backend.

run.sh copies this file to the root of a scratch tree that holds
TransferQueue's tests/ (as rootdir conftest, above their files, which stay as
they are). With TQ_TEST_BACKEND=Dataplane it:

- starts one cluster for the session (`dataplane up --units 2 --slab 512M`)
  and stops it at the end. The suites then exercise the bootstrap provider's
  attach path (backend.Dataplane.cluster set), which is how a real job runs;
  the path that starts a local cluster is covered by tests/python/test_tq.py.
- adds a "Dataplane" entry to the BACKEND_CONFIGS dict of every collected
  module that has one; the modules pick their config by TQ_TEST_BACKEND.
- gives a module without BACKEND_CONFIGS but with a module-level _TQ_CONFIG
  (test_checkpoint_e2e.py, which hard-codes SimpleStorage) the Dataplane
  config instead, and skips, naming why, its tests that check SimpleStorage's
  own checkpoint files (_NOT_FOR_KV below).

With any other TQ_TEST_BACKEND it does nothing.
"""

import copy
import ctypes
import os
import shutil
import signal
import subprocess
import tempfile
import time

import pytest

BACKEND = "Dataplane"
ACTIVE = os.environ.get("TQ_TEST_BACKEND") == BACKEND

# Where the session's cluster writes cluster.json; made before collection so
# the configs injected at collection can name it.
_DIR = tempfile.mkdtemp(prefix="dp-tq-upstream-") if ACTIVE else None
_CLUSTER_FILE = os.path.join(_DIR, "cluster", "cluster.json") if ACTIVE else None

# Tests that check what only SimpleStorage does, by "<file>::<test id>": they
# do not apply to a KV backend, whatever it is.
_NOT_FOR_KV = {
}


def dataplane_config():
    """The TransferQueue config the suites get for "Dataplane": attach to
    the session's cluster."""
    return {
        "controller": {"polling_mode": True},
        "backend": {
            "storage_backend": BACKEND,
            BACKEND: {"cluster": _CLUSTER_FILE},
        },
    }


def _cli():
    p = os.environ.get("DP_CLI")
    if not p:
        build = os.environ.get("DP_BUILD", "/work/main/build")
        p = os.path.join(build, "dataplane")
    return p


def _die_with_parent():
    """In the child before exec: SIGTERM when pytest dies (PR_SET_PDEATHSIG),
    so that no cluster outlives a killed run."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)


def _tail(path, n=4000):
    try:
        with open(path, "rb") as f:
            return f.read()[-n:].decode(errors="replace")
    except OSError:
        return "(no log)"


def pytest_report_header(config):
    if ACTIVE:
        return f"dataplane: backend {BACKEND}, session cluster {_CLUSTER_FILE} ({_cli()} up)"
    return None


def pytest_collection_modifyitems(session, config, items):
    if not ACTIVE:
        return
    from omegaconf import OmegaConf

    seen = set()
    for item in items:
        mod = getattr(item, "module", None)
        if mod is not None and id(mod) not in seen:
            seen.add(id(mod))
            configs = getattr(mod, "BACKEND_CONFIGS", None)
            if isinstance(configs, dict):
                configs.setdefault(BACKEND, copy.deepcopy(dataplane_config()))
            elif hasattr(mod, "_TQ_CONFIG"):  # one fixed config (test_checkpoint_e2e)
                mod._TQ_CONFIG = OmegaConf.create(dataplane_config())
        # the id relative to the e2e directory: "<file>::<class>::<test>[param]"
        name = item.nodeid.rsplit("/", 1)[-1]
        base = name.split("[", 1)[0]
        reason = _NOT_FOR_KV.get(name) or _NOT_FOR_KV.get(base)
        if reason:
            item.add_marker(pytest.mark.skip(reason=f"not for a KV backend: {reason}"))


@pytest.fixture(scope="session", autouse=True)
def dataplane_cluster():
    """The session's cluster (path of its cluster.json); started before the
    first test, stopped after the last."""
    if not ACTIVE:
        yield None
        return
    cli = _cli()
    if not os.access(cli, os.X_OK):
        pytest.fail(f"no dataplane tool at {cli} (set DP_CLI or DP_BUILD)", pytrace=False)
    log_path = os.path.join(_DIR, "up.log")
    # the tool is not the Python extension: never hand it a preloaded sanitizer
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [cli, "up", "--units", "2", "--slab", "512M", "--dir",
             os.path.dirname(_CLUSTER_FILE)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, env=env, preexec_fn=_die_with_parent)
    try:
        # up writes cluster.json once every unit answers; it exits if one
        # fails to start (its own --start-timeout-s bounds that), so wait for
        # either rather than for a time of ours
        while not os.path.exists(_CLUSTER_FILE):
            if proc.poll() is not None:
                pytest.fail(f"dataplane up exited with {proc.returncode}:\n{_tail(log_path)}",
                            pytrace=False)
            time.sleep(0.05)
        yield _CLUSTER_FILE
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # up stops its units and exits
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if proc.returncode not in (0, -signal.SIGTERM):
            print(f"\ndataplane up exited with {proc.returncode}:\n{_tail(log_path)}")
        shutil.rmtree(_DIR, ignore_errors=True)


def pytest_unconfigure(config):
    # the directory is made at import; remove it also when no test ran
    if _DIR:
        shutil.rmtree(_DIR, ignore_errors=True)
