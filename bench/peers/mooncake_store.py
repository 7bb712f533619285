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

from netns import Hosts

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


def start_mooncake(procs, segment_bytes, addr="127.0.0.1", wrap=()):
    """mooncake_master (its HTTP metadata server on) and one DRAM holder, on
    addr; wrap: the command that runs them on the other host."""
    rpc, http, metrics, holder = free_port(), free_port(), free_port(), free_port()
    procs.start("mooncake_master", [
        *wrap, mooncake_bin("mooncake_master"), f"--rpc_address={addr}", f"--rpc_port={rpc}",
        "--enable_http_metadata_server=true", f"--http_metadata_server_host={addr}",
        f"--http_metadata_server_port={http}", f"--metrics_port={metrics}",
        "-default_kv_lease_ttl=999999", "-client_ttl=30", "--rpc_thread_num=4",
        "--eviction_high_watermark_ratio=1.0", "--eviction_ratio=0.0"])
    meta = f"http://{addr}:{http}/metadata"
    master = f"{addr}:{rpc}"
    end = time.monotonic() + 30
    while True:  # the master answers on its RPC port
        procs.check()
        if subprocess.run([*wrap, sys.executable, "-c", CONNECT, addr, str(rpc)],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0:
            break
        if time.monotonic() > end:
            die("mooncake_master did not open its port in 30 s")
        time.sleep(0.2)
    procs.start("mooncake_holder", [
        *wrap, mooncake_bin("mooncake_client"), f"-host={addr}",
        f"-global_segment_size={segment_bytes}", f"-master_server_address={master}",
        f"-metadata_server={meta}", "-protocol=tcp", f"-port={holder}"])
    time.sleep(3)  # it mounts its segment with the master
    procs.check()
    return meta, master


# exits 0 when a TCP connection to argv[1]:argv[2] opens (run where the server is)
CONNECT = ("import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), "
           "timeout=1).close()")


def start_dataplane(procs, cli, slab, tmp, addr=None, wrap=()):
    d = os.path.join(tmp, "cluster")
    bind = ["--bind", addr] if addr else []
    procs.start("dataplane_up", [*wrap, cli, "up", "--units", "2", "--slab", slab, *bind,
                                 "--dir", d])
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

def batches(rollout):
    """(name, [per field: the byte size of each row's value]). The RL batch
    is bench/rl_batch.sh's: 512 rows of input_ids (int64) and logprobs
    (float32) of 128..8192 tokens, a float32 reward and a bool done each."""
    rng = np.random.default_rng(7)
    lens = rng.integers(128, 8193, size=512)
    out = [("64 rows x 1 MiB", [[MiB] * 64]),
           ("1024 rows x 4 fields x 4 KiB", [[4096] * 1024] * 4),
           ("RL batch, 512 rows (jagged)", [list(lens * 8), list(lens * 4), [4] * 512,
                                            [1] * 512])]
    if rollout:
        out.append(("one 1 GiB rollout", [[1 << 30]]))
    return out


class Field:
    """One field's values: one arena (registered on each side) and a view of
    it per row; uniform rows also as one (rows, size) array."""

    def __init__(self, sizes, rng=None):
        self.sizes = [int(x) for x in sizes]
        self.offs = np.concatenate(([0], np.cumsum(self.sizes)[:-1])).astype(np.int64)
        total = int(sum(self.sizes))
        if rng is None:
            self.arena = np.zeros(total, dtype=np.uint8)
        else:  # random bytes, made in 64 MiB pieces (a 1 GiB field at once needs 8 GiB)
            self.arena = np.empty(total, dtype=np.uint8)
            for i in range(0, total, 64 * MiB):
                j = min(total, i + 64 * MiB)
                self.arena[i:j] = rng.integers(0, 256, size=j - i, dtype=np.uint8)
        self.uniform = len(set(self.sizes)) == 1
        if self.uniform:
            self.rows = self.arena.reshape(len(self.sizes), self.sizes[0])
        else:
            self.rows = [self.arena[o:o + n] for o, n in zip(self.offs, self.sizes)]

    def crcs(self):
        a = self.arena
        return [zlib.crc32(a[o:o + n]) for o, n in zip(self.offs, self.sizes)]


class MooncakeSide:
    name = "Mooncake Store"

    def __init__(self, meta, master, host):
        from mooncake.store import MooncakeDistributedStore, ReplicateConfig
        self.s = MooncakeDistributedStore()
        # no segment of its own: every value goes to the holder, over TCP
        rc = self.s.setup(host, meta, 0, 256 * MiB, "tcp", "", master)
        if rc != 0:
            die(f"MooncakeDistributedStore.setup returned {rc}")
        self.cfg = ReplicateConfig()
        self.cfg.replica_num = 1
        self.registered = []

    def prepare(self, src, dst):
        for f in src + dst:
            a = f.arena
            if self.s.register_buffer(a.ctypes.data, a.nbytes) != 0:
                die("Mooncake register_buffer failed")
            self.registered.append(a)

    def release(self):
        for a in self.registered:
            self.s.unregister_buffer(a.ctypes.data)
        self.registered = []

    def _layout(self, rep, fields):
        keys, ptrs, sizes = [], [], []
        for fi, f in enumerate(fields):
            base = f.arena.ctypes.data
            for r, (o, n) in enumerate(zip(f.offs, f.sizes)):
                keys.append(f"{rep}-{r}@f{fi}")
                ptrs.append(base + int(o))
                sizes.append(n)
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
        self.c = dataplane.Client(cluster, timeout_s=120)
        self.registered = []

    def prepare(self, src, dst):
        for f in src + dst:
            self.c.register(f.arena)
            self.registered.append(f.arena)

    def release(self):
        for a in self.registered:
            self.c.deregister(a)
        self.registered = []

    @staticmethod
    def _rows(rep, fields):
        return range(rep * 100000, rep * 100000 + len(fields[0].sizes))

    def put(self, rep, src):
        self.c.put(self._rows(rep, src), {f"f{i}": f.rows for i, f in enumerate(src)})

    def get(self, rep, dst):
        self.c.get(self._rows(rep, dst), [f"f{i}" for i in range(len(dst))],
                   out={f"f{i}": f.rows for i, f in enumerate(dst)})

    def clear(self, rep, src):
        self.c.clear(self._rows(rep, src))

    def close(self):
        self.release()
        self.c.close()


def measure(side, fields, reps):
    rng = np.random.default_rng(len(fields) * 7 + len(fields[0]))
    src = [Field(sizes, rng) for sizes in fields]
    want = [f.crcs() for f in src]
    dst = [Field(sizes) for sizes in fields]
    side.prepare(src, dst)
    tp, tg = [], []
    try:
        for rep in range(reps + 1):  # the first is a warm-up
            for f in dst:
                f.arena[:] = 0
            t0 = time.perf_counter()
            side.put(rep, src)
            t1 = time.perf_counter()
            side.get(rep, dst)
            t2 = time.perf_counter()
            got = [f.crcs() for f in dst]
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
    nbytes = sum(sum(f) for f in fields)

    def q(xs, p):
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(round(p * (len(xs) - 1))))]

    return {"put_gbs": nbytes / statistics.median(tp) / 1e9,
            "get_gbs": nbytes / statistics.median(tg) / 1e9,
            "put_p50_ms": statistics.median(tp) * 1e3, "put_p99_ms": q(tp, 0.99) * 1e3,
            "get_p50_ms": statistics.median(tg) * 1e3, "get_p99_ms": q(tg, 0.99) * 1e3}


def memcpy_gbs(fields, reps):
    """The limit on one host: the same bytes copied once by one thread
    (numpy, value by value), median."""
    rng = np.random.default_rng(1)
    src = [Field(sizes, rng) for sizes in fields]
    dst = [Field(sizes) for sizes in fields]
    ts = []
    for _ in range(reps + 1):
        t0 = time.perf_counter()
        for d, a in zip(dst, src):
            if a.uniform:
                np.copyto(d.rows, a.rows)
            else:
                for x, y in zip(d.rows, a.rows):
                    np.copyto(x, y)
        ts.append(time.perf_counter() - t0)
    return sum(sum(f) for f in fields) / statistics.median(ts[1:]) / 1e9


# ------------------------------------------------------------ across hosts --

def iperf_gbs(hosts, secs=3):
    """The link: iperf3, one stream, host 1 -> host 0 (None without iperf3)."""
    if shutil.which("iperf3") is None:
        return None
    srv = subprocess.Popen([*hosts.wrap(hosts.h0), "iperf3", "-s", "-1", "-p", "5201"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        out = subprocess.run([*hosts.wrap(hosts.h1), "iperf3", "-c", hosts.A0, "-p", "5201",
                              "-t", str(secs), "-J"], capture_output=True, text=True).stdout
        return json.loads(out)["end"]["sum_received"]["bits_per_second"] / 8e9
    except (ValueError, KeyError):
        return None
    finally:
        srv.kill()
        srv.wait()


# ---------------------------------------------------------------------- main --

def run_sides(meta, master, cluster, host, reps, rollout):
    """Every batch on both sides, in this process: {(batch, side): figures}."""
    results = {}
    sides = [DataplaneSide(cluster), MooncakeSide(meta, master, host)]
    try:
        for name, fields in batches(rollout):
            for side in sides:  # one after another, same process, same arrays' sizes
                r = 2 if fields == [[1 << 30]] else reps  # two of 1 GiB (after a warm-up)
                results[(name, side.name)] = measure(side, fields, r)
    finally:
        for side in sides:
            side.close()
    return results


def print_results(results, title, limit_name, limits, goal):
    print(title)
    print("| batch | side | put GB/s | get GB/s | put p50 / p99 ms | get p50 / p99 ms |")
    print("|---|---|---:|---:|---:|---:|")
    names = []
    for (bname, sname), r in results.items():
        if bname not in names:
            names.append(bname)
        print(f"| {bname} | {sname} | {r['put_gbs']:.2f} | {r['get_gbs']:.2f} | "
              f"{r['put_p50_ms']:.2f} / {r['put_p99_ms']:.2f} | "
              f"{r['get_p50_ms']:.2f} / {r['get_p99_ms']:.2f} |")
    print(f"\nratios dataplane / Mooncake Store (goal: >= {goal}x), and each side "
          f"against {limit_name} in the same run:")
    for name in names:
        d, m = results[(name, "dataplane")], results[(name, "Mooncake Store")]
        line = (f"  {name}: put {d['put_gbs'] / m['put_gbs']:.2f}x, "
                f"get {d['get_gbs'] / m['get_gbs']:.2f}x")
        lim = limits.get(name) if isinstance(limits, dict) else limits
        if lim:
            line += (f"; {limit_name} {lim:.2f} GB/s: dataplane put {d['put_gbs'] / lim:.2f}x "
                     f"get {d['get_gbs'] / lim:.2f}x, Mooncake put {m['put_gbs'] / lim:.2f}x "
                     f"get {m['get_gbs'] / lim:.2f}x")
        print(line)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cli", default=os.environ.get("DP_CLI", "build/dataplane"),
                    help="the dataplane tool (default $DP_CLI or build/dataplane)")
    ap.add_argument("--reps", type=int, default=10, help="timed batches per side (10; the "
                    "1 GiB rollout: 2)")
    ap.add_argument("--hosts", action="store_true",
                    help="across two network-namespace hosts over TCP (needs root): the "
                         "servers in one, the clients in the other")
    ap.add_argument("--no-rollout", action="store_true", help="leave out the 1 GiB rollout")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--client", nargs=4, metavar=("META", "MASTER", "CLUSTER", "HOST"),
                    help=argparse.SUPPRESS)  # --hosts runs this part in host 1
    a = ap.parse_args()
    if a.reps < 1:
        die("--reps must be >= 1", 2)
    try:
        import dataplane  # noqa: F401
        import mooncake.store  # noqa: F401
    except ImportError as e:
        die(f"{e}: run through bench/peers/run.sh (PYTHONPATH=BUILD/python, the peers' "
            f"virtual environment)", 2)
    if a.client:
        res = run_sides(*a.client, a.reps, not a.no_rollout)
        json.dump([[k[0], k[1], v] for k, v in res.items()], sys.stdout)
        return
    if not os.access(a.cli, os.X_OK):
        die(f"no dataplane tool at {a.cli} (build first, or --cli)", 2)
    tmp = tempfile.mkdtemp(prefix="dp-peers-")
    procs = Procs(tmp)
    hosts = Hosts() if a.hosts else None
    link = None
    try:
        if hosts is None:
            meta, master = start_mooncake(procs, 3 << 30)
            cluster = start_dataplane(procs, a.cli, "2G", tmp)
            results = run_sides(meta, master, cluster, "127.0.0.1", a.reps, not a.no_rollout)
        else:
            hosts.up()
            link = iperf_gbs(hosts)
            w0 = hosts.wrap(hosts.h0)
            meta, master = start_mooncake(procs, 3 << 30, hosts.A0, w0)
            cluster = start_dataplane(procs, a.cli, "2G", tmp, hosts.A0, w0)
            out = os.path.join(tmp, "client.json")
            with open(out, "wb") as f:
                rc = subprocess.run([*hosts.wrap(hosts.h1), "env", "UCX_TLS=tcp",
                                     sys.executable, os.path.abspath(__file__), "--reps",
                                     str(a.reps), *(["--no-rollout"] if a.no_rollout else []),
                                     "--client", meta, master, cluster, hosts.A1],
                                    stdout=f).returncode
            procs.check()
            if rc != 0:
                die(f"the client in host 1 failed (status {rc}; its messages are above)")
            with open(out) as f:
                results = {(b, s): v for b, s, v in json.load(f)}
        limits = {}
        if hosts is None:
            limits = {name: memcpy_gbs(fields, 2 if fields == [[1 << 30]] else a.reps)
                      for name, fields in batches(not a.no_rollout)}
    finally:
        procs.stop()
        if hosts is not None:
            hosts.down()
        shutil.rmtree(tmp, ignore_errors=True)
    if hosts is None:
        print_results(results, f"## one host: dataplane (2 units, shared memory) vs Mooncake "
                      f"Store (master + one DRAM holder, TCP), {a.reps} batches each, "
                      f"medians; every value CRC-checked", "one thread's memcpy", limits, 2)
    else:
        print_results(results, f"## across two hosts (network namespaces, TCP): servers in "
                      f"host 0, clients in host 1; dataplane (2 units, UCX_TLS=tcp) vs "
                      f"Mooncake Store (master + one DRAM holder, TCP), {a.reps} batches "
                      f"each, medians; every value CRC-checked", "iperf3's one stream",
                      link, 1.5)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({f"{k[0]} | {k[1]}": v for k, v in results.items()}, f, indent=1)


if __name__ == "__main__":
    main()
