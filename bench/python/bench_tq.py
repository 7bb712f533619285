#!/usr/bin/env python3
"""TransferQueue's throughput-test shapes through TransferQueue's backends,
dataplane's Client and Ray's object store, in one run.

The batch (--batch perftest) is TransferQueue's performance test's default:
1024 samples x 10 fields of 8192 float32 each (320 MiB), a dense (samples,
elems) tensor per field; --batch rl is the RL batch of bench/python/rl_batch.py
(512 samples, jagged token fields, 24.8 MiB). As in that test, a writer actor
puts it and a reader actor gets it back (both Ray actors on this machine, or,
with --ray-address and the resource options, on the nodes of a Ray cluster:
bench/peers/tq_hosts.py), each timing its own call. Methods:

  SimpleStorage  tq.kv_batch_put / tq.kv_batch_get with TransferQueue's own
                 storage (2 storage-unit actors)
  MooncakeStore  the same calls with TransferQueue's Mooncake Store backend
                 (TCP; a mooncake_master started here; each client mounts a
                 segment of --mooncake-segment bytes); needs the Mooncake
                 wheel (bench/peers/run.sh runs this with it)
  Dataplane      the same calls with backend "Dataplane" attached to a local
                 dataplane cluster started here (or --cluster)
  Client         dataplane.Client(cluster).put(rows, {field: tensor or list})
                 and .get(rows, fields) (stack=True, one tensor per field,
                 where every value of a field has one shape) on that cluster
  Ray            ray.put(batch) in the writer, ray.get(ref) in the reader:
                 Ray's object store with its default serialization
  Ray0copy       the same with RAY_ENABLE_ZERO_COPY_TORCH_TENSORS=1 in both
                 actors (Ray's documented zero-copy for read-only tensors)

Every round runs each method once, in an order that rotates from round to
round. A TransferQueue method starts TransferQueue afresh (tq.init in the
writer, which starts the controller and, for SimpleStorage, its units; the
reader attaches), does an untimed warm-up put/get (--warm samples), then the timed put
and get, clears, and closes it (untimed). Every get is compared with the
batch the writer put (untimed). GB/s = value bytes / seconds / 1e9; medians
over the rounds.

Build tree (from the repository root, after make build):
    .venv/bin/python bench/python/bench_tq.py [--reps 5] [--batch perftest|rl]
        [--samples 1024] [--fields 10] [--elems 8192]
        [--backends SimpleStorage,Dataplane,Client] [--cluster PATH] [--units 2]
        [--slab 1G] [--build build]

TransferQueue's own throughput test (scripts/performance_test/perftest.py
in its sources) runs unchanged with this backend too: give it
--backend Dataplane and a --backend_config YAML whose backend section is
"storage_backend: Dataplane" (with "Dataplane: {slab: 1G}", or a cluster),
with the backend registered in its Ray workers (an installed dataplane, or
PYTHONPATH=build/python:tests/tq_site from a build tree).

Timings are shown, never asserted.
"""

import argparse
import datetime
import os
import platform
import shlex
import shutil
import statistics
import sys
import tempfile
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
METHODS = ("SimpleStorage", "MooncakeStore", "Dataplane", "Client", "Ray", "Ray0copy")
TQ_METHODS = ("SimpleStorage", "MooncakeStore", "Dataplane")
DEFAULT_METHODS = ("SimpleStorage", "Dataplane", "Client")
PARTITION = "train_0"
CLIENT_ROW0 = 1 << 40  # the Client's rows lie far from TransferQueue's global indexes

warnings.filterwarnings("ignore", message=".*nested tensors is in prototype.*")


def make_batch(a):
    """{field: tensor of (samples, ...) or list of one tensor per sample}, the
    same for the same arguments (the reader makes it too, to compare what it
    gets). "perftest": fields x (samples, elems) float32. "rl": the RL batch of
    bench/python/rl_batch.py: input_ids (int64) and logprobs (float32) of
    128..8192 tokens per sample (jagged: a list), reward (float32) and done
    (bool) one scalar per sample."""
    import torch

    g = torch.Generator().manual_seed(a.seed)
    if a.batch == "perftest":
        return {f"field_{i}": torch.randn(a.samples, a.elems, generator=g, dtype=torch.float32)
                for i in range(a.fields)}
    lens = [int(x) for x in torch.randint(128, 8193, (a.samples,), generator=g)]
    return {"input_ids": [torch.randint(0, 150000, (k,), generator=g) for k in lens],
            "logprobs": [torch.randn(k, generator=g) for k in lens],
            "reward": torch.randn(a.samples, generator=g),
            "done": torch.rand(a.samples, generator=g) < 0.1}


def batch_bytes(batch):
    return sum(sum(t.numel() * t.element_size() for t in v) if isinstance(v, list)
               else v.numel() * v.element_size() for v in batch.values())


def head(batch, n):
    """The batch's first n samples."""
    return {f: v[:n] for f, v in batch.items()}


def as_tensordict(batch, n):
    """TransferQueue's form of the batch: jagged fields as nested tensors."""
    import torch
    from tensordict import TensorDict

    return TensorDict({f: torch.nested.as_nested_tensor(v, layout=torch.jagged)
                       if isinstance(v, list) else v for f, v in head(batch, n).items()},
                      batch_size=[n])


def rows_of(value):
    """A field as got back, as a list of per-sample tensors: a list, a stacked
    tensor, or the nested tensor KV backends return for a tensor field."""
    if isinstance(value, (list, tuple)):
        return list(value)
    if value.is_nested:
        return list(value.unbind())
    return list(value.unbind(0))


def differing(got, want, n):
    """The fields of got whose first n samples differ from want's."""
    bad = []
    for f, v in want.items():
        w = v[:n] if isinstance(v, list) else list(v[:n].unbind(0))
        if f not in got:
            bad.append(f)
            continue
        g = rows_of(got[f])
        if len(g) != len(w) or not all(_equal(x, y) for x, y in zip(g, w)):
            bad.append(f)
    return bad


class Peer:
    """A writer or reader: holds the batch, a dataplane Client, and its
    process's TransferQueue client while one is started."""

    def __init__(self, a):
        import torch

        torch.set_num_threads(2)
        try:
            import dataplane.tq  # noqa: F401  (registers "Dataplane"; an install does it by itself)
        except ImportError:
            pass
        import transfer_queue as tq

        self.tq, self.a = tq, a
        self.batch = make_batch(a)
        self.dense = not any(isinstance(v, list) for v in self.batch.values())
        self.keys = [f"test_key_{i}" for i in range(a.samples)]
        self.client = None
        self.ref = None

    def ready(self):
        return True

    def node(self):
        import ray

        return ray.util.get_node_ip_address()

    # -- TransferQueue --

    def tq_init(self, conf):
        """conf: start TransferQueue with it (the writer); None: attach."""
        from omegaconf import OmegaConf

        self.tq.init(OmegaConf.create(conf) if conf is not None else None)
        self.td = as_tensordict(self.batch, self.a.samples)
        self.td_warm = as_tensordict(self.batch, self.a.warm)

    def tq_put(self, warm=False):
        keys = [f"warm_{i}" for i in range(self.a.warm)] if warm else self.keys
        td = self.td_warm if warm else self.td
        t = time.perf_counter()
        self.tq.kv_batch_put(keys=keys, partition_id=PARTITION, fields=td)
        return time.perf_counter() - t

    def tq_get(self, warm=False):
        keys = [f"warm_{i}" for i in range(self.a.warm)] if warm else self.keys
        t = time.perf_counter()
        got = self.tq.kv_batch_get(keys=keys, partition_id=PARTITION)
        t = time.perf_counter() - t
        return t, differing(got, self.batch, len(keys))

    def tq_clear(self, warm=False):
        keys = [f"warm_{i}" for i in range(self.a.warm)] if warm else self.keys
        self.tq.kv_clear(keys=keys, partition_id=PARTITION)

    def tq_close(self):
        self.tq.close()
        self.td = self.td_warm = None

    # -- dataplane's Client --

    def dp_open(self, cluster):
        import dataplane

        self.client = dataplane.Client(cluster, timeout_s=300,
                                       staging_cache_bytes=self.a.staging_cache)

    def _rows(self, warm):
        n = self.a.warm if warm else self.a.samples
        return range(CLIENT_ROW0, CLIENT_ROW0 + n), n

    def dp_put(self, warm=False):
        rows, n = self._rows(warm)
        data = head(self.batch, n)
        t = time.perf_counter()
        self.client.put(rows, data)
        return time.perf_counter() - t

    def dp_get(self, warm=False):
        rows, n = self._rows(warm)
        t = time.perf_counter()
        # one tensor per field where every value has one shape (as TQ's test
        # reads it), else a list of per-sample tensors
        got = self.client.get(rows, list(self.batch), stack=self.dense)
        t = time.perf_counter() - t
        return t, differing(got, self.batch, n)

    def dp_clear(self, warm=False):
        self.client.clear(self._rows(warm)[0])

    def dp_close(self):
        if self.client is not None:
            self.client.close()

    # -- Ray's object store --

    def ray_put(self, warm=False):
        """ray.put of the batch as a user would hand it over (the dict of
        tensors or lists of tensors); the reference goes to the reader."""
        import ray

        n = self.a.warm if warm else self.a.samples
        data = head(self.batch, n)
        t = time.perf_counter()
        self.ref = ray.put(data)
        t = time.perf_counter() - t
        return t, [self.ref]  # in a list: Ray hands a bare reference over resolved

    def ray_get(self, refs, warm=False):
        import ray

        t = time.perf_counter()
        got = ray.get(refs[0])
        t = time.perf_counter() - t
        return t, differing(got, self.batch, self.a.warm if warm else self.a.samples)

    def ray_clear(self):
        self.ref = None


def _equal(got, want):
    import torch

    # a scalar sample may come back as a 0-d or a 1-element tensor
    return (got.dtype == want.dtype and got.numel() == want.numel()
            and torch.equal(got.reshape(-1), want.reshape(-1)))


STAGING_CACHE = [0]  # --staging-cache, for tq_conf
MOONCAKE = {}  # the master for MooncakeStore (its addresses) and placement, for tq_conf


def tq_conf(method, cluster, staging_cache=0):
    backend = {"storage_backend": method}
    if method == "Dataplane":
        backend["Dataplane"] = {"cluster": cluster, "timeout_s": 300,
                                "staging_cache_bytes": staging_cache}
    elif method == "MooncakeStore":
        # TransferQueue's defaults for Mooncake (TCP, hard-pinned values,
        # no SSD offload), less memory: each client mounts a segment of
        # global_segment_size (default 4 GiB) that holds values, and the
        # master is started here for every round (auto_init would kill any
        # other mooncake_master on the machine at every tq.init), or given
        # (--mooncake) with holders of its own.
        backend["MooncakeStore"] = {
            "auto_init": False, "metadata_server": MOONCAKE["metadata"],
            "master_server_address": MOONCAKE["master"],
            "local_hostname": MOONCAKE.get("hostname", "127.0.0.1"),
            "protocol": "tcp", "device_name": "", "global_segment_size": MOONCAKE["segment"],
            "local_buffer_size": 1 << 30}
    else:
        backend["SimpleStorage"] = {"num_data_storage_units": 2}
        if MOONCAKE.get("storage_resource"):  # its units on the nodes that have it
            backend["SimpleStorage"]["required_node_resource"] = MOONCAKE["storage_resource"]
    return {"controller": {"polling_mode": True}, "backend": backend}


def free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_mooncake_master(segment):
    """mooncake_master with its HTTP metadata server, with the flags
    TransferQueue's own start (auto_init) gives it; returns the process."""
    import socket
    import subprocess

    exe = shutil.which("mooncake_master", path=os.path.dirname(sys.executable)) or \
        shutil.which("mooncake_master")
    if exe is None:
        sys.exit("bench_tq: MooncakeStore needs mooncake_master (the peers' environment "
                 "has it: bench/peers/run.sh)")
    rpc, http = free_port(), free_port()
    logname = os.path.join(tempfile.gettempdir(), f"bench_tq-mooncake-{os.getpid()}.log")
    with open(logname, "wb") as log:
        p = subprocess.Popen(
            [exe, "-client_ttl=30", "-default_kv_lease_ttl=999999",
             "-default_kv_soft_pin_ttl=999999", "--allow_evict_soft_pinned_objects=false",
             "--rpc_address=127.0.0.1", f"--rpc_port={rpc}", "--enable_http_metadata_server=true",
             "--http_metadata_server_host=127.0.0.1", f"--http_metadata_server_port={http}",
             f"--metrics_port={free_port()}", "--eviction_high_watermark_ratio=1.0",
             "--eviction_ratio=0.0"], stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    end = time.monotonic() + 30
    while True:
        if p.poll() is not None:
            sys.exit(f"bench_tq: mooncake_master exited ({p.returncode}); log {logname}")
        try:
            socket.create_connection(("127.0.0.1", rpc), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > end:
                p.kill()
                sys.exit("bench_tq: mooncake_master did not open its port in 30 s")
            time.sleep(0.1)
    MOONCAKE.update(metadata=f"127.0.0.1:{http}", master=f"127.0.0.1:{rpc}", segment=segment)
    return p


def wait_controller_gone(ray, timeout_s=60):
    """TransferQueue's controller is a named actor; a new tq.init needs the
    old one gone."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            ray.get_actor("TransferQueueController", namespace="transfer_queue")
        except ValueError:
            return
        time.sleep(0.1)
    raise RuntimeError("TransferQueue's controller did not go away after tq.close()")


def run_method(ray, method, writer, reader, cluster):
    """One timed put and get; returns (put s, get s, [fields that differ])."""
    if method.startswith("Ray"):
        _, refs = ray.get(writer.ray_put.remote(warm=True))
        ray.get(reader.ray_get.remote(refs, warm=True))
        ray.get(writer.ray_clear.remote())
        tp, refs = ray.get(writer.ray_put.remote())
        tg, bad = ray.get(reader.ray_get.remote(refs))
        del refs
        ray.get(writer.ray_clear.remote())
        return tp, tg, bad
    if method == "Client":
        ray.get(writer.dp_put.remote(warm=True))
        ray.get(reader.dp_get.remote(warm=True))
        ray.get(writer.dp_clear.remote(warm=True))
        tp = ray.get(writer.dp_put.remote())
        tg, bad = ray.get(reader.dp_get.remote())
        ray.get(writer.dp_clear.remote())
        return tp, tg, bad
    ray.get(writer.tq_init.remote(tq_conf(method, cluster, STAGING_CACHE[0])))
    try:
        ray.get(reader.tq_init.remote(None))
        ray.get(writer.tq_put.remote(warm=True))
        ray.get(reader.tq_get.remote(warm=True))
        ray.get(writer.tq_clear.remote(warm=True))
        tp = ray.get(writer.tq_put.remote())
        tg, bad = ray.get(reader.tq_get.remote())
        ray.get(writer.tq_clear.remote())
    finally:
        ray.get(reader.tq_close.remote())
        ray.get(writer.tq_close.remote())
        wait_controller_gone(ray)
    return tp, tg, bad


def versions():
    from importlib import metadata

    out = [f"python {platform.python_version()}"]
    for name, dist in (("torch", "torch"), ("TransferQueue", "transferqueue"), ("ray", "ray"),
                       ("tensordict", "tensordict")):
        try:
            out.append(f"{name} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            out.append(f"{name} (not installed)")
    return ", ".join(out)


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser(
        description="TransferQueue's throughput-test batch through TransferQueue with "
                    "SimpleStorage and with Dataplane, and through dataplane's Client; put "
                    "and get GB/s medians and their ratios.")
    ap.add_argument("--reps", type=int, default=5, help="rounds (default 5)")
    ap.add_argument("--batch", choices=("perftest", "rl"), default="perftest",
                    help="TransferQueue's perftest shape (default) or the RL batch")
    ap.add_argument("--samples", type=int, help="samples per batch (perftest 1024, rl 512)")
    ap.add_argument("--fields", type=int, default=10, help="fields per sample (10)")
    ap.add_argument("--elems", type=int, default=8192, help="float32 per field (8192)")
    ap.add_argument("--backends", default=",".join(DEFAULT_METHODS),
                    help=f"methods to run, comma-separated, among {', '.join(METHODS)} "
                         f"(default {','.join(DEFAULT_METHODS)})")
    ap.add_argument("--mooncake-segment", type=int, default=1 << 30, metavar="BYTES",
                    help="MooncakeStore: the segment each client mounts (1 GiB; "
                         "TransferQueue's default is 4 GiB)")
    ap.add_argument("--cluster", help="a running dataplane cluster (default: start one)")
    ap.add_argument("--units", type=int, default=2, help="units of the cluster started here (2)")
    ap.add_argument("--slab", default="1G", help="slab per unit of the cluster started here "
                    "(1G; the batch must fit)")
    ap.add_argument("--build", default=os.path.join(REPO, "build"),
                    help="build tree with python/ and dataplane (default: this repository's)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--warm", type=int, default=8, metavar="SAMPLES",
                    help="samples of the untimed warm-up put/get after each start (8: the "
                         "timed put is a process's first big one; the batch's samples: "
                         "steady state, staging memory already mapped)")
    ap.add_argument("--staging-cache", type=int, default=0, metavar="BYTES",
                    help="the clients' staging_cache_bytes (0: the library's default, "
                         "256 MiB; a batch larger than it maps fresh staging memory "
                         "every put)")
    ap.add_argument("--ray-address", metavar="HOST:PORT",
                    help="join this running Ray cluster instead of starting one here "
                         "(bench/peers/tq_hosts.py: a node per host)")
    ap.add_argument("--writer-resource", metavar="NAME",
                    help="place the writer on the Ray node with this custom resource")
    ap.add_argument("--reader-resource", metavar="NAME",
                    help="place the reader on the Ray node with this custom resource")
    ap.add_argument("--storage-resource", metavar="NAME",
                    help="SimpleStorage: its units on the Ray nodes with this custom "
                         "resource (TransferQueue's required_node_resource; by default "
                         "they spread over every node)")
    ap.add_argument("--mooncake", metavar="METADATA,MASTER",
                    help="MooncakeStore: use this running master (its HTTP metadata "
                         "server and RPC addresses) and the memory of the holders mounted "
                         "with it (with --mooncake-segment 0 the clients mount none)")
    a = ap.parse_args()
    STAGING_CACHE[0] = a.staging_cache
    MOONCAKE["storage_resource"] = a.storage_resource
    if a.mooncake:
        meta, _, master = a.mooncake.partition(",")
        if not meta or not master:
            ap.error("--mooncake: METADATA,MASTER (host:port each)")
        # each client's own address: its Ray node's (TransferQueue's default)
        MOONCAKE.update(metadata=meta, master=master, segment=a.mooncake_segment,
                        hostname="")
    if a.samples is None:
        a.samples = 1024 if a.batch == "perftest" else 512
    methods = [m.strip() for m in a.backends.split(",") if m.strip()]
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        ap.error(f"--backends: choose among {', '.join(METHODS)} (got {a.backends!r})")
    if min(a.reps, a.samples, a.fields, a.elems) < 1:
        ap.error("--reps, --samples, --fields and --elems must be >= 1")

    # a build tree's package, for this process and the Ray workers it starts
    pkg = os.path.join(a.build, "python")
    if os.path.isdir(os.path.join(pkg, "dataplane")):
        sys.path.insert(0, pkg)
        os.environ["PYTHONPATH"] = os.pathsep.join(
            [pkg] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    os.environ.setdefault("TQ_LOGGING_LEVEL", "ERROR")  # TQ warns on every get on < 8 cores
    sys.path.insert(0, HERE)
    import ray

    t_start = time.monotonic()
    nbytes = batch_bytes(make_batch(a))
    print(f"bench_tq: {' '.join(shlex.quote(x) for x in [sys.executable] + sys.argv)}")
    print(f"bench_tq: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M:%S} UTC, "
          f"{platform.node()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}; "
          f"{versions()}")
    shape = (f"{a.samples} samples x {a.fields} fields x {a.elems} float32" if a.batch ==
             "perftest" else f"the RL batch, {a.samples} samples (jagged)")
    print(f"bench_tq: {shape} = "
          f"{nbytes / 2**20:.1f} MiB per batch; methods {', '.join(methods)}; "
          f"{a.reps} rounds", flush=True)

    cm = None
    cluster = a.cluster
    if cluster is None and ({"Dataplane", "Client"} & set(methods)):
        from local_cluster import local_cluster

        cli = os.path.join(a.build, "dataplane")
        if not os.access(cli, os.X_OK):
            cli = shutil.which("dataplane")
        if not cli:
            sys.exit("bench_tq: no dataplane tool (build first, or put it on PATH, or --cluster)")
        cm = local_cluster(cli, slab=a.slab, units=a.units, prog="bench_tq")
        cluster = cm.__enter__()
    if a.ray_address:
        ray.init(address=a.ray_address, logging_level="ERROR")
    else:  # logical CPUs: TQ's controller and each SimpleStorage unit ask for one
        # address="local": a Ray of its own, never one a file in /tmp/ray
        # points at (a cluster started elsewhere, or one that died)
        ray.init(address="local", num_cpus=8, include_dashboard=False,
                 logging_level="ERROR")
    res = {m: ([], []) for m in methods}
    failures = []
    try:
        peer = ray.remote(num_cpus=0)(Peer)
        zero_copy = {"runtime_env": {"env_vars": {
            "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": "1", "PYTHONWARNINGS": "ignore"}}}
        for r in range(a.reps):
            order = methods[r % len(methods):] + methods[:r % len(methods)]
            line = []
            for m in order:
                # a fresh writer and reader for every measurement, as
                # TransferQueue's own test runs in fresh actors: a process
                # that has started and closed TransferQueue before carries
                # state that slowed later SimpleStorage gets here
                opts = [dict(zero_copy if m == "Ray0copy" else {}) for _ in range(2)]
                for o, res_name in zip(opts, (a.writer_resource, a.reader_resource)):
                    if res_name:
                        o["resources"] = {res_name: 1}
                writer, reader = (peer.options(**o).remote(a) for o in opts)
                if r == 0 and m == order[0] and a.ray_address:
                    w_ip, r_ip = ray.get([writer.node.remote(), reader.node.remote()])
                    print(f"bench_tq: the writer runs on {w_ip}, the reader on {r_ip}",
                          flush=True)
                # a fresh master for every MooncakeStore round, as TransferQueue's
                # auto_init starts one at every tq.init: the last round's clients
                # are gone, but the old master would place values in their
                # segments for client_ttl (30 s) and fail them (-800)
                master = (start_mooncake_master(a.mooncake_segment)
                          if m == "MooncakeStore" and not a.mooncake else None)
                try:
                    if m == "Client":
                        ray.get([writer.dp_open.remote(cluster), reader.dp_open.remote(cluster)])
                    else:
                        ray.get([writer.ready.remote(), reader.ready.remote()])
                    tp, tg, bad = run_method(ray, m, writer, reader, cluster)
                    ray.get([writer.dp_close.remote(), reader.dp_close.remote()])
                finally:
                    ray.kill(writer)
                    ray.kill(reader)
                    if master is not None:
                        master.terminate()
                        master.wait()
                if bad:
                    failures.append(f"round {r + 1} {m}: fields {', '.join(bad)} differ")
                res[m][0].append(nbytes / tp / 1e9)
                res[m][1].append(nbytes / tg / 1e9)
                line.append(f"{m} put {res[m][0][-1]:.2f} get {res[m][1][-1]:.2f}")
            print(f"bench_tq: round {r + 1}: " + " | ".join(line) + " GB/s", flush=True)
    finally:
        ray.shutdown()
        if cm is not None:
            cm.__exit__(None, None, None)

    print(f"bench_tq: {time.monotonic() - t_start:.0f} s; load {os.getloadavg()[0]:.2f} at the "
          f"end (on a shared machine other work may have run)")
    print(f"{'method':<14} {'put GB/s':>9} {'(min-max)':>13} {'get GB/s':>9} {'(min-max)':>13}")
    for m in methods:
        p, g = res[m]
        print(f"{m:<14} {med(p):9.2f} {f'({min(p):.2f}-{max(p):.2f})':>13} {med(g):9.2f} "
              f"{f'({min(g):.2f}-{max(g):.2f})':>13}")

    def ratio(x, y, goal, label, rl_only=False):
        if x in res and y in res:
            pr = med(res[x][0]) / med(res[y][0])
            gr = med(res[x][1]) / med(res[y][1])
            where = " on the RL batch" if rl_only else ""
            print(f"{label:<30} put {pr:5.2f}x  get {gr:5.2f}x  (goal{where} >= {goal}x)")

    ratio("Dataplane", "SimpleStorage", 3, "Dataplane / SimpleStorage")
    ratio("Dataplane", "MooncakeStore", 1, "Dataplane / MooncakeStore")
    ratio("Dataplane", "Client", 0.8, "TQ-through-Dataplane / Client")
    ratio("Client", "SimpleStorage", 5, "Client / SimpleStorage", True)
    ratio("Client", "Ray", 3, "Client / Ray object store", True)
    ratio("Client", "Ray0copy", 3, "Client / Ray zero-copy", True)
    for f in failures:
        print(f"bench_tq: MISMATCH {f}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
