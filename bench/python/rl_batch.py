#!/usr/bin/python3
"""The RL-shaped batch of bench/bench_rl_batch.c, from Python (issue 17).

512 rows: input_ids (int64, 128..8192 tokens, jagged), logprobs (float32, the
same lengths), reward (a float32 scalar per row) and done (a bool scalar per
row), as torch tensors. Methods, each on a local 2-unit cluster started here
(`dataplane up`, stopped at the end):

  Client        Client.put(rows, {field: list of row tensors}) and
                Client.get(rows, fields)
  TQ adapter    dataplane.tq.DataplaneKVClient driven as TQ does (field-major
                keys, one value per key, get with shapes, dtypes and the
                per-key metadata put returned: location hints)
  torch copy    dst.copy_(src) of every row tensor into preallocated ones:
                the limit, measured in the same loop

Each iteration puts, gets (every value compared), clears (untimed). GB/s =
value bytes / op time, medians over the iterations.

  /usr/bin/python3 bench/python/rl_batch.py [--build build] [--iters 10]
      [--warmup 2] [--rows 512] [--seed 1]

Timings are shown, never asserted.
"""

import argparse
import os
import statistics
import sys
import time

from local_cluster import local_cluster

pc = time.perf_counter


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    if a.iters < 1 or a.rows < 1 or a.warmup < 0:
        sys.exit("rl_batch: --iters and --rows must be >= 1, --warmup >= 0")
    sys.path.insert(0, os.path.join(a.build, "python"))
    import torch
    import dataplane
    from dataplane.tq import DataplaneKVClient

    cli = os.path.join(a.build, "dataplane")
    if not os.access(cli, os.X_OK):
        sys.exit(f"rl_batch: no {cli}: build first (make)")
    g = torch.Generator().manual_seed(a.seed)
    lens = [int(x) for x in torch.randint(128, 8193, (a.rows,), generator=g)]
    batch = {
        "input_ids": [torch.randint(0, 150000, (k,), generator=g) for k in lens],
        "logprobs": [torch.randn(k, generator=g) for k in lens],
        "reward": torch.randn(a.rows, generator=g),
        "done": torch.rand(a.rows, generator=g) < 0.1,
    }
    nbytes = sum(t.numel() * t.element_size() for f in ("input_ids", "logprobs")
                 for t in batch[f]) + a.rows * (4 + 1)
    fields = sorted(batch)
    print(f"rl_batch: {a.rows} rows, {nbytes / 2**20:.2f} MiB per batch", flush=True)

    with local_cluster(cli, slab="1G", prog="rl_batch") as cfile:
        client = dataplane.Client(cfile, timeout_s=60)
        kv = DataplaneKVClient({"cluster": cfile, "timeout_s": 60})
        rows = list(range(a.rows))
        keys = [f"{r}@{f}" for f in fields for r in rows]
        values = []
        for f in fields:
            values.extend(batch[f])  # per-row values (0-d for the scalars)
        shapes = [tuple(v.shape) for v in values]
        dtypes = [v.dtype for v in values]
        dst = {f: [torch.empty_like(t) for t in batch[f]] for f in fields}
        res = {"Client": ([], []), "TQ adapter": ([], []), "torch copy": ([], [])}
        for it in range(a.warmup + a.iters):
            keep = it >= a.warmup
            t0 = pc()
            client.put(rows, batch)
            t1 = pc()
            got = client.get(rows, fields)
            t2 = pc()
            for f in fields:
                want = batch[f]
                for r in (0, a.rows // 2, a.rows - 1):
                    w = want[r]
                    if not torch.equal(got[f][r].reshape(w.shape), w):
                        sys.exit(f"rl_batch: Client get of {r}@{f} differs")
            del got
            client.clear(rows)
            t3 = pc()
            meta = kv.put(keys, values)
            t4 = pc()
            got = kv.get(keys, shapes=shapes, dtypes=dtypes, custom_backend_meta=meta)
            t5 = pc()
            for j in (0, len(keys) // 2, len(keys) - 1):
                if not torch.equal(got[j], values[j]):
                    sys.exit(f"rl_batch: TQ get of {keys[j]} differs")
            del got
            kv.clear(keys)
            t6 = pc()
            for f in fields:
                src = batch[f]
                for r in range(a.rows):
                    dst[f][r].copy_(src[r])
            t7 = pc()
            if keep:
                for name, p, q in (("Client", t1 - t0, t2 - t1),
                                   ("TQ adapter", t4 - t3, t5 - t4),
                                   ("torch copy", t7 - t6, t7 - t6)):
                    res[name][0].append(nbytes / p / 1e9)
                    res[name][1].append(nbytes / q / 1e9)
        lim = statistics.median(res["torch copy"][0])
        print(f"{'method':<12} {'put GB/s':>9} {'get GB/s':>9} {'put/copy':>9} "
              f"{'get/copy':>9}")
        for name, (p, q) in res.items():
            mp, mq = statistics.median(p), statistics.median(q)
            print(f"{name:<12} {mp:9.3f} {mq:9.3f} {mp / lim:9.2f} {mq / lim:9.2f}")
        print(f"(medians of {a.iters} iterations; torch copy: copy_ of every row "
              f"tensor into a preallocated one, the same bytes)")
        print(f"hint misses: {kv.client.counters()['loc_misses']}")
        kv.close()
        client.close()


if __name__ == "__main__":
    main()
