"""dataplane under the real TransferQueue (installed from the package index),
on Ray: tq.init with the "Dataplane" backend, TransferQueue's public KV API
with TensorDicts, Ray workers and actors that never import dataplane
attaching, checkpoints through tq.save_checkpoint / tq.load_checkpoint, a
unit restarted under a running job, and the bootstrap provider starting a
cluster of its own. Every value read is compared with what was put.

Skipped as a whole where TransferQueue or Ray is not installed (the
project's virtual environment has both: scripts/venv.sh).
"""

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

tq = pytest.importorskip("transfer_queue")
ray = pytest.importorskip("ray")
from omegaconf import OmegaConf  # noqa: E402
from tensordict import NonTensorStack, TensorDict  # noqa: E402

import dataplane  # noqa: E402
import dataplane.tq as dtq  # noqa: E402

from conftest import REPO, _cli, _die_with_parent, _tail  # noqa: E402

SITE = REPO.resolve() / "tests" / "tq_site"  # sitecustomize: the hook an install's .pth runs


def _env_for_workers():
    """PYTHONPATH as the workers Ray starts need it: this package and the
    registration hook (what an installed dataplane has in site-packages)."""
    parts = [str(SITE)] + [p for p in os.environ.get("PYTHONPATH", "").split(":") if p]
    for p in sys.path:  # the package this test imported (build tree or install)
        if (Path(p) / "dataplane" / "__init__.py").exists() and p not in parts:
            parts.append(p)
    return ":".join(parts)


def _start_up(tmp, *extra):
    d = tmp / "cluster"
    log = tmp / "up.log"
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    proc = subprocess.Popen([_cli(), "up", "--units", "2", "--slab", "128M", "--dir", str(d),
                             *extra], stdin=subprocess.DEVNULL, stdout=open(log, "wb"),
                            stderr=subprocess.STDOUT, start_new_session=True, env=env,
                            preexec_fn=_die_with_parent)
    end = time.monotonic() + 60
    while not (d / "cluster.json").exists():
        assert proc.poll() is None, _tail(log)
        assert time.monotonic() < end, _tail(log)
        time.sleep(0.05)
    return proc, d, log


def _stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """A cluster (`up --restart`), Ray, and TransferQueue on it; yields the
    cluster's directory."""
    if os.environ.get("LD_PRELOAD"):
        pytest.skip("Ray's processes do not run under the preloaded sanitizer runtime")
    tmp = tmp_path_factory.mktemp("tqstack")
    proc, d, log = _start_up(tmp, "--restart")
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "RAY_DEDUP_LOGS")}
    os.environ["PYTHONPATH"] = _env_for_workers()
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    try:
        ray.init(namespace="dataplane-tq-stack", num_cpus=4, include_dashboard=False,
                 log_to_driver=False)
        tq.init(OmegaConf.create({
            "controller": {"polling_mode": True},
            "backend": {"storage_backend": "Dataplane",
                        "Dataplane": {"cluster": str(d / "cluster.json"), "timeout_s": 20}},
        }))
        yield d
    finally:
        try:
            tq.close()
        finally:
            ray.shutdown()
            _stop(proc)
            for k, v in saved.items():  # as the fixture found them
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def _batch(n, seed):
    g = torch.Generator().manual_seed(seed)
    lens = [int(x) for x in torch.randint(1, 40, (n,), generator=g)]
    return TensorDict({
        "obs": torch.randn(n, 16, generator=g),
        "tokens": torch.nested.nested_tensor(
            [torch.randint(0, 50000, (k,), generator=g) for k in lens], layout=torch.jagged),
        "logp": torch.randn(n, 7, generator=g).to(torch.bfloat16),
        "reward": torch.randn(n, generator=g),
        "text": NonTensorStack(*[f"sample {seed}-{i}" for i in range(n)]),
        "info": NonTensorStack(*[{"i": i, "pair": (i, str(i))} for i in range(n)]),
    }, batch_size=n)


def _check(got, want, n):
    """got (TransferQueue's answer) holds want's values, row by row."""
    for f in ("obs", "logp", "reward", "tokens"):
        rows_got, rows_want = list(got[f]), list(want[f])
        assert len(rows_got) == n, f
        for a, b in zip(rows_got, rows_want):
            assert a.dtype == b.dtype, f
            assert torch.equal(a.reshape(-1), b.reshape(-1)), f
    assert list(got["text"]) == list(want["text"])
    # tuples come back as lists, as from TransferQueue's other KV backends
    assert list(got["info"]) == [{"i": d["i"], "pair": list(d["pair"])} for d in want["info"]]


def test_put_get_clear_through_tq(stack):
    n = 12
    keys = [f"s{i}" for i in range(n)]
    want = _batch(n, 1)
    tq.kv_batch_put(keys=keys, partition_id="p1", fields=want)
    got = tq.kv_batch_get(keys=keys, partition_id="p1")
    _check(got, want, n)
    part = tq.kv_batch_get(keys=keys[3:5], partition_id="p1", select_fields=["obs"])
    assert torch.equal(torch.stack(list(part["obs"])), want["obs"][3:5])
    # async API: the same values
    got = asyncio.run(tq.async_kv_batch_get(keys=keys, partition_id="p1"))
    _check(got, want, n)
    tq.kv_clear(keys=keys, partition_id="p1")
    assert not tq.kv_list(partition_id="p1").get("p1")
    c = dataplane.Client(stack)
    try:
        assert sum(u["entries"] for u in c.stats()) == 0  # the units hold nothing now
    finally:
        c.close()


def test_get_runs_off_the_event_loop(stack):
    """TransferQueue calls its storage client's get on its event-loop thread:
    the Dataplane manager hands it to an executor thread instead."""
    keys = ["e0", "e1"]
    tq.kv_batch_put(keys=keys, partition_id="p2", fields=_batch(2, 2))
    kv = tq.get_client().storage_manager.storage_client
    seen = []
    orig = kv.get

    def recording_get(*a, **k):
        seen.append(threading.current_thread().name)
        return orig(*a, **k)

    kv.get = recording_get
    loop_threads = set()

    async def get():
        loop_threads.add(threading.current_thread().name)
        return await tq.async_kv_batch_get(keys=keys, partition_id="p2")

    try:
        asyncio.run(get())
    finally:
        kv.get = orig
    assert seen and not (set(seen) & loop_threads), (seen, loop_threads)
    tq.kv_clear(keys=keys, partition_id="p2")


@ray.remote(num_cpus=1)
class Worker:
    """A Ray actor that never imports dataplane: TransferQueue rebuilds the
    "Dataplane" storage manager by name in it."""

    def __init__(self):
        import transfer_queue

        transfer_queue.init()

    def put(self, keys, seed, n):
        import torch as t
        import transfer_queue
        from tensordict import TensorDict as TD

        g = t.Generator().manual_seed(seed)
        transfer_queue.kv_batch_put(keys=keys, partition_id="p3",
                                    fields=TD({"x": t.randn(n, 32, generator=g)}, batch_size=n))
        return "dataplane" in sys.modules  # imported by the hook, not by this code

    def get(self, keys):
        import transfer_queue

        return [r.clone() for r in transfer_queue.kv_batch_get(keys=keys, partition_id="p3")["x"]]


def test_ray_actors_attach_without_importing_dataplane(stack):
    w = [Worker.remote() for _ in range(2)]
    keys = [[f"w{j}-{i}" for i in range(8)] for j in range(2)]
    assert all(ray.get([w[j].put.remote(keys[j], 10 + j, 8) for j in range(2)]))
    for j in range(2):  # each actor reads the other's rows, the driver both
        want = torch.randn(8, 32, generator=torch.Generator().manual_seed(10 + j))
        got = ray.get(w[1 - j].get.remote(keys[j]))
        assert torch.equal(torch.stack(got), want)
        mine = tq.kv_batch_get(keys=keys[j], partition_id="p3")["x"]
        assert torch.equal(torch.stack(list(mine)), want)
    tq.kv_clear(keys=keys[0] + keys[1], partition_id="p3")
    for a in w:
        ray.kill(a)


_ATTACH = r"""
import sys, torch, ray
import transfer_queue as tq
ray.init(address="auto", namespace="dataplane-tq-stack", log_to_driver=False)
tq.init()  # attaches: the controller hands this process the Dataplane config
got = torch.stack(list(tq.kv_batch_get(keys=["d0", "d1", "d2"], partition_id="p6")["x"]))
tq.kv_batch_put(keys=["q0", "q1"], partition_id="p6",
                fields=__import__("tensordict").TensorDict({"x": got[:2] * 2}, batch_size=2))
print(float(got.sum()), "dataplane" in sys.modules)
"""


def test_another_driver_process_attaches(stack):
    """A second driver process on the same Ray cluster (not a Ray worker)
    attaches to the running TransferQueue, reads what this one put and puts
    rows this one reads."""
    x = torch.randn(3, 8)
    tq.kv_batch_put(keys=["d0", "d1", "d2"], partition_id="p6",
                    fields=TensorDict({"x": x}, batch_size=3))
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    r = subprocess.run([sys.executable, "-c", _ATTACH], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    total, imported = r.stdout.split()[-2:]
    assert abs(float(total) - float(x.sum())) < 1e-4 and imported == "True"
    got = torch.stack(list(tq.kv_batch_get(keys=["q0", "q1"], partition_id="p6")["x"]))
    assert torch.equal(got, x[:2] * 2)
    tq.kv_clear(keys=["d0", "d1", "d2", "q0", "q1"], partition_id="p6")


def test_checkpoint_through_tq(stack, tmp_path):
    n = 10
    keys = [f"c{i}" for i in range(n)]
    want = _batch(n, 4)
    tq.kv_batch_put(keys=keys, partition_id="p4", fields=want)
    ck = tmp_path / "ckpt"
    tq.save_checkpoint(ck, metadata={"step": 7})
    assert (ck / "dataplane" / "MANIFEST.json").exists()
    assert json.loads((ck / "metadata.json").read_text())["storage_saved"] is True
    c = dataplane.Client(stack)
    try:
        c.clear(range(0, 1 << 16))  # the units forget everything
        with pytest.raises(Exception):
            tq.kv_batch_get(keys=keys, partition_id="p4")
        tq.load_checkpoint(ck)
        _check(tq.kv_batch_get(keys=keys, partition_id="p4"), want, n)
    finally:
        c.close()
    tq.kv_clear(keys=keys, partition_id="p4")
    # a directory without dataplane's part names what is missing
    bad = tmp_path / "other"
    bad.mkdir()
    (bad / "metadata.json").write_text(json.dumps({"storage_saved": True}))
    (bad / "controller_state.pkl").write_bytes((ck / "controller_state.pkl").read_bytes())
    with pytest.raises(FileNotFoundError, match="no dataplane checkpoint"):
        tq.load_checkpoint(bad)


def test_unit_restarted_under_a_running_job(stack):
    """A unit killed and restarted (`up --restart`): its rows fail clearly,
    never with other bytes; the other unit's rows read back; the job puts
    them again and goes on."""
    n = 16
    keys = [f"r{i}" for i in range(n)]
    want = torch.randn(n, 64)
    tq.kv_batch_put(keys=keys, partition_id="p5",
                    fields=TensorDict({"x": want}, batch_size=n))
    units = json.loads((stack / "cluster.json").read_text())["units"]
    os.kill(units[0]["pid"], signal.SIGKILL)
    end = time.monotonic() + 60
    while True:
        try:
            now = json.loads((stack / "cluster.json").read_text())["units"]
            if now[0]["pid"] != units[0]["pid"]:
                break
        except (OSError, ValueError):
            pass  # being replaced
        assert time.monotonic() < end, "unit 0 was not restarted"
        time.sleep(0.05)
    ok, lost, errors = [], [], []
    for i, k in enumerate(keys):
        try:
            got = tq.kv_batch_get(keys=[k], partition_id="p5")["x"]
        except (dataplane.Restarted, KeyError) as e:  # unit 0's: gone, said so
            # named by TQ's "<global_index>@<field>" key, or the restart
            assert "@x" in str(e) or "restart" in str(e).lower(), repr(e)
            errors.append(type(e).__name__)
            lost.append(i)
            continue
        assert torch.equal(list(got)[0].reshape(-1), want[i]), k
        ok.append(i)
    assert ok and lost, (ok, lost)
    tq.kv_batch_put(keys=[keys[i] for i in lost], partition_id="p5",
                    fields=TensorDict({"x": want[lost]}, batch_size=len(lost)))
    got = tq.kv_batch_get(keys=keys, partition_id="p5")["x"]
    assert torch.equal(torch.stack(list(got)), want)
    tq.kv_clear(keys=keys, partition_id="p5")


_BOOTSTRAP = r"""
import os, sys, json, torch, ray
from omegaconf import OmegaConf
from tensordict import TensorDict
import transfer_queue as tq
ray.init(namespace="dataplane-tq-bootstrap", num_cpus=2, include_dashboard=False,
         log_to_driver=False)
conf = tq.init(OmegaConf.create({"controller": {"polling_mode": True},
    "backend": {"storage_backend": "Dataplane", "Dataplane": {"slab": "64M", "units": 3}}}))
cluster = conf.backend.Dataplane.cluster
x = torch.arange(30.0).reshape(6, 5)
tq.kv_batch_put(keys=list("abcdef"), partition_id="p", fields=TensorDict({"x": x}, batch_size=6))
got = torch.stack(list(tq.kv_batch_get(keys=list("abcdef"), partition_id="p")["x"]))
units = json.load(open(cluster))["units"]
print(json.dumps({"ok": bool(torch.equal(got, x)), "cluster": cluster,
                  "pids": [u["pid"] for u in units]}), flush=True)
tq.close()
ray.shutdown()
"""


def test_bootstrap_starts_and_stops_a_local_cluster(tmp_path):
    """tq.init without backend.Dataplane.cluster starts a cluster (3 units
    here) that every process attaching finds in TransferQueue's config, and
    tq.close() stops it."""
    if os.environ.get("LD_PRELOAD"):
        pytest.skip("Ray's processes do not run under the preloaded sanitizer runtime")
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env["PYTHONPATH"] = _env_for_workers()
    env["DP_CLI"] = _cli()
    r = subprocess.run([sys.executable, "-c", _BOOTSTRAP], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["ok"] and len(out["pids"]) == 3
    assert not os.path.exists(out["cluster"])  # stopped, its directory gone
    for pid in out["pids"]:
        end = time.monotonic() + 30
        while os.path.exists(f"/proc/{pid}") and "Z" not in _state(pid):
            assert time.monotonic() < end, f"unit {pid} still runs"
            time.sleep(0.1)


def _state(pid):
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return "Z"


def test_registration_hook_in_a_fresh_interpreter():
    """The hook an install's dataplane-tq.pth imports: a process that imports
    only transfer_queue knows the "Dataplane" backend; DP_TQ_AUTOREGISTER=0
    turns it off."""
    if os.environ.get("LD_PRELOAD"):
        pytest.skip("a fresh interpreter cannot load the sanitized extension")
    code = ("import transfer_queue.storage.managers.base as b, sys; "
            "print('Dataplane' in b.StorageManagerFactory._registry, 'dataplane' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env["PYTHONPATH"] = _env_for_workers()
    on = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert on.stdout.split() == ["True", "True"], on.stderr
    env["DP_TQ_AUTOREGISTER"] = "0"
    off = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert off.stdout.split() == ["False", "False"], off.stderr
    # a process that never imports transfer_queue imports nothing of dataplane
    env.pop("DP_TQ_AUTOREGISTER")
    idle = subprocess.run([sys.executable, "-c", "import sys; print('dataplane' in sys.modules)"],
                          env=env, capture_output=True, text=True)
    assert idle.stdout.split() == ["False"], idle.stderr
    assert dtq.register() is True  # idempotent here
