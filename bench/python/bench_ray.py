#!/usr/bin/env python3
"""The same tensors between two Ray actors on this machine, through Ray's
object store, Ray's Gloo tensor transport and dataplane's DATAPLANE tensor
transport (dataplane.ray.register_transport).

Transports (--transports, any of object,gloo,dataplane):

  object     the source method returns the tensors normally: they go through
             Ray's object store (serialized into it on the source, read out
             of it by the destination)
  gloo       @ray.method(tensor_transport="GLOO"): Ray sends the tensors from
             the source to the destination over a torch Gloo collective group
             made between the two actors here (skipped, with one line saying
             why, where the installed Ray cannot do it)
  dataplane  @ray.method(tensor_transport="DATAPLANE"): the source publishes
             the tensors, the destination READs them one-sided

Sizes (--sizes, comma separated): "S" is one float32 tensor of S bytes,
"NxS" a batch of N float32 tensors of S bytes each in one object (suffixes
K, M, G: KiB, MiB, GiB). Default: 4K,1M,64M,1000x4K.

One transfer, timed on the driver, is the whole round trip

    ray.get(dst.consume.remote(src.produce.remote(key), key))

The source made its tensors once (random values, one seed per size) and
returns the same ones each time (--fresh: a fresh copy each time, as a
producer making new tensors would); the destination checks every tensor's
size and an exact checksum (the sum of its 64-bit words) against the
ones the source computed when it made them, so a wrong byte is caught: that
is reported as an error and the run exits 1. Both sides run the same code
for every transport; only the source method's transport differs.

Per size: a warm-up round, then --reps rounds of N transfers each (more for
small sizes; --iters sets N), the transports taking turns round by round
(the order rotated every round). GB/s (1e9 B/s) = bytes moved / round time,
latency = round time / N, both the median over rounds; DATAPLANE / other is
the median of the per-round GB/s ratios (the rounds compared ran side by
side). Timings are shown, never asserted; the project's goals are printed
with whether this run met them.

    PYTHONPATH=build/python .venv/bin/python bench/python/bench_ray.py \\
        [--reps 5] [--sizes 4K,1M,64M,1000x4K] [--transports object,gloo,dataplane] \\
        [--iters N] [--fresh]
"""

import argparse
import datetime
import os
import platform
import shlex
import statistics
import sys
import time

try:
    import dataplane  # noqa: F401
except ImportError:  # run from the source tree without PYTHONPATH: the build's package
    _pkg = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "build", "python")
    _pkg = os.path.normpath(_pkg)
    sys.path.insert(0, _pkg)
    # the actors' processes inherit the driver's environment: they find it too
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (_pkg, os.environ.get("PYTHONPATH")) if p)
    import dataplane  # noqa: F401

import ray
import torch

import dataplane.ray as dpray

ALL = ("object", "gloo", "dataplane")
TIMEOUT_S = 120  # one transfer, at most
LABEL = {"object": "object store", "gloo": "Gloo", "dataplane": "DATAPLANE"}

# Ray checks a method's transport name when the class is defined, so
# DATAPLANE is registered here, before the actor classes below.
DATAPLANE = dpray.register_transport()

# GLOO is one of Ray's own transports (CPU tensors over torch.distributed's
# Gloo backend); an older Ray may not have it: then its method is left out.
try:
    from ray.experimental.rdt import util as _rdt_util
    _rdt_util._ensure_default_transports_registered()
    HAVE_GLOO = "GLOO" in _rdt_util.transport_manager_info
    NO_GLOO = "" if HAVE_GLOO else "this Ray has no GLOO tensor transport"
except Exception as e:  # noqa: BLE001
    HAVE_GLOO, NO_GLOO = False, f"this Ray's tensor transports cannot be listed: {e}"


def checksum(t):
    """Exact checksum of a float32 tensor's bytes: the sum, modulo 2**64, of
    its 64-bit words (of its 32-bit words, widened, when their number is
    odd). Any single wrong byte changes it, and no rounding hides one, unlike
    a float sum; it is also fast (a 64 MiB tensor in about 2 ms, where
    widening 32-bit words to int64 takes about 40), so it adds little to the
    time measured."""
    flat = t.reshape(-1)
    if flat.numel() % 2 == 0:
        try:
            return int(flat.view(torch.int64).sum())  # int64 sums wrap around
        except RuntimeError:  # memory not 8-byte aligned: the 32-bit way
            pass
    return int(flat.view(torch.int32).sum(dtype=torch.int64))


@ray.remote(num_cpus=0, enable_tensor_transport=True)
class Source:
    def __init__(self, fresh):
        self.fresh = fresh
        self.data = {}

    def setup(self, key, count, nbytes, seed):
        """Make the tensors of one size; returns (bytes, checksum) of each."""
        g = torch.Generator().manual_seed(seed)
        # separate tensors (not views of one buffer): what a batch of small
        # tensors made one by one looks like to each transport
        self.data[key] = [torch.randn(nbytes // 4, generator=g) for _ in range(count)]
        return [(t.numel() * t.element_size(), checksum(t)) for t in self.data[key]]

    def drop(self, key):
        self.data.pop(key, None)

    def _out(self, key):
        ts = self.data[key]
        return [t.clone() for t in ts] if self.fresh else ts

    # the same body three times: only the transport of the result differs
    def produce_object(self, key):
        return self._out(key)

    if HAVE_GLOO:
        @ray.method(tensor_transport="GLOO")
        def produce_gloo(self, key):
            return self._out(key)

    @ray.method(tensor_transport=DATAPLANE)
    def produce_dataplane(self, key):
        return self._out(key)


# consume takes its objects in a concurrency group of its own: on the main
# thread it can block Ray's receive of the very object it waits for (Ray
# 2.60 submits the receive after the task when the object is not made yet;
# docs/ray.md, "Take objects in a concurrency group of their own").
@ray.remote(num_cpus=0, enable_tensor_transport=True, concurrency_groups={"take": 1})
class Sink:
    def __init__(self):
        self.want = {}

    def expect(self, key, want):
        self.want[key] = want

    def drop(self, key):
        self.want.pop(key, None)

    @ray.method(concurrency_group="take")
    def consume(self, tensors, key):
        """None when every tensor arrived whole, else what is wrong."""
        want = self.want[key]
        if len(tensors) != len(want):
            return f"{len(tensors)} tensors arrived, {len(want)} were sent"
        for i, (t, (nbytes, csum)) in enumerate(zip(tensors, want)):
            if t.dtype != torch.float32 or t.numel() * 4 != nbytes:
                return (f"tensor {i}: {t.dtype} of {t.numel() * t.element_size()} bytes "
                        f"arrived, float32 of {nbytes} bytes was sent")
            got = checksum(t.contiguous())
            if got != csum:
                m = (1 << 64) - 1
                return f"tensor {i}: checksum {got & m:#x} arrived, {csum & m:#x} was sent"
        return None


class Mismatch(Exception):
    pass


def parse_bytes(s):
    s = s.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    n = int(s[:-1] if s[-1:] in "KMG" else s) * mult
    if n <= 0 or n % 4:
        raise ValueError(f"{s}: a positive multiple of 4 bytes is needed (float32)")
    return n


def human(n):
    for unit, m in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= m and n % m == 0:
            return f"{n // m} {unit}"
    return f"{n} B"


class Size:
    def __init__(self, spec):
        count, _, each = spec.strip().lower().rpartition("x")
        self.count = int(count) if count else 1
        self.each = parse_bytes(each)
        self.total = self.count * self.each
        self.key = spec.strip()
        self.name = (human(self.each) if self.count == 1
                     else f"{self.count} x {human(self.each)}")

    def iters(self):
        """Transfers per round: many for small ones, few for large ones, so
        that a round takes a similar time."""
        if self.count > 1:
            return 10
        if self.total <= 64 << 10:
            return 100
        if self.total <= 4 << 20:
            return 40
        return max(3, (512 << 20) // self.total)


def run_round(src, dst, transport, key, n):
    """n transfers one after the other; the seconds they took."""
    produce = getattr(src, f"produce_{transport}")
    t0 = time.perf_counter()
    for _ in range(n):
        # a timeout: a transfer that hangs is an error, not a stuck benchmark
        err = ray.get(dst.consume.remote(produce.remote(key), key), timeout=TIMEOUT_S)
        if err is not None:
            raise Mismatch(err)
    return time.perf_counter() - t0


def make_gloo_group(src, dst):
    """A Gloo collective group between the two actors (Ray's GLOO transport
    sends over it); None, or why it could not be made."""
    if not HAVE_GLOO:
        return NO_GLOO
    try:
        from ray.experimental.collective import create_collective_group
        create_collective_group([src, dst], backend="torch_gloo", name="bench-ray-gloo")
    except Exception as e:  # noqa: BLE001
        return f"no Gloo collective group between the actors: {type(e).__name__}: {e}"
    return None


def gb(x):
    """GB/s with three significant digits (small sizes move well under 1)."""
    return "-" if x is None else (f"{x:.3g}" if x < 1 else f"{x:.2f}")


def rx(r):
    return "-" if r is None else f"{r:.2f}x"


def med(xs):
    return statistics.median(xs) if xs else None


def fmt(x, spec, none="-"):
    return none if x is None else format(x, spec)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5, help="rounds per transport and size (5)")
    ap.add_argument("--sizes", default="4K,1M,64M,1000x4K",
                    help="S or NxS, comma separated (4K,1M,64M,1000x4K)")
    ap.add_argument("--transports", default=",".join(ALL),
                    help="any of object,gloo,dataplane (all)")
    ap.add_argument("--iters", type=int, default=0,
                    help="transfers per round (default: by size, 3 to 100)")
    ap.add_argument("--fresh", action="store_true",
                    help="the source returns a fresh copy of its tensors each time")
    args = ap.parse_args()
    try:
        sizes = [Size(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError as e:
        ap.error(f"--sizes: {e}")
    transports = [t.strip().lower() for t in args.transports.split(",") if t.strip()]
    bad = [t for t in transports if t not in ALL]
    if bad or not transports or not sizes or args.reps < 1:
        ap.error(f"--transports: any of {','.join(ALL)}; --sizes and --reps >= 1 needed"
                 + (f" (unknown: {','.join(bad)})" if bad else ""))

    t_start = time.monotonic()
    print("# " + " ".join(shlex.quote(a) for a in [sys.executable] + sys.argv))
    print(f"# {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M:%S} UTC on "
          f"{platform.node()}, {os.cpu_count()} CPUs, load average "
          + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    print(f"# python {platform.python_version()}, torch {torch.__version__} "
          f"({torch.get_num_threads()} threads), ray {ray.__version__}, dataplane "
          f"{dataplane.version()} from {os.path.dirname(dataplane.__file__)}")
    print(f"# source returns {'a fresh copy of' if args.fresh else 'the same'} tensors "
          f"each transfer; {args.reps} rounds per transport and size", flush=True)

    # Ray starts its own processes (the actors' workers inherit this
    # environment, PYTHONPATH included); the actors reserve no CPU
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
             logging_level="ERROR")
    rc = 0
    try:
        src, dst = Source.remote(args.fresh), Sink.remote()
        ray.get([src.__ray_ready__.remote(), dst.__ray_ready__.remote()])

        # every transport moves one small tensor first: one that cannot is
        # left out here (Gloo: with a line why; the others: an error). Wrong
        # bytes are an error whichever transport brought them.
        ray.get(dst.expect.remote("probe", ray.get(src.setup.remote("probe", 1, 4096, 0))))
        usable = []
        for t in transports:
            why = make_gloo_group(src, dst) if t == "gloo" else None
            wrong = False
            if why is None:
                try:
                    run_round(src, dst, t, "probe", 1)
                except Exception as e:  # noqa: BLE001
                    why = f"a first transfer failed: {type(e).__name__}: {str(e)[:500]}"
                    wrong = isinstance(e, Mismatch)
            if why is None:
                usable.append(t)
            elif t == "gloo" and not wrong:
                print(f"# gloo skipped: {why}", flush=True)
            else:
                print(f"ERROR: {LABEL[t]}: {why}", flush=True)
                rc = 1
        transports = usable
        ray.get([src.drop.remote("probe"), dst.drop.remote("probe")])
        if not transports:
            return 1
        print(f"# set up in {time.monotonic() - t_start:.1f} s; transports: "
              + ", ".join(LABEL[t] for t in transports), flush=True)

        # results[size key][transport] = seconds of each round that completed
        results, iters = {}, {}
        for i, size in enumerate(sizes):
            n = args.iters or size.iters()
            iters[size.key] = n
            want = ray.get(src.setup.remote(size.key, size.count, size.each, 1000 + i))
            ray.get(dst.expect.remote(size.key, want))
            rounds = {t: [] for t in transports}
            failed = set()

            def one(t, n_):
                try:
                    return run_round(src, dst, t, size.key, n_)
                except Exception as e:  # noqa: BLE001 (Mismatch or Ray's error)
                    print(f"ERROR: {LABEL[t]}, {size.name}: {type(e).__name__}: "
                          f"{str(e)[:500]}", flush=True)
                    failed.add(t)
                    return None

            for t in transports:  # warm-up, untimed
                one(t, min(n, 3))
            for r in range(args.reps):
                k = r % len(transports)  # rotate who goes first
                for t in transports[k:] + transports[:k]:
                    if t not in failed:
                        dt = one(t, n)
                        if dt is not None:
                            rounds[t].append(dt)
            if failed:
                rc = 1
            results[size.key] = rounds
            ray.get([src.drop.remote(size.key), dst.drop.remote(size.key)])
            print(f"\n## {size.name} ({human(size.total) if size.count > 1 else 'one tensor'}"
                  f"), {len(rounds[transports[0]]) if transports else 0} rounds x {n} transfers")
            print(f"  {'transport':<13} {'GB/s':>8} {'latency ms':>11}")
            for t in transports:
                if rounds[t]:
                    gbs = med([size.total * n / dt / 1e9 for dt in rounds[t]])
                    lat = med([dt / n * 1e3 for dt in rounds[t]])
                    print(f"  {LABEL[t]:<13} {gb(gbs):>8} {lat:>11.3f}")
                else:
                    print(f"  {LABEL[t]:<13} {'failed':>8}")
            print(f"  ({time.monotonic() - t_start:.0f} s so far, load "
                  f"{os.getloadavg()[0]:.2f})", flush=True)
    finally:
        ray.shutdown()

    # the summary: one row per size
    def stat(key, t):
        rs = results.get(key, {}).get(t) or []
        n = iters.get(key, 1)
        size = next(s for s in sizes if s.key == key)
        return (med([size.total * n / dt / 1e9 for dt in rs]) if rs else None,
                med([dt / n * 1e3 for dt in rs]) if rs else None)

    def ratio(key, other):
        """Median of the per-round GB/s ratios DATAPLANE / other (round r of
        each ran in the same turn, under the same load)."""
        rs = results.get(key, {})
        a, b = rs.get("dataplane") or [], rs.get(other) or []
        m = min(len(a), len(b))
        # same bytes per round: the GB/s ratio is the inverse time ratio
        return med([b[j] / a[j] for j in range(m)]) if m else None

    shown = [t for t in ALL if t in transports]
    print("\n## summary: GB/s (median over rounds), per-transfer latency in ms (median)\n")
    head = (["size"] + [f"{LABEL[t]} GB/s" for t in shown]
            + [f"{LABEL[t]} ms" for t in shown])
    if "dataplane" in shown:
        head += [f"DATAPLANE / {LABEL[t]}" for t in shown if t != "dataplane"]
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" if j == 0 else "---:" for j in range(len(head))) + "|")
    for size in sizes:
        if size.key not in results:
            continue
        st = {t: stat(size.key, t) for t in shown}
        row = ([size.name] + [gb(st[t][0]) for t in shown]
               + [fmt(st[t][1], ".3f") for t in shown])
        if "dataplane" in shown:
            row += [rx(ratio(size.key, t)) for t in shown if t != "dataplane"]
        print("| " + " | ".join(row) + " |")

    # the project's goals: shown, not asserted
    print("\n## goals (shown, not asserted)")
    big = [s for s in sizes if s.count == 1 and s.each == 64 << 20]
    if "dataplane" in transports and "object" in transports and big:
        r = ratio(big[0].key, "object")
        print(f"  DATAPLANE >= 2x the object store at 64 MiB: {rx(r)} -> "
              f"{'met' if r is not None and r >= 2 else 'NOT met'}")
    else:
        print("  DATAPLANE >= 2x the object store at 64 MiB: not measured")
    if "dataplane" in transports and "gloo" in transports:
        rs = {s.name: ratio(s.key, "gloo") for s in sizes if s.key in results}
        ok = all(r is not None and r > 1 for r in rs.values())
        print("  DATAPLANE ahead of Gloo at every size: "
              + ", ".join(f"{k} {rx(v)}" for k, v in rs.items())
              + f" -> {'met' if ok else 'NOT met'}")
    else:
        print("  DATAPLANE ahead of Gloo at every size: not measured (no Gloo in this run)")
    print(f"\n# {time.monotonic() - t_start:.0f} s; load average "
          + " ".join(f"{x:.2f}" for x in os.getloadavg())
          + (f"; errors above: exit {rc}" if rc else ""), flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
