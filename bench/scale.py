#!/usr/bin/env python3
"""Many units, many clients, on this machine (bench/scale.sh runs it).

    scale.py BUILD_DIR [--units N (16)] [--clients M (32)] [--slab SIZE (32M)]
                       [--bytes B (64K)] [--rounds R (3)] [--timeout S (60)]
                       [--hosts]

Starts `dataplane up --units N` and M client processes (dp_longclient, one
long-lived client each, driven through its stdin) spawned back to back, so
that they open the cluster at about the same moment. Each client puts and
gets a batch of N rows (one per unit: the batch touches every unit) of B
bytes, its own rows, every byte checked by the client; then R more rounds,
all clients at once. While every client is connected it samples each unit
process and each client process (/proc: resident memory, descriptors,
threads) and counts the TCP connections to the units' control ports (`ss`).
Then the clients quit, and the units are sampled again. The same batch from
one client on a 2-unit cluster is the reference for the steady batch time.
--hosts: three network-namespace hosts (bench/peers/netns.py; root): the
units in host 0, the clients alternately in hosts 1 and 2, each with its own
IPC, PID and UTS namespaces, so UCX takes the units for other machines
(TCP). Prints one report; needs only the standard library. Timings are
shown, never asserted.
"""

import argparse
import json
import os
import selectors
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time


def die(msg):
    print(f"scale: {msg}", file=sys.stderr)
    sys.exit(1)


def size(s):
    m = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * m[s[-1].upper()] if s[-1].upper() in m else int(s)


def proc(pid):
    """(private resident kB, descriptors, threads, resident kB with shared
    memory) of a process; None when gone. Private (RssAnon) is what a
    connection costs; the total also counts the pages of units' slabs a
    client has mapped and touched, which are the units' memory."""
    try:
        rss = anon = thr = 0
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
            elif line.startswith("RssAnon:"):
                anon = int(line.split()[1])
            elif line.startswith("Threads:"):
                thr = int(line.split()[1])
        return anon, len(os.listdir(f"/proc/{pid}/fd")), thr, rss
    except OSError:
        return None


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))]


# --hosts: the command prefixes of the units' host and of client k's host,
# and the netns of the units (for ss); none on one host
HOSTS = None


def unit_wrap():
    return ["ip", "netns", "exec", HOSTS.hosts[0]] if HOSTS else []


def client_wrap(k):
    return HOSTS.wrap(HOSTS.hosts[1 + k % 2]) if HOSTS else []


def real_pid(p):
    """The client process itself: under --hosts, the child of the unshare
    that Popen started (ip netns exec execs it in place)."""
    if not HOSTS:
        return p.pid
    try:
        kids = open(f"/proc/{p.pid}/task/{p.pid}/children").read().split()
        return int(kids[0]) if kids else p.pid
    except OSError:
        return p.pid


class Cluster:
    def __init__(self, cli, n, slab, tmp):
        self.dir = os.path.join(tmp, f"c{n}")
        self.log = open(os.path.join(tmp, f"up{n}.log"), "w")
        bind = ["--bind", HOSTS.addrs[0]] if HOSTS else []
        self.p = subprocess.Popen(unit_wrap() + [cli, "up", "--units", str(n), "--slab", slab,
                                                 "--dir", self.dir] + bind,
                                  stdout=self.log, stderr=subprocess.STDOUT,
                                  start_new_session=True)
        f = os.path.join(self.dir, "cluster.json")
        t_end = time.time() + 60 + n
        try:
            while not os.path.exists(f):
                if self.p.poll() is not None or time.time() > t_end:
                    die(f"dataplane up --units {n} did not start (see {self.log.name})")
                time.sleep(0.05)
            units = json.load(open(f))["units"]
            self.pids = [u["pid"] for u in units]
            self.ports = [int(u["zmq"].rsplit(":", 1)[1]) for u in units]
        except BaseException:
            self.stop()  # never leave the cluster running behind an error
            raise

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.p.pid, signal.SIGKILL)
                self.p.wait()


class Clients:
    """M dp_longclient processes; ask() sends one command to each and waits
    for every answer."""

    def __init__(self, lc, cluster_dir, m, timeout_s):
        self.ps, self.spawned = [], []
        t0 = time.time()
        for k in range(m):
            self.ps.append(subprocess.Popen(
                client_wrap(k) + [lc, "--cluster", cluster_dir, "--timeout", str(timeout_s)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                text=True, bufsize=1))
            self.spawned.append(time.time())
        self.spread = self.spawned[-1] - t0
        self.timeout_s = timeout_s
        self.ready = self._lines(timeout_s + 60)  # "ready T units=N" or "err ..."
        self.open_wall = [t - s for (t, _), s in zip(self.ready, self.spawned)]

    def _lines(self, wait_s, ps=None):
        ps = self.ps if ps is None else ps
        sel = selectors.DefaultSelector()
        for i, p in enumerate(ps):
            sel.register(p.stdout, selectors.EVENT_READ, i)
        out = [None] * len(ps)
        left, t_end = len(ps), time.time() + wait_s
        while left:
            ev = sel.select(timeout=max(0.0, t_end - time.time()))
            if not ev:
                die(f"{left} of {len(ps)} clients did not answer within {wait_s:.0f} s")
            for key, _ in ev:
                line = key.fileobj.readline()
                out[key.data] = (time.time(), line.strip() or "err 0 (exited)")
                sel.unregister(key.fileobj)
                left -= 1
        return out

    def ask(self, cmds):
        """cmds[k] to client k (the first len(cmds) clients): each one's (answer,
        seconds from the send of its command to its answer)."""
        ps, sent = self.ps[:len(cmds)], []
        for p, c in zip(ps, cmds):
            p.stdin.write(c + "\n")
            p.stdin.flush()
            sent.append(time.time())
        return [(line, t - s) for (t, line), s in zip(self._lines(self.timeout_s + 60, ps), sent)]

    def quit(self, keep=0):
        """Every client but the first keep ones quits."""
        for p in self.ps[keep:]:
            try:
                p.stdin.write("quit\n")
                p.stdin.flush()
            except OSError:
                pass
        for p in self.ps[keep:]:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


def elapsed(answers, what):
    """The seconds each answer took, as this process saw it (the client's own
    figure has millisecond resolution); every answer must be ok."""
    bad = [a for a, _ in answers if not a.startswith("ok ")]
    if bad:
        die(f"{len(bad)} of {len(answers)} {what} failed; first: {bad[0][:400]}")
    return [w for _, w in answers]


def batches(cl, m, n, nbytes, rounds, seed0):
    """First put+get of every client, then `rounds` more; seconds per client."""
    rows = lambda k: f"{k * n} {n} {nbytes}"  # noqa: E731: client k's rows
    first_put = elapsed(cl.ask([f"put {rows(k)} {seed0 + k}" for k in range(m)]), "first puts")
    first_get = elapsed(cl.ask([f"get {rows(k)} {seed0 + k}" for k in range(m)]), "first gets")
    steady = []
    for r in range(1, rounds + 1):
        p = elapsed(cl.ask([f"put {rows(k)} {seed0 + 1000 * r + k}" for k in range(m)]), "puts")
        g = elapsed(cl.ask([f"get {rows(k)} {seed0 + 1000 * r + k}" for k in range(m)]), "gets")
        steady += [a + b for a, b in zip(p, g)]
    return [a + b for a, b in zip(first_put, first_get)], steady


def established(ports):
    """TCP connections to the units' control ports, as the units' side sees them."""
    if shutil.which("ss") is None:
        return None
    out = subprocess.run(unit_wrap() + ["ss", "-Htn", "state", "established"],
                         capture_output=True, text=True).stdout
    ps = {str(p) for p in ports}
    n = 0
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 4 and f[2].rsplit(":", 1)[-1] in ps:
            n += 1
    return n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("build")
    ap.add_argument("--units", type=int, default=16)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--slab", default="32M")
    ap.add_argument("--bytes", default="64K")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--hosts", action="store_true")
    a = ap.parse_args()
    global HOSTS
    if a.hosts:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers"))
        from netns import Hosts

        HOSTS = Hosts(3)
        HOSTS.up()
    try:
        run(a)
    finally:
        if HOSTS:
            HOSTS.down()


def run(a):
    cli = os.path.join(a.build, "dataplane")
    lc = os.path.join(a.build, "tests", "dp_longclient")
    for f in (cli, lc):
        if not os.access(f, os.X_OK):
            die(f"no {f}: build first (make)")
    n, m, nbytes = a.units, a.clients, size(a.bytes)
    if 3 * m * nbytes > size(a.slab):
        die(f"each unit holds a row of {a.bytes} per client, and an overwrite lands before the "
            f"old value goes: {m} clients need --slab of at least {3 * m * nbytes >> 20} MiB")
    tmp = tempfile.mkdtemp(prefix="dp-scale-")
    where = ("units in host 0, clients in hosts 1 and 2 (network namespaces: TCP)"
             if HOSTS else "one host")
    print(f"### {n} units (slab {a.slab}) x {m} clients, {where}; a batch: {n} rows x {a.bytes} "
          f"per client (one row per unit), {a.rounds} rounds after the first")
    clusters, clients = [], []
    try:
        # the reference: one client, 2 units, the same batch
        ref_c = Cluster(cli, 2, f"{max(size(a.slab), 3 * n * nbytes) >> 20}M", tmp)
        clusters.append(ref_c)
        ref = Clients(lc, ref_c.dir, 1, a.timeout)
        clients.append(ref)
        _, ref_steady = batches(ref, 1, n, nbytes, max(a.rounds, 3), 1)
        ref_proc = proc(real_pid(ref.ps[0]))
        ref.quit()
        ref_c.stop()

        c = Cluster(cli, n, a.slab, tmp)
        clusters.append(c)
        time.sleep(0.5)
        before = [proc(p) for p in c.pids]
        t0 = time.time()
        cl = Clients(lc, c.dir, m, a.timeout)
        clients.append(cl)
        t_open = time.time() - t0
        bad = [line for _, line in cl.ready if not line.startswith("ready ")]
        if bad:
            die(f"{len(bad)} of {m} clients failed to open; first: {bad[0][:400]}")
        opens = [float(line.split()[1]) for _, line in cl.ready]
        first, steady = batches(cl, m, n, nbytes, a.rounds, 7)
        # the first client alone on the N units: the same batch as the reference's
        _, alone = batches(cl, 1, n, nbytes, max(a.rounds, 3), 5000)
        during = [proc(p) for p in c.pids]
        cps = [proc(real_pid(p)) for p in cl.ps]
        conns = established(c.ports)
        # the same client alone again once the others have gone: does a
        # unit's request path grow with the clients it holds?
        cl.quit(keep=1)
        _, alone_after = batches(cl, 1, n, nbytes, max(a.rounds, 3), 9000)
        cl.quit()
        time.sleep(12)  # units give freed heap back every 10 s
        after = [proc(p) for p in c.pids]
    finally:
        for x in clients:
            for p in x.ps:
                if p.poll() is None:
                    p.kill()
        for x in clusters:
            x.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    def per(i, div):
        return statistics.median((d[i] - b[i]) / div for b, d in zip(before, during))

    ms = lambda v: f"{1e3 * v:.1f}"  # noqa: E731
    print(f"open (library call, each client): p50 {ms(pct(opens, 50))} ms, p99 {ms(pct(opens, 99))} ms,"
          f" max {ms(max(opens))} ms; spawn to ready: max {ms(max(cl.open_wall))} ms"
          f" (the {m} spawns took {ms(cl.spread)} ms); all open after {t_open:.2f} s")
    print(f"first batch (put + get, all clients at once): p50 {ms(pct(first, 50))} ms,"
          f" max {ms(max(first))} ms")
    s50, r50, a50, b50 = (statistics.median(x) for x in (steady, ref_steady, alone, alone_after))
    print(f"steady batch (put + get) of one client alone: {ms(a50)} ms on {n} units with the"
          f" other {m - 1} clients connected and idle, {ms(b50)} ms once they quit"
          f" ({a50 / b50:.2f}x), {ms(r50)} ms on 2 units ({a50 / r50:.2f}x / {b50 / r50:.2f}x);"
          f" all {m} clients at once: p50 {ms(s50)} ms ({m} clients on 2 cores)")
    print(f"per unit, per connected client (median over units): private memory "
          f"{per(0, m):.0f} kB, descriptors {per(1, m):.2f}, threads {per(2, m):.2f}")
    names = ("private_kB", "fds", "threads", "rss_kB")
    print("per unit before / with clients / 12 s after they quit (median): "
          + ", ".join(f"{k} {statistics.median(x[i] for x in before):.0f} / "
                      f"{statistics.median(x[i] for x in during):.0f} / "
                      f"{statistics.median(x[i] for x in after if x):.0f}"
                      for i, k in enumerate(names)))
    print("per client (median): " + ", ".join(
        f"{k} {statistics.median(x[i] for x in cps if x):.0f}"
        for i, k in enumerate(names))
          + (f"; per unit beyond the first 2 (against the client of the 2-unit reference): "
             f"descriptors {(statistics.median(x[1] for x in cps if x) - ref_proc[1]) / (n - 2):.2f}, "
             f"threads {(statistics.median(x[2] for x in cps if x) - ref_proc[2]) / (n - 2):.2f}, "
             f"private memory {(statistics.median(x[0] for x in cps if x) - ref_proc[0]) / (n - 2):.0f} kB"
             if n > 2 and ref_proc else ""))
    if conns is not None:
        print(f"TCP connections to the units' control ports: {conns} ({conns / (n * m):.2f} per"
              f" client-unit pair); data: "
              + ("UCX over TCP (its own connections)" if HOSTS else "UCX over shared memory"))
    print("content: every value each client got back was checked by it (dp_longclient get)")


if __name__ == "__main__":
    main()
