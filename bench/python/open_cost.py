#!/usr/bin/python3
"""What opening a client costs, and what its first puts pay for it, under
each DP_PREFAULT mode (issue 17).

Starts `dataplane up` (2 units, --slab each, 1G) once; then per mode, in a
fresh child process per round (a client's mappings are per process): the
time of dataplane.Client(cluster), then the times of its first three puts of
64 x 1 MiB from registered memory (alloc()), then the median of ten more.
Rounds take turns between the modes; medians per mode are printed.

  /usr/bin/python3 bench/python/open_cost.py [--build build] [--rounds 3]
      [--slab 1G] [--modes touch,open,background,off]

Timings are shown, never asserted.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

from local_cluster import local_cluster

CHILD = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
import dataplane, torch
t0 = time.perf_counter()
c = dataplane.Client(sys.argv[2], timeout_s=60)
t_open = time.perf_counter() - t0
buf = c.alloc(64 << 20)
t = torch.frombuffer(buf, dtype=torch.uint8).view(64, 1 << 20)
t.fill_(7)
rows = list(range(64))
puts = []
for i in range(13):
    t0 = time.perf_counter()
    c.put(rows, {"v": t})
    puts.append(time.perf_counter() - t0)
    rows = [r + 64 for r in rows]  # new rows: the blobs land on fresh regions
c.clear(list(range(64 * 13)))
del t
c.close()
print(json.dumps({"open": t_open, "puts": puts}))
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--slab", default="1G")
    ap.add_argument("--modes", default="touch,open,background,off")
    a = ap.parse_args()
    modes = a.modes.split(",")
    for m in modes:
        if m not in ("touch", "open", "background", "off"):
            sys.exit(f"open_cost: unknown mode {m!r} (touch, open, background, off)")
    cli = os.path.join(a.build, "dataplane")
    if not os.access(cli, os.X_OK):
        sys.exit(f"open_cost: no {cli}: build first (make)")
    with local_cluster(cli, slab=a.slab, prog="open_cost") as cfile:
        res = {m: [] for m in modes}
        for r in range(a.rounds):
            for m in modes:
                env = dict(os.environ, DP_PREFAULT=m)
                out = subprocess.run([sys.executable, "-c", CHILD,
                                      os.path.join(a.build, "python"), cfile],
                                     env=env, capture_output=True, text=True, timeout=300)
                if out.returncode != 0:
                    sys.exit(f"open_cost: {m}: {out.stderr[-2000:]}")
                res[m].append(json.loads(out.stdout.strip().splitlines()[-1]))
        ms = 1e3
        print(f"{'DP_PREFAULT':<12} {'open ms':>8} {'put 1':>7} {'put 2':>7} {'put 3':>7} "
              f"{'later':>7}   (64 x 1 MiB from alloc() memory, ms; medians of "
              f"{a.rounds} processes)")
        for m in modes:
            o = statistics.median(x["open"] for x in res[m]) * ms
            p = [statistics.median(x["puts"][i] for x in res[m]) * ms for i in range(3)]
            later = statistics.median(statistics.median(x["puts"][3:]) for x in res[m]) * ms
            print(f"{m:<12} {o:8.1f} {p[0]:7.1f} {p[1]:7.1f} {p[2]:7.1f} {later:7.1f}")


if __name__ == "__main__":
    main()
