"""Runs TransferQueue's own e2e suites, unmodified, on the Dataplane backend.

run.sh copies this file to the root of a scratch tree that holds
TransferQueue's tests/ (as rootdir conftest, above their files, which stay as
they are). With TQ_TEST_BACKEND=Dataplane it:

- starts one cluster for the session (`dataplane up --units 2 --slab 512M`)
  and stops it at the end. The suites then exercise the bootstrap provider's
  attach path (backend.Dataplane.cluster set), which is how a real job runs;
  the path that starts a local cluster is covered by
  tests/python/test_tq_stack.py. At the end it checks that the cluster
  stored values (else the suites did not use the backend).
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
# do not apply to a KV backend, whatever it is. (The other checkpoint tests
# run: save and load go through the Dataplane storage manager.)
_NOT_FOR_KV = {
    "test_checkpoint_e2e.py::TestCheckpointRoundtrip::test_tensor_fields":
        "asserts SimpleStorage's checkpoint layout (<dir>/simple_storage/"
        "storage_unit_info.json); a KV backend saves its own (<dir>/dataplane)",
    "test_checkpoint_e2e.py::TestIncludeStorageFalse::test_storage_saved_is_true":
        "asserts that SimpleStorage forces include_storage=True; TransferQueue "
        "honours include_storage=False for a KV backend (storage_saved is False)",
    "test_checkpoint_e2e.py::TestCheckpointErrors::"
    "test_load_raises_on_storage_unit_count_mismatch":
        "tampers with SimpleStorage's <dir>/simple_storage/storage_unit_info.json",
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
    """The dataplane tool: $DP_CLI (run.sh sets it), $DP_BUILD/dataplane, or
    `dataplane` on PATH."""
    if os.environ.get("DP_CLI"):
        return os.environ["DP_CLI"]
    if os.environ.get("DP_BUILD"):
        return os.path.join(os.environ["DP_BUILD"], "dataplane")
    return shutil.which("dataplane") or "dataplane"


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


_stats = {}  # what the session's cluster reported at its end


def _stored_count(cli):
    """How many values the session's cluster stored (its units' commits and
    inline puts, `dataplane stats`), or None when it cannot say."""
    try:
        out = subprocess.run([cli, "stats", "--raw", "--cluster", _CLUSTER_FILE],
                             capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    total = 0
    for line in out.splitlines():
        cols = line.split()
        if cols and cols[0] in ("commits", "puts_inline"):
            total += int(cols[-1])  # the row's last column is the total
    _stats["stored"] = total
    return total


def pytest_terminal_summary(terminalreporter):
    if "stored" in _stats:
        terminalreporter.write_line(
            f"dataplane: the session cluster stored {_stats['stored']} values")


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
                # ours even if a later version has one: it attaches to the
                # session's cluster, which the check at its end counts on
                configs[BACKEND] = copy.deepcopy(dataplane_config())
            elif hasattr(mod, "_TQ_CONFIG"):  # one fixed config (test_checkpoint_e2e)
                mod._TQ_CONFIG = OmegaConf.create(dataplane_config())
        # the id relative to the e2e directory: "<file>::<class>::<test>[param]"
        name = item.nodeid.rsplit("/", 1)[-1]
        base = name.split("[", 1)[0]
        reason = _NOT_FOR_KV.get(name) or _NOT_FOR_KV.get(base)
        if reason:
            test = base.split("::", 1)[1]
            item.add_marker(pytest.mark.skip(reason=f"{test}: not for a KV backend: {reason}"))


@pytest.fixture(scope="session", autouse=True)
def dataplane_cluster(request):
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
        # The suites pass as well on a backend they silently did not use:
        # check that this cluster stored what they put.
        # (A run narrowed with -k or -m may hold no test that puts: then the
        # summary only says so.)
        stored = _stored_count(cli)
        if stored == 0 and not (request.config.option.keyword
                                or request.config.option.markexpr):
            pytest.fail("the session's dataplane cluster stored nothing: the suites did "
                        "not use the Dataplane backend", pytrace=False)
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
