"""One-sided transfers between two processes: NIXL against dataplane's
endpoint and its direct transport, at 4 KiB, 64 KiB, 1 MiB and 64 MiB, in
one run.

Each side runs as its own pair of processes (an initiator and a target
holding numpy arrays in plain DRAM): NIXL bundles its own UCX (1.23), which
cannot share a process with the system's UCX (1.13) that dataplane uses.
NIXL: two agents with the UCX backend, memory registered once, one transfer
handle per size re-posted (`transfer`, polled with `check_xfer_state`), READ
and WRITE. dataplane's endpoint (what units and clients move bytes with):
bench/bench_xfer, two processes with registered memory, one blocking
single-range WRITE or READ per sample (the WRITE includes the flush that
makes it visible), every one at offset 0 (--hot: as NIXL re-posts one
handle on one buffer), the target serving two-sided transfers as a unit
does (--two-sided: over TCP the ops go as messages, on one host by the
memcpy path), medians; each size's bytes written, read back and
compared. dataplane's direct transport: the target publishes each array
once (`Transport.publish`), the initiator fetches it into a registered array
(`fetch(out=)` + `wait`: a control round trip to the publisher, then a READ;
it has no WRITE). NIXL's and the direct transport's bytes are checked
(CRC32) after each size's timed transfers. Twice: with each UCX choosing its
transports, then with UCX_TLS=tcp for both. Run by bench/peers/run.sh;
asserts no timing.

    PYTHONPATH=build/python bench/peers/.venv/bin/python bench/peers/nixl_xfer.py \
        [--build build]
"""

import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import time
import zlib

import numpy as np

KiB, MiB = 1 << 10, 1 << 20
SIZES = [4 * KiB, 64 * KiB, MiB, 64 * MiB]


def reps_for(size):
    return max(10, min(1000, (256 * MiB) // size))


def pattern(size):
    return np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)


def fmt_size(n):
    return f"{n // MiB} MiB" if n >= MiB else f"{n // KiB} KiB"


# --------------------------------------------------------------------- NIXL --

def nixl_agent(name):
    os.environ.setdefault("UCX_MODULES", "^ib")  # else its bundled libnl crashes at exit
    from nixl_cu12._api import nixl_agent as agent, nixl_agent_config
    return agent(name, nixl_agent_config(enable_prog_thread=True, enable_listen_thread=False,
                                         backends=["UCX"]))


def nixl_target(conn):
    ag = nixl_agent("target")
    bufs = {s: pattern(s) for s in SIZES}
    reg = ag.register_memory([(b.ctypes.data, b.nbytes, 0, "") for b in bufs.values()], "DRAM")
    descs = {s: ag.get_serialized_descs(ag.get_xfer_descs([(b.ctypes.data, b.nbytes, 0)],
                                                          "DRAM"))
             for s, b in bufs.items()}
    conn.send((ag.get_agent_metadata(), descs))
    for s in SIZES:  # after each size's WRITEs: the CRC of what landed here
        conn.recv()
        conn.send(zlib.crc32(bufs[s]))
    conn.recv()
    ag.deregister_memory(reg)


def nixl_initiator(conn):
    ag = nixl_agent("initiator")
    meta, rdescs = conn.recv()
    remote = ag.add_remote_agent(meta)
    bufs = {s: np.zeros(s, dtype=np.uint8) for s in SIZES}
    reg = ag.register_memory([(b.ctypes.data, b.nbytes, 0, "") for b in bufs.values()], "DRAM")

    def run(h):
        st = ag.transfer(h)
        while st == "PROC":
            st = ag.check_xfer_state(h)
        if st != "DONE":
            raise RuntimeError(f"NIXL transfer ended {st}")

    out = {}
    for s in SIZES:
        b = bufs[s]
        local = ag.get_xfer_descs([(b.ctypes.data, b.nbytes, 0)], "DRAM")
        rd = ag.deserialize_descs(rdescs[s])
        for op in ("READ", "WRITE"):
            if op == "WRITE":
                b[:] = pattern(s)[::-1]
            h = ag.initialize_xfer(op, local, rd, remote, op[0].encode())
            run(h)  # warm-up: the connection is made here
            ts = []
            for _ in range(reps_for(s)):
                t0 = time.perf_counter()
                run(h)
                ts.append(time.perf_counter() - t0)
            ag.release_xfer_handle(h)
            if op == "READ" and zlib.crc32(b) != zlib.crc32(pattern(s)):
                raise SystemExit(f"NIXL READ of {s} bytes: the bytes read differ (CRC32)")
            out[f"{s} {op}"] = statistics.median(ts)
        conn.send("check")
        if conn.recv() != zlib.crc32(pattern(s)[::-1].copy()):
            raise SystemExit(f"NIXL WRITE of {s} bytes: the target holds other bytes (CRC32)")
    conn.send("bye")
    ag.deregister_memory(reg)
    ag.remove_remote_agent(remote)
    return out


# ---------------------------------------------------------------- dataplane --

def dp_target(conn):
    import dataplane
    t = dataplane.Transport()
    bufs = {s: pattern(s) for s in SIZES}
    conn.send({s: t.publish(f"s{s}", [b]) for s, b in bufs.items()})
    conn.recv()
    for s in SIZES:
        t.free(f"s{s}")
    t.close()


def dp_initiator(conn):
    import dataplane
    t = dataplane.Transport()
    mds = conn.recv()
    out = {}
    for s in SIZES:
        b = np.zeros(s, dtype=np.uint8)
        t.register(b)
        t.fetch(f"s{s}", mds[s], out=[b]).wait(60)  # warm-up: the connection is made here
        ts = []
        for _ in range(reps_for(s)):
            t0 = time.perf_counter()
            t.fetch(f"s{s}", mds[s], out=[b]).wait(60)
            ts.append(time.perf_counter() - t0)
        if zlib.crc32(b) != zlib.crc32(pattern(s)):
            raise SystemExit(f"dataplane READ of {s} bytes: the bytes read differ (CRC32)")
        t.deregister(b)
        out[f"{s} READ"] = statistics.median(ts)
    conn.send("bye")
    return out


def endpoint(build, env):
    """bench_xfer's single-transfer latencies: {"SIZE WRITE": s, "SIZE READ": s}."""
    exe = os.path.join(build, "bench", "bench_xfer")
    if not os.access(exe, os.X_OK):
        raise SystemExit(f"nixl_xfer: no {exe}: build first (make build)")
    r = subprocess.run([exe, "--sizes", ",".join(str(s) for s in SIZES), "--reps", "5",
                        "--min-mib", "256", "--buf", "512", "--hot", "--two-sided"], env=env, stdout=subprocess.PIPE,
                       text=True)
    if r.returncode != 0:
        raise SystemExit(f"nixl_xfer: bench_xfer failed (status {r.returncode})")
    out = {}
    for line in r.stdout.splitlines():
        f = line.split()
        if f and f[0] == "RESULT":
            out[f"{f[1]} WRITE"] = float(f[4]) / 1e6
            out[f"{f[1]} READ"] = float(f[5]) / 1e6
    if len(out) != 2 * len(SIZES):
        raise SystemExit(f"nixl_xfer: bench_xfer printed {len(out) // 2} sizes of "
                         f"{len(SIZES)}:\n{r.stdout}")
    return out


def pair(impl):
    """Run impl's target in a child process and its initiator here."""
    target, initiator = {"nixl": (nixl_target, nixl_initiator),
                         "dataplane": (dp_target, dp_initiator)}[impl]
    ctx = mp.get_context("spawn")
    a, b = ctx.Pipe()
    p = ctx.Process(target=target, args=(b,), daemon=True)
    p.start()
    try:
        if not a.poll(60):
            raise SystemExit(f"{impl} target did not start")
        return initiator(a)
    finally:
        p.join(30)
        if p.is_alive():
            p.kill()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", choices=["nixl", "dataplane"], help=argparse.SUPPRESS)
    ap.add_argument("--build", default=os.environ.get("DP_BUILD", "build"),
                    help="the build tree with bench/bench_xfer (default $DP_BUILD or build)")
    a = ap.parse_args()
    if a.pair:  # one side's pair, in a process of its own: JSON on stdout
        print(json.dumps(pair(a.pair)))
        return
    results = {}
    for tls in (None, "tcp"):
        env = dict(os.environ)
        if tls:
            env["UCX_TLS"] = tls
        for impl in ("nixl", "dataplane"):
            r = subprocess.run([sys.executable, os.path.abspath(__file__), "--pair", impl],
                               env=env, stdout=subprocess.PIPE, text=True)
            if r.returncode != 0:
                print(f"nixl_xfer: the {impl} pair failed (status {r.returncode}; its "
                      f"messages above)", file=sys.stderr)
                sys.exit(1)
            results[(tls or "default", impl)] = json.loads(r.stdout.strip().splitlines()[-1])
        results[(tls or "default", "endpoint")] = endpoint(a.build, env)
    print("## one-sided transfers between two processes, medians of one blocking transfer; "
          "bytes checked")
    print("| UCX_TLS | size | NIXL WRITE us | endpoint WRITE us | NIXL READ us | "
          "endpoint READ us | direct fetch us | endpoint / NIXL WRITE | endpoint / NIXL "
          "READ | direct / NIXL READ |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for tls in ("default", "tcp"):
        n, d = results[(tls, "nixl")], results[(tls, "dataplane")]
        e = results[(tls, "endpoint")]
        for s in SIZES:
            nr, nw, dr = n[f"{s} READ"], n[f"{s} WRITE"], d[f"{s} READ"]
            er, ew = e[f"{s} READ"], e[f"{s} WRITE"]
            print(f"| {tls} | {fmt_size(s)} | {nw * 1e6:.1f} | {ew * 1e6:.1f} | "
                  f"{nr * 1e6:.1f} | {er * 1e6:.1f} | {dr * 1e6:.1f} | {nw / ew:.2f}x | "
                  f"{nr / er:.2f}x | {nr / dr:.2f}x |")
    print("(x: the peer's time over dataplane's, above 1 = dataplane faster; the endpoint "
          "runs on the system's UCX 1.13, NIXL on its bundled 1.23)")


if __name__ == "__main__":
    main()
