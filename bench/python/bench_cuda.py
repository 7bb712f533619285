#!/usr/bin/env python3
"""CUDA tensors through dataplane.Client next to the limits measured in the
same run: what the staging pipeline (docs/design.md, "Device tensors") costs
over moving host tensors, and how much of the device copy it hides.

Shapes (float32 batch tensors, one field):

  large: 64 rows x 1 MiB      (64 MiB)
  small: 1024 rows x 16 KiB   (16 MiB)
  huge:  256 rows x 4 MiB     (1 GiB: 8 chunks through the ring of 2)

Methods, on one local 2-unit cluster started here (`dataplane up`):

  torch D2H / H2D   x.copy_() between the GPU and host memory of the batch's
                    size, pinned (the device copy alone, at the copy engine's
                    rate)
  host registered   Client.put / get(out=, stack=True) of a CPU batch in that
                    pinned memory, registered with client.register() (the
                    transfer alone, no copy)
  cuda              Client.put of the CUDA batch / get(out=CUDA batch)
  cuda serial       the same without overlap: the torch copy to the pinned
                    registered memory, then its put (get: the host get, then
                    the copy back)

overlap = (serial time - cuda time) / (the device copy's time): 1 when the
device copy is hidden behind the transfer completely, 0 when not at all.

Each method runs ITERS timed iterations after WARMUP (put, then get, then a
clear, untimed); a row shows the median of REPS rounds (methods take turns
within a round). GB/s = 1e9 B/s. Timings are shown, never asserted.

  python3 bench/python/bench_cuda.py [--build build] [--reps 5] [--iters 10]
      [--warmup 2] [--shapes large,small,huge]
"""

import argparse
import os
import statistics
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)

SHAPES = {"large": (64, 1 << 20), "small": (1024, 16 << 10), "huge": (256, 4 << 20)}
pc = time.perf_counter


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build", help="CMake build directory (default build)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--shapes", default="large,small,huge")
    ap.add_argument("--chunks", default="",
                    help="comma-separated chunk sizes in MiB to sweep (each chunk that "
                         "big; default: the package's own chunking only)")
    ap.add_argument("--slots", default="",
                    help="comma-separated ring sizes to sweep with --chunks "
                         "(default: the package's)")
    a = ap.parse_args()
    for k in ("reps", "iters"):
        if getattr(a, k) < 1:
            sys.exit(f"bench_cuda: --{k} must be >= 1")
    shapes = a.shapes.split(",")
    bad = [s for s in shapes if s not in SHAPES]
    if bad:
        sys.exit(f"bench_cuda: unknown shape(s) {bad}; known: {', '.join(SHAPES)}")
    try:
        a.chunks = [int(x) for x in a.chunks.split(",") if x]
        a.slots = [int(x) for x in a.slots.split(",") if x]
    except ValueError:
        sys.exit("bench_cuda: --chunks and --slots take comma-separated integers")
    if any(x < 1 for x in a.chunks + a.slots):
        sys.exit("bench_cuda: --chunks and --slots values must be >= 1")
    try:
        import torch
    except ImportError:
        sys.exit(f"bench_cuda: {sys.executable} has no torch (run it with a python3 whose "
                 f"torch has CUDA; scripts/bench.sh takes it from $PYTHON)")
    if not torch.cuda.is_available():
        sys.exit(f"bench_cuda: torch {torch.__version__} sees no CUDA device here (nothing "
                 f"to measure: it needs a GPU)")
    sys.path.insert(0, os.path.join(a.build, "python"))
    import dataplane
    from local_cluster import local_cluster

    cli = os.path.join(a.build, "dataplane")
    big = max(SHAPES[s][0] * SHAPES[s][1] for s in shapes)
    slab = f"{max(1, -(-3 * big // 2 // (1 << 30)))}G"  # half the batch per unit, with room
    print(f"bench_cuda: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"dataplane {dataplane.__version__}; 2 units of {slab}; {a.reps} rounds x "
          f"{a.iters} iterations", flush=True)
    with local_cluster(cli, slab=slab, prog="bench_cuda") as cfile, \
            dataplane.Client(cfile, timeout_s=120) as c:
        for shape in shapes:
            run_shape(torch, c, shape, a)


def run_shape(torch, c, shape, a):
    n, row = SHAPES[shape]
    nbytes = n * row
    rows = list(range(10_000_000, 10_000_000 + n))
    x = torch.randn(n, row // 4, device="cuda")
    xo = torch.empty_like(x)
    # host memory both pinned (the device copies run at the copy engine's
    # rate) and registered with the client (the transfers need no copy)
    hx = torch.empty(n, row // 4, pin_memory=True)
    ho = torch.empty(n, row // 4, pin_memory=True)
    c.register(hx)
    c.register(ho)
    hx.copy_(x)
    sync = torch.cuda.synchronize

    def d2h():
        hx.copy_(x, non_blocking=True)
        sync()

    def h2d():
        xo.copy_(ho, non_blocking=True)
        sync()

    def host_put():
        c.put(rows, {"x": hx})

    def host_get():
        c.get(rows, ["x"], out={"x": ho}, stack=True)

    def cuda_put():
        c.put(rows, {"x": x})

    def cuda_get():
        c.get(rows, ["x"], out={"x": xo}, stack=True)

    def serial_put():
        hx.copy_(x, non_blocking=True)
        sync()
        c.put(rows, {"x": hx})

    def serial_get():
        c.get(rows, ["x"], out={"x": ho}, stack=True)
        xo.copy_(ho, non_blocking=True)
        sync()

    methods = [("torch D2H / H2D", d2h, h2d, False), ("host registered", host_put, host_get, True),
               ("cuda", cuda_put, cuda_get, True), ("cuda serial", serial_put, serial_get, True)]
    res = {m[0]: ([], []) for m in methods}
    for _ in range(a.reps):
        for name, put, get, store in methods:
            tp = tg = 0.0
            for it in range(a.warmup + a.iters):
                t0 = pc()
                put()
                t1 = pc()
                get()
                t2 = pc()
                if store:
                    c.clear(rows)
                if it >= a.warmup:
                    tp += t1 - t0
                    tg += t2 - t1
            res[name][0].append(tp / a.iters)
            res[name][1].append(tg / a.iters)
    ok = torch.equal(xo, x)  # the last cuda serial get landed the batch
    cuda_put()
    xo.zero_()
    cuda_get()
    ok = ok and torch.equal(xo, x)
    c.clear(rows)
    med = {k: (statistics.median(p), statistics.median(g)) for k, (p, g) in res.items()}
    print(f"\n{shape}: {n} rows x {row >> 10} KiB = {nbytes / 2**20:.0f} MiB "
          f"(content {'checked' if ok else 'WRONG'})")
    print(f"  {'method':<18} {'put ms':>8} {'put GB/s':>9} {'get ms':>8} {'get GB/s':>9}")
    for k, (p, g) in med.items():
        print(f"  {k:<18} {p * 1e3:8.2f} {nbytes / p / 1e9:9.2f} {g * 1e3:8.2f} "
              f"{nbytes / g / 1e9:9.2f}")
    cp, cg = med["cuda"]
    hp, hg = med["host registered"]
    sp, sg = med["cuda serial"]
    dp, dg = med["torch D2H / H2D"]
    print(f"  cuda / host registered: put {hp / cp:.2f}x, get {hg / cg:.2f}x (rate ratios)")
    print(f"  cuda / cuda serial:     put {sp / cp:.2f}x, get {sg / cg:.2f}x")
    print(f"  overlap (of the device copy hidden): put {(sp - cp) / dp:.2f}, "
          f"get {(sg - cg) / dg:.2f}", flush=True)
    if a.chunks:
        sweep(c, a, nbytes, rows, x, xo, cuda_put, cuda_get, med)
    c.deregister(hx)
    c.deregister(ho)


def sweep(c, a, nbytes, rows, x, xo, cuda_put, cuda_get, med):
    """The cuda method again with every chunk size and ring size asked for."""
    from dataplane import _device

    keep = (_device.CHUNK_MIN, _device.CHUNK_MAX, _device.CHUNKS, _device.SLOTS)
    sp, sg = med["cuda serial"]
    print(f"  sweep: {'chunk MiB':>9} {'slots':>5} {'chunks':>6} {'put ms':>8} {'get ms':>8} "
          f"{'put/serial':>10} {'get/serial':>10}")
    try:
        for mib in a.chunks:
            for slots in a.slots or [keep[3]]:
                _device.CHUNK_MIN = _device.CHUNK_MAX = mib << 20
                _device.CHUNKS, _device.SLOTS = 1 << 30, slots
                ps, gs = [], []
                for _ in range(a.reps):
                    tp = tg = 0.0
                    for it in range(a.warmup + a.iters):
                        t0 = pc()
                        cuda_put()
                        t1 = pc()
                        cuda_get()
                        t2 = pc()
                        c.clear(rows)
                        if it >= a.warmup:
                            tp, tg = tp + t1 - t0, tg + t2 - t1
                    ps.append(tp / a.iters)
                    gs.append(tg / a.iters)
                p, g = statistics.median(ps), statistics.median(gs)
                k = len(_device.chunks(len(rows), nbytes))
                print(f"  sweep: {mib:9d} {slots:5d} {k:6d} {p * 1e3:8.2f} {g * 1e3:8.2f} "
                      f"{sp / p:9.2f}x {sg / g:9.2f}x", flush=True)
    finally:
        _device.CHUNK_MIN, _device.CHUNK_MAX, _device.CHUNKS, _device.SLOTS = keep


if __name__ == "__main__":
    main()
