"""dataplane against Mooncake Store on one host, the same batches in one run.

Started here: Mooncake's master (its own HTTP metadata server on) and one
store process holding DRAM (`mooncake_client`, the wheel's standalone
holder), clients over TCP, as Mooncake's store documents for hosts without
RDMA; and a 2-unit dataplane cluster (`dataplane up`). Each side uses its
best call for a batch: Mooncake's zero-copy `batch_put_from` /
`batch_get_into` on registered buffers (`register_buffer`), dataplane's
`Client.put` / `Client.get(out=)` on registered arrays. Every value read
back is checked against what was put (CRC32 of each value), outside the
timed calls. Run by bench/peers/run.sh, which makes the peers' virtual
environment; prints a table and the ratios, asserts no timing.

    bench/peers/run.sh [BUILD_DIR]              (all of bench/peers)
    PYTHONPATH=build/python bench/peers/.venv/bin/python \\
        bench/peers/mooncake_store.py --cli build/dataplane [--reps N]
"""

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import zlib

import numpy as np

MiB = 1 << 20


def die(msg, code=1):
    print(f"mooncake_store: {msg}", file=sys.stderr)
    sys.exit(code)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def tail(path, n=3000):
    try:
        with open(path, "rb") as f:
            return f.read()[-n:].decode(errors="replace")
    except OSError:
        return ""


class Procs:
    """Everything started here; stop() ends it in any case."""

    def __init__(self, tmp):
        self.tmp, self.procs = tmp, []

    def start(self, name, args, env=None):
        log = open(os.path.join(self.tmp, f"{name}.log"), "wb")
        p = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env)
        self.procs.append((name, p))
        return p

    def check(self):
        for name, p in self.procs:
            if p.poll() is not None:
                die(f"{name} exited with status {p.returncode}:\n"
                    f"{tail(os.path.join(self.tmp, name + '.log'))}")

    def stop(self):
        for _, p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
        for _, p in reversed(self.procs):
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def mooncake_bin(name):
    p = shutil.which(name, path=os.path.dirname(sys.executable))
    if p is None:
        die(f"no {name} beside {sys.executable}: run bench/peers/run.sh (it installs "
            f"mooncake-transfer-engine-non-cuda into bench/peers/.venv)")
    return p


def start_mooncake(procs, segment_bytes):
    rpc, http, metrics, holder = free_port(), free_port(), free_port(), free_port()
    procs.start("mooncake_master", [
        mooncake_bin("mooncake_master"), "--rpc_address=127.0.0.1", f"--rpc_port={rpc}",
        "--enable_http_metadata_server=true", "--http_metadata_server_host=127.0.0.1",
        f"--http_metadata_server_port={http}", f"--metrics_port={metrics}",
        "-default_kv_lease_ttl=999999", "-client_ttl=30", "--rpc_thread_num=4"])
    meta = f"http://127.0.0.1:{http}/metadata"
    master = f"127.0.0.1:{rpc}"
    end = time.monotonic() + 30
    while True:  # the master answers on its RPC port
        procs.check()
        try:
            socket.create_connection(("127.0.0.1", rpc), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > end:
                die("mooncake_master did not open its port in 30 s")
            time.sleep(0.1)
    procs.start("mooncake_holder", [
        mooncake_bin("mooncake_client"), "-host=127.0.0.1",
        f"-global_segment_size={segment_bytes}", f"-master_server_address={master}",
        f"-metadata_server={meta}", "-protocol=tcp", f"-port={holder}"])
    time.sleep(3)  # it mounts its segment with the master
    procs.check()
    return meta, master


def start_dataplane(procs, cli, slab, tmp):
    d = os.path.join(tmp, "cluster")
    procs.start("dataplane_up", [cli, "up", "--units", "2", "--slab", slab, "--dir", d])
    cj = os.path.join(d, "cluster.json")
    end = time.monotonic() + 120
    while True:
        procs.check()
        try:
            with open(cj) as f:
                json.load(f)
            return cj
        except (OSError, ValueError):
            if time.monotonic() > end:
                die(f"no {cj} after 120 s")
            time.sleep(0.1)


# ------------------------------------------------------------------ batches --

def batches():
    """(name, rows, fields, bytes per value)."""
    return [("64 rows x 1 MiB", 64, 1, MiB),
            ("1024 rows x 4 fields x 4 KiB", 1024, 4, 4096)]


def make_values(rows, fields, size, seed):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, size=(rows, size), dtype=np.uint8) for _ in range(fields)]


def crcs(arrs):
    return [[zlib.crc32(a[r]) for r in range(a.shape[0])] for a in arrs]


class MooncakeSide:
    name = "Mooncake Store"

    def __init__(self, meta, master):
        from mooncake.store import MooncakeDistributedStore, ReplicateConfig
        self.s = MooncakeDistributedStore()
        # no segment of its own: every value goes to the holder, over TCP
        rc = self.s.setup("127.0.0.1", meta, 0, 256 * MiB, "tcp", "", master)
        if rc != 0:
            die(f"MooncakeDistributedStore.setup returned {rc}")
        self.cfg = ReplicateConfig()
        self.cfg.replica_num = 1
        self.registered = []

    def prepare(self, src, dst):
        for a in src + dst:
            if self.s.register_buffer(a.ctypes.data, a.nbytes) != 0:
                die("Mooncake register_buffer failed")
            self.registered.append(a)

    def release(self):
        for a in self.registered:
            self.s.unregister_buffer(a.ctypes.data)
        self.registered = []

    def _layout(self, rep, arrs):
        rows, size = arrs[0].shape
        keys, ptrs, sizes = [], [], []
        for f, a in enumerate(arrs):
            for r in range(rows):
                keys.append(f"{rep}-{r}@f{f}")
                ptrs.append(a.ctypes.data + r * size)
                sizes.append(size)
        return keys, ptrs, sizes

    # Batches of at most this many keys, as TransferQueue's Mooncake client
    # sends them: one batch of 4,096 keys failed here with TRANSFER_FAIL (-800).
    CHUNK = 400

    def put(self, rep, src):
        keys, ptrs, sizes = self._layout(rep, src)
        for i in range(0, len(keys), self.CHUNK):
            j = i + self.CHUNK
            rcs = self.s.batch_put_from(keys[i:j], ptrs[i:j], sizes[i:j], self.cfg)
            if any(x != 0 for x in rcs):
                die(f"Mooncake batch_put_from failed: {sorted(set(rcs))}")

    def get(self, rep, dst):
        keys, ptrs, sizes = self._layout(rep, dst)
        for i in range(0, len(keys), self.CHUNK):
            j = i + self.CHUNK
            rcs = self.s.batch_get_into(keys[i:j], ptrs[i:j], sizes[i:j])
            if any(x != s for x, s in zip(rcs, sizes[i:j])):
                die(f"Mooncake batch_get_into returned {sorted(set(rcs))[:5]} (bytes per "
                    f"key)")

    def clear(self, rep, src):
        keys, _, _ = self._layout(rep, src)
        self.s.batch_remove(keys, force=True)

    def close(self):
        self.release()
        self.s.close()


class DataplaneSide:
    name = "dataplane"

    def __init__(self, cluster):
        import dataplane
        self.c = dataplane.Client(cluster, timeout_s=60)
        self.registered = []

    def prepare(self, src, dst):
        for a in src + dst:
            self.c.register(a)
            self.registered.append(a)

    def release(self):
        for a in self.registered:
            self.c.deregister(a)
        self.registered = []

    def put(self, rep, src):
        rows = range(rep * 100000, rep * 100000 + src[0].shape[0])
        self.c.put(rows, {f"f{f}": a for f, a in enumerate(src)})

    def get(self, rep, dst):
        rows = range(rep * 100000, rep * 100000 + dst[0].shape[0])
        self.c.get(rows, [f"f{f}" for f in range(len(dst))],
                   out={f"f{f}": a for f, a in enumerate(dst)})

    def clear(self, rep, src):
        self.c.clear(range(rep * 100000, rep * 100000 + src[0].shape[0]))

    def close(self):
        self.release()
        self.c.close()


def measure(side, rows, fields, size, reps):
    src = make_values(rows, fields, size, seed=rows * 7 + fields)
    want = crcs(src)
    dst = [np.zeros_like(a) for a in src]
    side.prepare(src, dst)
    tp, tg = [], []
    try:
        for rep in range(reps + 1):  # the first is a warm-up
            for a in dst:
                a[:] = 0
            t0 = time.perf_counter()
            side.put(rep, src)
            t1 = time.perf_counter()
            side.get(rep, dst)
            t2 = time.perf_counter()
            got = crcs(dst)
            if got != want:
                bad = sum(x != y for gf, wf in zip(got, want) for x, y in zip(gf, wf))
                die(f"{side.name}: {bad} values read back differ from what was put "
                    f"(CRC32), rep {rep}")
            side.clear(rep, src)
            if rep:
                tp.append(t1 - t0)
                tg.append(t2 - t1)
    finally:
        side.release()
    nbytes = rows * fields * size

    def q(xs, p):
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(round(p * (len(xs) - 1))))]

    return {"put_gbs": nbytes / statistics.median(tp) / 1e9,
            "get_gbs": nbytes / statistics.median(tg) / 1e9,
            "put_p50_ms": statistics.median(tp) * 1e3, "put_p99_ms": q(tp, 0.99) * 1e3,
            "get_p50_ms": statistics.median(tg) * 1e3, "get_p99_ms": q(tg, 0.99) * 1e3}


def memcpy_gbs(rows, fields, size, reps):
    """The limit: the same bytes copied once by one thread (numpy), median."""
    src = make_values(rows, fields, size, seed=1)
    dst = [np.empty_like(a) for a in src]
    ts = []
    for _ in range(reps + 1):
        t0 = time.perf_counter()
        for d, a in zip(dst, src):
            np.copyto(d, a)
        ts.append(time.perf_counter() - t0)
    return rows * fields * size / statistics.median(ts[1:]) / 1e9


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cli", default=os.environ.get("DP_CLI", "build/dataplane"),
                    help="the dataplane tool (default $DP_CLI or build/dataplane)")
    ap.add_argument("--reps", type=int, default=10, help="timed batches per side (10)")
    ap.add_argument("--json", help="also write the results here")
    a = ap.parse_args()
    if a.reps < 1:
        die("--reps must be >= 1", 2)
    if not os.access(a.cli, os.X_OK):
        die(f"no dataplane tool at {a.cli} (build first, or --cli)", 2)
    try:
        import dataplane  # noqa: F401
        import mooncake.store  # noqa: F401
    except ImportError as e:
        die(f"{e}: run through bench/peers/run.sh (PYTHONPATH=BUILD/python, the peers' "
            f"virtual environment)", 2)
    tmp = tempfile.mkdtemp(prefix="dp-peers-")
    procs = Procs(tmp)
    results = {}
    try:
        meta, master = start_mooncake(procs, 2 << 30)
        cluster = start_dataplane(procs, a.cli, "1G", tmp)
        sides = [DataplaneSide(cluster), MooncakeSide(meta, master)]
        try:
            for name, rows, fields, size in batches():
                results[(name, "memcpy")] = memcpy_gbs(rows, fields, size, a.reps)
                for side in sides:  # one after another, same process, same arrays' sizes
                    procs.check()
                    results[(name, side.name)] = measure(side, rows, fields, size, a.reps)
        finally:
            for side in sides:
                side.close()
    finally:
        procs.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"## one host: dataplane (2 units, shared memory) vs Mooncake Store (master + "
          f"one DRAM holder, TCP), {a.reps} batches each, medians; every value CRC-checked")
    print("| batch | side | put GB/s | get GB/s | put p50 / p99 ms | get p50 / p99 ms |")
    print("|---|---|---:|---:|---:|---:|")
    for (bname, sname), r in results.items():
        if sname == "memcpy":
            continue
        print(f"| {bname} | {sname} | {r['put_gbs']:.2f} | {r['get_gbs']:.2f} | "
              f"{r['put_p50_ms']:.2f} / {r['put_p99_ms']:.2f} | "
              f"{r['get_p50_ms']:.2f} / {r['get_p99_ms']:.2f} |")
    print("\nratios dataplane / Mooncake Store (goal on one host: >= 2x), and each side "
          "against one thread's memcpy of the batch in the same run:")
    for name, _, _, _ in batches():
        d, m = results[(name, "dataplane")], results[(name, "Mooncake Store")]
        mc = results[(name, "memcpy")]
        print(f"  {name}: put {d['put_gbs'] / m['put_gbs']:.2f}x, "
              f"get {d['get_gbs'] / m['get_gbs']:.2f}x; memcpy {mc:.2f} GB/s: dataplane "
              f"put {d['put_gbs'] / mc:.2f}x get {d['get_gbs'] / mc:.2f}x, Mooncake put "
              f"{m['put_gbs'] / mc:.2f}x get {m['get_gbs'] / mc:.2f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({f"{k[0]} | {k[1]}": v for k, v in results.items()}, f, indent=1)


if __name__ == "__main__":
    main()
