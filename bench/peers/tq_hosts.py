"""TransferQueue's backends, dataplane's Client and Ray's object store across
two hosts: what is put on host 0 is got on host 1, over TCP.

Two network-namespace hosts (bench/peers/netns.py) and a Ray cluster of two
nodes, one per host: the head in host 0 (4 CPUs: TransferQueue's controller
and SimpleStorage's units run there), a node without CPUs in host 1 (its own
IPC and UTS namespaces, so UCX takes host 0 for another machine). In host 0
also: a 2-unit dataplane cluster, and Mooncake's master with one DRAM holder
(the TransferQueue clients mount no memory of their own, so Mooncake's values
live in host 0 as dataplane's do). bench/python/bench_tq.py then runs as the
driver in host 1 with the writer actor on host 0 and the reader on host 1:
every put is local to the storage, every get crosses the link (as a trainer
on one host reads what rollout workers on another wrote). Ray's object store
keeps the object where it was put (host 0) and the get pulls it to host 1.
Needs root. Run by bench/peers/run.sh; asserts no timing.

    PYTHONPATH=build/python bench/peers/.venv/bin/python bench/peers/tq_hosts.py \\
        --build build [--batch perftest|rl] [--reps 3] [--backends ...]
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

from mooncake_store import Procs, die, start_dataplane, start_mooncake
from netns import Hosts

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.environ.get("DP_BUILD", "build"))
    ap.add_argument("--batch", choices=("perftest", "rl"), default="perftest")
    ap.add_argument("--fields", type=int, default=9)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--backends",
                    default="SimpleStorage,MooncakeStore,Dataplane,Client,Ray,Ray0copy")
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    cli = os.path.join(build, "dataplane")
    if not os.access(cli, os.X_OK):
        die(f"no {cli}: build first", 2)
    ray_bin = shutil.which("ray", path=os.path.dirname(sys.executable))
    if ray_bin is None:
        die(f"no ray beside {sys.executable}: run through bench/peers/run.sh", 2)
    tmp = tempfile.mkdtemp(prefix="dp-tqhosts-")
    procs = Procs(tmp)
    hosts = Hosts()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(build, "python"), HERE,
                                         os.path.join(REPO, "bench", "python")])
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env["TQ_LOGGING_LEVEL"] = "ERROR"
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    # Ray turns token authentication on where ~/.ray/auth_token exists, and a
    # node joining then fails; the cluster lives in namespaces of this run
    env["RAY_AUTH_MODE"] = "disabled"
    h0 = ["ip", "netns", "exec", hosts.h0]  # shares this machine's IPC: shm to the units
    h1 = ["ip", "netns", "exec", hosts.h1, "unshare", "--ipc", "--uts"]
    port = 6379
    # Ray's files in directories of this run: a head's address left in
    # /tmp/ray/ray_current_cluster would be joined by the next ray.init()
    rc = 1
    try:
        hosts.up()
        cluster = start_dataplane(procs, cli, "1G", tmp, hosts.A0, h0)
        meta, master = start_mooncake(procs, 2 << 30, hosts.A0, h0)
        meta_hostport = meta.split("//", 1)[1].split("/", 1)[0]
        for cmd in ([*h0, ray_bin, "start", "--head", f"--node-ip-address={hosts.A0}",
                     f"--port={port}", "--num-cpus=4", '--resources={"host0": 100}',
                     "--include-dashboard=false", "--disable-usage-stats",
                     f"--temp-dir={tmp}/r0"],
                    [*h1, ray_bin, "start", f"--address={hosts.A0}:{port}",
                     f"--node-ip-address={hosts.A1}", "--num-cpus=0",
                     '--resources={"host1": 100}', "--disable-usage-stats",
                     f"--temp-dir={tmp}/r1"]):
            r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
            if r.returncode != 0:
                die(f"{' '.join(cmd[-8:])} failed:\n{r.stdout[-3000:]}")
        time.sleep(2)
        rc = subprocess.run(
            [*h1, sys.executable, os.path.join(REPO, "bench", "python", "bench_tq.py"),
             "--build", build, "--batch", a.batch, "--fields", str(a.fields), "--reps",
             str(a.reps), "--backends", a.backends, "--cluster", cluster,
             "--ray-address", f"{hosts.A0}:{port}", "--writer-resource", "host0",
             "--reader-resource", "host1", "--storage-resource", "host0", "--mooncake", f"{meta_hostport},{master}",
             "--mooncake-segment", "0"], env=env).returncode
        procs.check()
    finally:
        # the Ray nodes, daemons in the hosts, go with them (`ray stop` would
        # stop every Ray process of the machine)
        procs.stop()
        hosts.down()
        shutil.rmtree(tmp, ignore_errors=True)
    sys.exit(rc)


if __name__ == "__main__":
    main()
