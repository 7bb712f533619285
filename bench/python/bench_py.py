#!/usr/bin/python3
"""The Python package's put and get next to the C library, a torch copy and
Redis, in one run (the Python counterpart of bench/compare.sh).

Shapes (a batch = rows x fields values of float32 torch tensors):

  large: 64 rows x 1 field x 1 MiB    (one batch tensor [64, 262144])
  small: 1024 rows x 4 fields x 4 KiB (four batch tensors [1024, 1024])

Methods, on one local 2-unit cluster started here (`dataplane up`) and one
redis-server on a free loopback port, both stopped at the end:

  Client            dataplane.Client.put(rows, {field: batch}) of plain torch
                    tensors; get(rows, fields) -> per-row tensors
  Client get out=   get(rows, fields, out={field: preallocated batch})
  Client alloc()    put from and get (out=) into tensors over client.alloc()
                    (registered) memory: no staging copy
  Client get stack  get(rows, fields, stack=True) -> one batch tensor per field
                    (gathered from the fetched memory: the rows alternate units)
  Client alloc() stack  get(out=registered batch, stack=True): the data lands in
                    place and the destination itself comes back
  TQ adapter        dataplane.tq.DataplaneKVClient driven as TQ's KV storage
                    manager drives it: field-major keys "gidx@field", values
                    list(batch) (per-row views), get(keys, shapes, dtypes,
                    custom_backend_meta=what put returned: location hints)
  TQ flatten()      the same, with the values as the "Dataplane" storage
                    manager hands them: dataplane.tq.flatten(batch), whose
                    tensor fields the put moves whole
  C lib malloc      `dataplane bench --memory malloc` (plain memory, staged)
  C lib registered  `dataplane bench --memory registered`
  torch copy        put column: dst.copy_(src) of each batch tensor into a
                    preallocated one; get column: src.clone()
  Redis             redis-py pipelined SET / GET of the bytes of each row
                    tensor under the same keys, one pipeline per batch

Each iteration puts one batch, gets it back and clears it (untimed), as
`dataplane bench` does. Each round warms every method up, then runs ITERS
timed iterations in which dataplane's Python methods take turns iteration by
iteration (GB/s = bytes / summed op time), then torch's, Redis's and the C
library's ITERS each, alone (a torch clone's fresh pages slowed the methods
taking turns with it); the table
shows the median of REPS rounds, and ratios are medians of per-round
ratios, so the methods compared see the same load. GB/s = 1e9 B/s.

  /usr/bin/python3 bench/python/bench_py.py [--build build] [--reps 5]
      [--iters 20] [--warmup 2] [--shapes large,small] [--no-redis]

Timings are shown, never asserted.
"""

import argparse
import gc
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

SHAPES = {  # name: (rows, fields, bytes per value)
    "large": (64, 1, 1 << 20),
    "small": (1024, 4, 4096),
}

# Row ranges kept apart per method (each clears its rows after every iteration).
ROW_BASE = {"client": 1_000_000, "client_out": 2_000_000, "client_alloc": 3_000_000,
            "tq": 4_000_000, "client_stack": 5_000_000, "client_alloc_stack": 6_000_000,
            "tq_flat": 7_000_000, "c": 50_000_000}

# (id, label, (put, get): the `dataplane bench --memory` mode whose put and get
# move the data as this method's do, for the put/C and get/C ratios). Plain
# tensors are put through the library's staging (malloc); Client.get and the
# TQ get land in registered memory of the library (registered); get out= into
# plain tensors goes through staging again (malloc).
METHODS = [
    ("client", "Client", ("malloc", "registered")),
    ("client_out", "Client get out=", (None, "malloc")),
    ("client_alloc", "Client alloc()", ("registered", "registered")),
    ("client_stack", "Client get stack", (None, "registered")),
    ("client_alloc_stack", "Client alloc() stack", (None, "registered")),
    ("tq", "TQ adapter", ("malloc", "registered")),
    ("tq_flat", "TQ flatten()", ("malloc", "registered")),
    ("c_malloc", "C lib malloc", None),
    ("c_registered", "C lib registered", None),
    ("torch", "torch copy_/clone", None),
    ("redis", "Redis (redis-py)", None),
]

ALONE = ("torch", "redis")  # references that run alone in each round, not in turns

NOTES = """\
notes:
  put/C, get/C: this row over `dataplane bench` moving the data the same way:
    put of plain tensors and get out= plain tensors over --memory malloc (both
    through the library's staging); Client.get and TQ get (land in registered
    memory of the library) and everything alloc() over --memory registered.
  tch: torch, put column dst.copy_(src) into a preallocated batch, get column
    src.clone(); Cl: over the Client row; rd: over Redis.
  Ratios are medians over the rounds of the two methods' GB/s in the same
    round (the machine's speed drifts between rounds).
  spread %: (max - min) / median of the rounds, put/get.
  Redis: values are the rows' bytes, built once (untimed); GET returns bytes (no
    tensor made): Redis's best case. TQ: keys and per-row views (or flatten())
    built untimed.
  Every dataplane iteration puts, gets, then clears its rows (untimed), as
    `dataplane bench` does; what a get returned is dropped untimed.
  Python's cyclic GC is off while a method's iterations run and collects after
    them (untimed), as timeit does: a full collection of this process takes
    tens of ms and would land in whichever method's timing happened to start
    it (the ones making a tensor per value most often).
  {reps} rounds x {iters} iterations (+{warmup} warm-up each): in a round
    dataplane's Python methods take turns iteration by iteration (in rotating
    order), then torch, Redis and each `dataplane bench` run alone; the table
    shows the median round of each."""

pc = time.perf_counter


def say(msg):
    print(msg, flush=True)


def die(msg, code=2):
    print(f"bench_py: {msg}", file=sys.stderr, flush=True)
    sys.exit(code)


class Stop(Exception):
    """A signal asked us to stop: raised so the finally clauses clean up."""


def _on_signal(signum, frame):
    e = Stop(f"signal {signum}")
    e.status = 128 + signum
    raise e


# ---------------------------------------------------------------- processes --

class Procs:
    """The cluster and redis-server started here, stopped by stop() in any case."""

    def __init__(self, tmp):
        self.tmp = tmp
        self.up = None
        self.redis = None
        self.redis_port = None

    def start_cluster(self, cli, slab, timeout_s=120.0):
        d = os.path.join(self.tmp, "cluster")
        self.up_out = open(os.path.join(self.tmp, "up.out"), "wb")
        self.up_err_path = os.path.join(self.tmp, "up.err")
        self.up_err = open(self.up_err_path, "wb")
        self.up = subprocess.Popen([cli, "up", "--units", "2", "--slab", slab, "--dir", d],
                                   stdin=subprocess.DEVNULL, stdout=self.up_out,
                                   stderr=self.up_err)
        cj = os.path.join(d, "cluster.json")
        end = time.monotonic() + timeout_s
        while not os.path.exists(cj):
            if self.up.poll() is not None:
                die(f"`dataplane up` exited with status {self.up.returncode}:\n"
                    f"{_tail(self.up_err_path)}", 1)
            if time.monotonic() > end:
                die(f"no {cj} after {timeout_s:.0f} s:\n{_tail(self.up_err_path)}", 1)
            time.sleep(0.1)
        # cluster.json is written whole (rename) by up; read it once to be sure.
        for _ in range(50):
            try:
                with open(cj) as f:
                    json.load(f)
                break
            except (OSError, ValueError):
                time.sleep(0.1)
        return cj

    def start_redis(self, timeout_s=10.0):
        import redis
        port = _free_port()
        self.redis_port = port
        self.redis = subprocess.Popen(
            ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "",
             "--appendonly", "no", "--protected-mode", "yes",
             "--logfile", os.path.join(self.tmp, "redis.log")],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        r = redis.Redis(host="127.0.0.1", port=port, socket_timeout=120)
        end = time.monotonic() + timeout_s
        while True:
            try:
                if r.ping():
                    return r
            except redis.exceptions.ConnectionError:
                pass
            if self.redis.poll() is not None or time.monotonic() > end:
                die(f"redis-server on port {port} did not start:\n"
                    f"{_tail(os.path.join(self.tmp, 'redis.log'))}", 1)
            time.sleep(0.1)

    def stop(self):
        for name, p, grace in (("redis-server", self.redis, 10), ("dataplane up", self.up, 30)):
            if p is None or p.poll() is not None:
                continue
            try:
                p.send_signal(signal.SIGTERM)
                p.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                print(f"bench_py: {name} (pid {p.pid}) still running after SIGTERM + "
                      f"{grace} s: SIGKILL", file=sys.stderr)
                p.kill()
                p.wait()
        self.redis = self.up = None
        for f in ("up_out", "up_err"):
            if hasattr(self, f):
                getattr(self, f).close()


def _free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _tail(path, n=3000):
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")[-n:]
    except OSError:
        return "(no log)"


# ---------------------------------------------------------------- methods --
#
# Each method is a step() doing one iteration and returning (put seconds, get
# seconds), None for an operation it does not measure; step(check=True) also
# checks what came back (untimed).

def _check(ok, what):
    if not ok:
        raise AssertionError(f"{what}: the values that came back differ from those put")


def _rows_check(got, src, fields, rows, what):
    for f in fields:
        vals = got[f]
        _check(len(vals) == rows, what)
        for i in {0, rows // 2, rows - 1}:
            _check(torch.equal(vals[i], src[f][i]), f"{what} ({f}, row {i})")


def make_client_step(c, src, fields, rows):
    g = list(range(ROW_BASE["client"], ROW_BASE["client"] + rows))

    def step(check=False):
        t0 = pc()
        c.put(g, src)
        t1 = pc()
        got = c.get(g, fields)
        t2 = pc()
        if check:
            _rows_check(got, src, fields, rows, "Client get")
        del got
        c.clear(g)
        return t1 - t0, t2 - t1
    return step


def make_client_out_step(c, src, fields, rows):
    g = list(range(ROW_BASE["client_out"], ROW_BASE["client_out"] + rows))
    dst = {f: torch.empty_like(src[f]) for f in fields}

    def step(check=False):
        c.put(g, src)
        if check:
            for d in dst.values():
                d.zero_()
        t1 = pc()
        got = c.get(g, fields, out=dst)
        t2 = pc()
        if check:
            for f in fields:
                _check(torch.equal(dst[f], src[f]), f"Client get out= ({f})")
            _rows_check(got, src, fields, rows, "Client get out= (returned views)")
        del got
        c.clear(g)
        return None, t2 - t1
    return step


def make_client_stack_step(c, src, fields, rows):
    g = list(range(ROW_BASE["client_stack"], ROW_BASE["client_stack"] + rows))

    def step(check=False):
        c.put(g, src)
        t1 = pc()
        got = c.get(g, fields, stack=True)
        t2 = pc()
        if check:
            for f in fields:
                _check(torch.equal(got[f], src[f]), f"Client get stack ({f})")
        del got
        c.clear(g)
        return None, t2 - t1
    return step


def make_client_alloc_step(c, src, fields, rows, stack=False):
    base = ROW_BASE["client_alloc_stack" if stack else "client_alloc"]
    g = list(range(base, base + rows))
    bufs = []

    def reg_like(t):
        n = t.numel()
        b = c.alloc(n * t.element_size())
        bufs.append(b)
        return torch.frombuffer(b, dtype=t.dtype, count=n).view(t.shape)

    rsrc = {}
    for f in fields:
        rsrc[f] = reg_like(src[f])
        rsrc[f].copy_(src[f])
    rdst = {f: reg_like(src[f]) for f in fields}

    def step(check=False):
        if check:
            for d in rdst.values():
                d.zero_()
        t0 = pc()
        c.put(g, rsrc)
        t1 = pc()
        got = c.get(g, fields, out=rdst, stack=stack)
        t2 = pc()
        if check:
            for f in fields:
                _check(torch.equal(rdst[f], src[f]), f"Client alloc() get out= ({f})")
                if stack:
                    _check(got[f] is rdst[f], f"Client alloc() stack ({f})")
        del got
        c.clear(g)
        return (None if stack else t1 - t0), t2 - t1
    step.keep = (bufs, rsrc, rdst)  # the registered memory lives as long as step
    return step


def make_tq_step(kv, src, fields, rows, flat=False):
    """As TQ's KVStorageManager: keys field-major over sorted fields, values
    the per-row views of each batch tensor (flat: dataplane.tq.flatten(src),
    as the "Dataplane" storage manager hands them), get with one shape and
    dtype per key. Building keys and values is TQ's work, done untimed here."""
    from dataplane.tq import flatten
    base = ROW_BASE["tq_flat" if flat else "tq"]
    g = list(range(base, base + rows))
    fs = sorted(fields)
    keys = [f"{i}@{f}" for f in fs for i in g]
    shapes, dtypes = [], []
    for f in fs:
        shapes += [src[f].shape[1:]] * rows
        dtypes += [src[f].dtype] * rows

    def step(check=False):
        if flat:
            values = flatten({f: src[f] for f in fs})
        else:
            values = []
            for f in fs:
                values.extend(src[f])  # per-row views, as TQ's _generate_values
        t0 = pc()
        meta = kv.put(keys, values)  # TQ keeps the per-key metadata, hands it back
        t1 = pc()
        got = kv.get(keys, shapes=shapes, dtypes=dtypes, custom_backend_meta=meta)
        t2 = pc()
        if check:
            _check(len(got) == len(keys), "TQ get")
            for j in {0, len(keys) // 2, len(keys) - 1}:
                _check(torch.equal(got[j], values[j]), f"TQ get ({keys[j]})")
        del got, values
        kv.clear(keys)
        return t1 - t0, t2 - t1
    return step


def make_torch_step(src, fields):
    dst = {f: torch.empty_like(src[f]) for f in fields}

    def step(check=False):
        t0 = pc()
        for f in fields:
            dst[f].copy_(src[f])
        t1 = pc()
        cl = [src[f].clone() for f in fields]
        t2 = pc()
        if check:
            for f, x in zip(fields, cl):
                _check(torch.equal(dst[f], src[f]) and torch.equal(x, src[f]), "torch copy")
        del cl
        return t1 - t0, t2 - t1
    return step


def make_redis_step(r, src, fields, rows):
    """Pipelined SET and GET of each row tensor's bytes (built once, untimed:
    Redis's best case) under the same "gidx@field" keys; GET gives bytes."""
    g = range(ROW_BASE["client"], ROW_BASE["client"] + rows)
    keys, vals = [], []
    for f in fields:
        arr = src[f].numpy()
        for i, gi in enumerate(g):
            keys.append(f"{gi}@{f}")
            vals.append(arr[i].tobytes())

    def step(check=False):
        t0 = pc()
        p = r.pipeline(transaction=False)
        for k, v in zip(keys, vals):
            p.set(k, v)
        p.execute()
        t1 = pc()
        p = r.pipeline(transaction=False)
        for k in keys:
            p.get(k)
        got = p.execute()
        t2 = pc()
        if check:
            _check(len(got) == len(keys), "Redis GET")
            for j in {0, len(keys) // 2, len(keys) - 1}:
                _check(got[j] == vals[j], f"Redis GET ({keys[j]})")
        del got
        r.unlink(*keys)
        return t1 - t0, t2 - t1
    return step


def run_py(steps, iters, warmup, batch_bytes):
    """Each of steps' warm-up (the first checks the values), then iters
    timed iterations in which the methods take turns, one iteration each,
    in rotating order, so that they see the same machine: {method: (put,
    get) GB/s}. The cyclic
    GC is off meanwhile (see NOTES)."""
    for step in steps.values():
        for w in range(max(warmup, 1)):
            step(check=(w == 0))
    tp = dict.fromkeys(steps, 0.0)
    tg = dict.fromkeys(steps, 0.0)
    gc.collect()
    gc.disable()
    order = list(steps)
    try:
        for i in range(iters):
            # each iteration starts at the next method, so that none always
            # follows the same one (a torch clone's fresh pages, say)
            for mid in order[i % len(order):] + order[:i % len(order)]:
                a, b = steps[mid]()
                tp[mid] += a or 0.0
                tg[mid] += b or 0.0
    finally:
        gc.enable()
        gc.collect()
    gb = batch_bytes * iters / 1e9
    return {mid: ((gb / tp[mid] if tp[mid] > 0 else None),
                  (gb / tg[mid] if tg[mid] > 0 else None)) for mid in steps}


def run_c(cli, cluster, mode, rows, fields, nbytes, iters, warmup, tmp):
    """`dataplane bench` on the same cluster: (put, get) GB/s of its RESULT line."""
    cmd = [cli, "bench", "--rows", str(rows), "--fields", str(fields), "--bytes",
           str(nbytes), "--iters", str(iters), "--warmup", str(warmup), "--memory", mode,
           "--first-row", str(ROW_BASE["c"]), "--cluster", cluster]
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        out, err = p.communicate(timeout=600)
    except BaseException:
        p.kill()
        p.wait()
        raise
    with open(os.path.join(tmp, f"cbench.{mode}.log"), "a") as f:
        f.write(" ".join(cmd) + "\n" + out + err)
    res = None
    for line in out.splitlines():
        if line.startswith("RESULT "):
            res = dict(kv.split("=", 1) for kv in line.split()[1:] if "=" in kv)
    if p.returncode != 0 or res is None:
        raise RuntimeError(f"{' '.join(cmd)}: status {p.returncode}, no RESULT line:\n"
                           f"{(out + err)[-2000:]}")
    return float(res["put_GBps"]), float(res["get_GBps"])


# ---------------------------------------------------------------- report --

def _med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _f(x, nd=3):
    return "-" if x is None else f"{x:.{nd}f}"


def _cref(med, mem, k):
    """The C library's GB/s of operation k (0 put, 1 get) in the mode mem[k]."""
    if mem is None or mem[k] is None:
        return None
    return med.get(f"c_{mem[k]}", (None, None))[k]


def _rratio(rounds, mid, ref, k):
    """The median over rounds of method mid's GB/s over method ref's in the
    same round (operation k): steadier than a ratio of medians when the
    machine's speed drifts between rounds."""
    if ref is None or mid not in rounds or ref not in rounds:
        return None
    rs = [a[k] / b[k] for a, b in zip(rounds[mid], rounds[ref])
          if a[k] is not None and b[k] is not None and b[k] > 0]
    return statistics.median(rs) if rs else None


def report(name, shape, med, spread, rounds):
    rows, fields, nbytes = shape
    batch = rows * fields * nbytes
    say("")
    say(f"### {name}: {rows} rows x {fields} field(s) x {nbytes} B = "
        f"{batch / (1 << 20):.0f} MiB per batch; GB/s (1e9 B/s), median of rounds")
    hdr = (f"{'method':<18} | {'put':>7} {'get':>7} | {'spread %':>9} | "
           f"{'put/C':>6} {'get/C':>6} | {'put/tch':>7} {'get/tch':>7} | "
           f"{'put/Cl':>6} {'get/Cl':>6} | {'put/rd':>6} {'get/rd':>6}")
    say(hdr)
    say("-" * len(hdr))
    for mid, label, mem in METHODS:
        if mid not in med:
            continue
        p, g = med[mid]
        cref = [None if mem is None or mem[k] is None else f"c_{mem[k]}" for k in (0, 1)]
        r = [_f(_rratio(rounds, mid, ref, k), 2)
             for ref, k in ((cref[0], 0), (cref[1], 1), ("torch", 0), ("torch", 1),
                            ("client", 0), ("client", 1), ("redis", 0), ("redis", 1))]
        say(f"{label:<18} | {_f(p):>7} {_f(g):>7} | {spread.get(mid, '-'):>9} | "
            f"{r[0]:>6} {r[1]:>6} | {r[2]:>7} {r[3]:>7} | {r[4]:>6} {r[5]:>6} | "
            f"{r[6]:>6} {r[7]:>6}")

    # Per-call overhead of the Python layers over the C library moving the
    # data the same way: t = batch bytes / median GB/s, overhead = t_py - t_c.
    keys = rows * fields
    say("")
    say(f"per-call overhead vs the C library ({name}: {keys} keys per call; us; "
        f"ovh = t_py - t_c, /key = ovh / {keys})")
    say(f"{'method':<18} | {'C put':<10} {'t_py':>8} {'t_c':>8} {'ovh':>8} {'/key':>6} | "
        f"{'C get':<10} {'t_py':>8} {'t_c':>8} {'ovh':>8} {'/key':>6}")
    for mid, label, mem in METHODS:
        if mem is None or mid not in med:
            continue
        cells = []
        for k in (0, 1):
            py, c = med[mid][k], _cref(med, mem, k)
            tpy = None if py is None else batch / (py * 1e3)  # us
            tc = None if c is None else batch / (c * 1e3)
            ovh = None if tpy is None or tc is None else tpy - tc
            cells += [mem[k] or "-", _f(tpy, 0), _f(tc, 0), _f(ovh, 0),
                      _f(None if ovh is None else ovh / keys, 2)]
        say(f"{label:<18} | {cells[0]:<10} {cells[1]:>8} {cells[2]:>8} {cells[3]:>8} "
            f"{cells[4]:>6} | {cells[5]:<10} {cells[6]:>8} {cells[7]:>8} {cells[8]:>8} "
            f"{cells[9]:>6}")


def _spread(rs):
    """(max - min) / median of the put and of the get rounds, in percent."""
    out = []
    for k in (0, 1):
        v = [x[k] for x in rs if x[k] is not None]
        out.append(f"{100 * (max(v) - min(v)) / statistics.median(v):.0f}" if v else "-")
    return "/".join(out)


# ---------------------------------------------------------------- main --

def parse_args(argv):
    ap = argparse.ArgumentParser(
        prog="bench_py.py",
        description="dataplane's Python Client and TQ adapter next to the C library, "
                    "a torch copy and Redis (redis-py), on a local 2-unit cluster "
                    "started and stopped here. GB/s = 1e9 B/s; timings are shown, "
                    "never asserted. Run with /usr/bin/python3 (numpy, torch, redis).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--build", default="build",
                    help="build directory holding dataplane and python/")
    ap.add_argument("--reps", type=int, default=5, help="rounds; the table shows medians")
    ap.add_argument("--iters", type=int, default=20, help="timed iterations per round")
    ap.add_argument("--warmup", type=int, default=2,
                    help="untimed iterations before each (the first checks values)")
    ap.add_argument("--shapes", default="large,small",
                    help=f"comma-separated, of: {', '.join(SHAPES)}")
    ap.add_argument("--no-redis", action="store_true", help="skip Redis")
    ap.add_argument("--methods", default=",".join(m for m, _, _ in METHODS),
                    help="comma-separated method ids to run (the ratio columns need "
                         "client, torch, the c_ ones and redis)")
    ap.add_argument("--slab", default="1G", help="slab of each of the 2 units")
    ap.add_argument("--json", metavar="PATH", help="also write every round's GB/s here")
    a = ap.parse_args(argv)
    if a.reps < 1 or a.iters < 1 or a.warmup < 0:
        ap.error("--reps and --iters must be >= 1, --warmup >= 0")
    a.shape_list = [s.strip() for s in a.shapes.split(",") if s.strip()]
    bad = [s for s in a.shape_list if s not in SHAPES]
    if bad or not a.shape_list:
        ap.error(f"--shapes: unknown {', '.join(bad) or '(none)'}; known: {', '.join(SHAPES)}")
    known = [m for m, _, _ in METHODS]
    a.method_list = [m.strip() for m in a.methods.split(",") if m.strip()]
    bad = [m for m in a.method_list if m not in known]
    if bad or not a.method_list:
        ap.error(f"--methods: unknown {', '.join(bad) or '(none)'}; known: {', '.join(known)}")
    if "redis" not in a.method_list:
        a.no_redis = True
    return a


def preflight(a):
    build = os.path.abspath(a.build)
    cli = os.path.join(build, "dataplane")
    pkg = os.path.join(build, "python")
    if not os.path.isdir(build):
        die(f"no build directory {build}: run `make` (or pass --build DIR)")
    if not (os.path.isfile(cli) and os.access(cli, os.X_OK)):
        die(f"no {cli}: build the dataplane-cli target (`make`)")
    if not os.path.isfile(os.path.join(pkg, "dataplane", "__init__.py")) or not any(
            n.startswith("_core") and n.endswith(".so")
            for n in os.listdir(os.path.join(pkg, "dataplane"))):
        die(f"no Python package in {pkg}/dataplane (no __init__.py or _core*.so): "
            f"`make` builds it (needs python3-dev)")
    try:
        subprocess.run([cli, "bench", "--help"], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=30)
    except (subprocess.SubprocessError, OSError):
        die(f"{cli} has no bench command")
    if not a.no_redis:
        if shutil.which("redis-server") is None:
            die("redis-server is not installed (apt-get install redis-server), or pass "
                "--no-redis")
        try:
            import redis  # noqa: F401
        except ImportError:
            die(f"redis-py is not importable by {sys.executable}: use /usr/bin/python3 "
                f"(python3-redis), or pass --no-redis")
    global torch
    try:
        import torch
    except ImportError:
        die(f"torch is not importable by {sys.executable}: use /usr/bin/python3 "
            f"(python3-torch)")
    sys.path.insert(0, pkg)
    try:
        import dataplane  # noqa: F401
        import dataplane.tq  # noqa: F401
    except Exception as e:  # a stale or half-built package
        die(f"cannot import dataplane from {pkg}: {type(e).__name__}: {e}")
    return cli, pkg


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    cli, pkg = preflight(a)
    import dataplane
    from dataplane.tq import DataplaneKVClient

    warnings.filterwarnings("ignore", message=".*non-writable.*")
    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, _on_signal)

    tmp = tempfile.mkdtemp(prefix="dp-benchpy.")
    procs = Procs(tmp)
    c = kv = r = None
    results = {}
    try:
        say(f"### dataplane {dataplane.version()} from {pkg}; python {sys.version.split()[0]}, "
            f"torch {torch.__version__} ({torch.get_num_threads()} threads), "
            f"{os.cpu_count()} CPUs")
        say(f"### dataplane up: 2 units, slab {a.slab} each, in {tmp}/cluster")
        cluster = procs.start_cluster(cli, a.slab)
        if not a.no_redis:
            import redis
            r = procs.start_redis()
            parser = "hiredis" if getattr(redis.utils, "HIREDIS_AVAILABLE", False) else "python"
            say(f"### redis-server {r.info('server').get('redis_version')} on 127.0.0.1:"
                f"{procs.redis_port}; redis-py {redis.__version__} ({parser} parser)")
        c = dataplane.Client(cluster)
        kv = DataplaneKVClient({"cluster": cluster})

        for name in a.shape_list:
            rows, fields, nbytes = SHAPES[name]
            shape = SHAPES[name]
            batch = rows * fields * nbytes
            fnames = [f"f{i}" for i in range(fields)]
            gen = torch.Generator().manual_seed(1234)
            src = {f: torch.rand(rows, nbytes // 4, generator=gen) for f in fnames}
            steps = {
                "client": make_client_step(c, src, fnames, rows),
                "client_out": make_client_out_step(c, src, fnames, rows),
                "client_alloc": make_client_alloc_step(c, src, fnames, rows),
                "client_stack": make_client_stack_step(c, src, fnames, rows),
                "client_alloc_stack": make_client_alloc_step(c, src, fnames, rows, True),
                "tq": make_tq_step(kv, src, fnames, rows),
                "tq_flat": make_tq_step(kv, src, fnames, rows, flat=True),
                "torch": make_torch_step(src, fnames),
            }
            if r is not None:
                steps["redis"] = make_redis_step(r, src, fnames, rows)
            steps = {m: st for m, st in steps.items() if m in a.method_list}
            per_round = {}
            for k in range(1, a.reps + 1):
                line = []
                # dataplane's Python methods take turns; the references (torch,
                # Redis) run alone, as the C library does: a torch clone's
                # fresh 16 MiB per iteration slowed the Client rows beside it
                dp = {m: st for m, st in steps.items() if m not in ALONE}
                got = run_py(dp, a.iters, a.warmup, batch) if dp else {}
                for mid, label, _ in METHODS:
                    if mid not in a.method_list:
                        continue
                    if mid in ALONE and mid in steps:
                        got.update(run_py({mid: steps[mid]}, a.iters, a.warmup, batch))
                    if mid.startswith("c_"):
                        res = run_c(cli, cluster, mid[2:], rows, fields, nbytes, a.iters,
                                    max(a.warmup, 1), tmp)
                    elif mid in got:
                        res = got[mid]
                    else:
                        continue
                    per_round.setdefault(mid, []).append(res)
                    line.append(f"{label} {_f(res[0], 2)}/{_f(res[1], 2)}")
                say(f"### {name} round {k}/{a.reps} (put/get GB/s): " + "; ".join(line))
            med = {m: (_med([x[0] for x in rs]), _med([x[1] for x in rs]))
                   for m, rs in per_round.items()}
            spread = {m: _spread(rs) for m, rs in per_round.items()}
            report(name, shape, med, spread, per_round)
            results[name] = {"shape": {"rows": rows, "fields": fields, "bytes": nbytes},
                             "rounds": {m: rs for m, rs in per_round.items()},
                             "median": med}
            del steps, src

        say("")
        say(NOTES.format(reps=a.reps, iters=a.iters, warmup=a.warmup))
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"args": vars(a), "results": results}, f, indent=1)
        return 0
    except Stop as e:
        print(f"bench_py: stopped by {e}", file=sys.stderr)
        return e.status
    except KeyboardInterrupt:
        print("bench_py: interrupted", file=sys.stderr)
        return 130
    finally:
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, signal.SIG_IGN)  # clean up without being cut short
        for x in (kv, c):
            if x is not None:
                try:
                    x.close()
                except Exception as e:
                    print(f"bench_py: close: {e}", file=sys.stderr)
        if r is not None:
            try:
                r.close()
            except Exception:
                pass
        procs.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
