#!/usr/bin/python3
"""What each value costs beyond its bytes, from callgrind's counts
(bench/pervalue.sh runs the programs; this reads their outputs).

    pervalue.py VALUES ITERS_A ITERS_B CLIENT_A CLIENT_B UNITS_A UNITS_B

CLIENT_A/B: callgrind outputs of `dataplane bench` with ITERS_A and ITERS_B
iterations (put + get + clear of VALUES values each); UNITS_A/B: comma-separated
dumps of every unit over the same two runs. The difference B - A is what
ITERS_B - ITERS_A iterations cost with the fixed costs (start, connect, exit)
taken out. Prints instructions per value, each side's total and split by
where they run (the project's source areas, libc's copies, other libc, ZMQ,
UCX, ...), and the client's put, get and clear inclusive of what they call.
"""

import collections
import re
import subprocess
import sys

LINE = re.compile(r"^\s*([\d,]+)\s+\(\s*[\d.]+%\)\s+(.*)$")

# (label, test on "file:function [object]") in order: the first that matches
AREAS = [
    ("memcpy and friends (the bytes)", lambda s: re.search(r"mem(cpy|move|set)|__memcpy|__memmove", s.split(" [")[0].split(":")[-1]) is not None),
    ("keys: format, parse, hash (src/blob/keys.c)", lambda s: "src/blob/keys.c" in s),
    ("blob index and layout (src/blob)", lambda s: "src/blob/" in s and "crc32c" not in s),
    ("CRC32C (src/blob/crc32c.c)", lambda s: "crc32c" in s),
    ("control messages: msgpack codec (src/wire)", lambda s: "src/wire/" in s),
    ("control transport (src/ctl)", lambda s: "src/ctl/" in s),
    ("client: put", lambda s: re.search(r"src/client/put(_build)?\.c", s) is not None),
    ("client: get", lambda s: re.search(r"src/client/(get|get_match|get_turns|values)\.c", s) is not None),
    ("client: fan-out, buffers, common", lambda s: "src/client/" in s),
    ("unit: request handling (handler.c, server.c)", lambda s: re.search(r"src/unit/(handler|server)\.c", s) is not None),
    ("unit: pins (pins.c)", lambda s: "src/unit/pins.c" in s),
    ("unit: rows, lookup, commit (rows.c, unit.c, rec.c)", lambda s: re.search(r"src/unit/(rows|unit|rec)\.c", s) is not None),
    ("unit: other (src/unit)", lambda s: "src/unit/" in s),
    ("slab allocator (src/alloc)", lambda s: "src/alloc/" in s),
    # dp__splitmix64 (src/common) is called only by the CLI: here the bench
    # tool's pattern fill of each value
    ("the bench tool itself (src/cli)", lambda s: "src/cli/" in s or ":dp__splitmix64" in s),
    ("maps, ranges, common (src/common)", lambda s: "src/common/" in s),
    ("data path: endpoint (src/xfer)", lambda s: "src/xfer/" in s),
    ("libc: malloc, locks, other", lambda s: "libc.so" in s or "ld-linux" in s),
    ("ZMQ (libzmq)", lambda s: "libzmq" in s),
    ("UCX (libucp, libuct, libucs)", lambda s: re.search(r"libuc[pts]|/ucx/", s) is not None),
    ("kernel-facing and other libraries", lambda s: True),
]


def annotate(path, inclusive=False):
    """{label: Ir} and the program total of one callgrind output."""
    out = subprocess.run(["callgrind_annotate", "--threshold=100", "--auto=no",
                          f"--inclusive={'yes' if inclusive else 'no'}", path],
                         capture_output=True, text=True, check=True).stdout
    costs, total = collections.Counter(), None
    for line in out.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        n, what = int(m.group(1).replace(",", "")), m.group(2).strip()
        if what.startswith("PROGRAM TOTALS"):
            total = n
        elif "file:function" not in what:
            costs[what] += n
    if total is not None and not inclusive:
        # A dump taken while a thread runs lists the functions at the bottom
        # of its stack (clone, start_thread) with the whole part's cost as
        # their own: they did nothing themselves.
        costs = collections.Counter({w: n for w, n in costs.items() if n < 0.99 * total})
    return costs, total or sum(costs.values())


def by_area(costs):
    out = collections.Counter()
    for what, n in costs.items():
        for label, test in AREAS:
            if test(what):
                out[label] += n
                break
    return out


def side(paths):
    costs, total = collections.Counter(), 0
    for p in paths:
        c, t = annotate(p)
        costs.update(c)
        total += t
    return costs, total


def main():
    values, ia, ib = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    ca, cb, ua, ub = sys.argv[4], sys.argv[5], sys.argv[6].split(","), sys.argv[7].split(",")
    per = values * (ib - ia)
    rows = []
    for name, a, b in (("client", [ca], [cb]), ("units", ua, ub)):
        (xa, ta), (xb, tb) = side(a), side(b)
        diff = by_area(xb)
        diff.subtract(by_area(xa))
        rows.append((name, (tb - ta) / per, diff))
    print(f"instructions per value (put + get + clear of {values} values per iteration, "
          f"{ib} - {ia} iterations):")
    for name, tot, _ in rows:
        print(f"  {name:7s} {tot:10.0f}")
    print(f"  {'total':7s} {sum(r[1] for r in rows):10.0f}")
    for name, tot, diff in rows:
        print(f"\n{name}, by where they run (instructions per value):")
        for label, n in sorted(diff.items(), key=lambda kv: -kv[1]):
            if abs(n / per) >= 1:
                print(f"  {n / per:9.0f}  {label}")
    for name, paths_a, paths_b in (("client", [ca], [cb]), ("units", ua, ub)):
        fa, fb = side(paths_a)[0], side(paths_b)[0]
        fb.subtract(fa)
        print(f"\n{name}: the functions that cost most (instructions per value):")
        for what, n in sorted(fb.items(), key=lambda kv: -kv[1])[:12]:
            where = what.split(" [")[0]
            print(f"  {n / per:9.0f}  {where.split('/')[-1]}")
    # the client's calls, inclusive of what they call
    (ia_c, _), (ib_c, _) = annotate(ca, True), annotate(cb, True)
    print("\nclient calls, inclusive (instructions per value):")
    for fn in ("dp_client_put_locs", "dp_client_get", "dp_client_clear"):
        a = sum(n for w, n in ia_c.items() if w.split(" [")[0].endswith(":" + fn))
        b = sum(n for w, n in ib_c.items() if w.split(" [")[0].endswith(":" + fn))
        print(f"  {(b - a) / per:9.0f}  {fn}")


if __name__ == "__main__":
    main()
