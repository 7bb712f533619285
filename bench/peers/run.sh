#!/usr/bin/env bash
# dataplane side by side with the systems a user would pick instead, in one
# run (`make bench BENCH=peers`): makes the peers' virtual environment
# (bench/peers/.venv, from bench/peers/requirements.txt, pinned; nothing of
# theirs is in this repository), then runs each comparison with the built
# Python package on PYTHONPATH. Prints tables and ratios; asserts no timing.
#
#   bench/peers/run.sh [BUILD_DIR] [--reps N]     (--reps: Mooncake Store's, 10)
#
#   1. Mooncake Store, on one host (bench/peers/mooncake_store.py): 64 x 1 MiB,
#      1024 x 4 x 4 KiB, the RL batch, one 1 GiB rollout;
#   2. the same across two network-namespace hosts over TCP (--hosts; needs
#      root, else skipped with a line saying so);
#   3. TransferQueue's perftest shape (1024 x 9 x 8192 float32) and the RL
#      batch through TransferQueue with SimpleStorage, MooncakeStore and
#      Dataplane, through dataplane's Client, and through Ray's object store
#      (default and zero-copy serialization) (bench/python/bench_tq.py);
#   3b. the same across the two hosts, a Ray node in each: the writer and
#      the storage on host 0, the reader on host 1 (bench/peers/tq_hosts.py;
#      root, else skipped);
#   4. NIXL's one-sided WRITE and READ against dataplane's endpoint
#      (bench/bench_xfer) and its direct transport (bench/peers/nixl_xfer.py).
#
# Figures and what each peer was configured with: docs/benchmarks.md, "Peers".
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
shift || true
case "$build" in /*) ;; *) build=$root/$build ;; esac
[ -x "$build/dataplane" ] || { echo "peers: no $build/dataplane: build first (make build)" >&2; exit 2; }
[ -d "$build/python/dataplane" ] || { echo "peers: no Python package in $build/python: build first" >&2; exit 2; }
py=$(DP_VENV_NO_DEPS=1 "$root/scripts/venv.sh" "$root/bench/peers/.venv" "$root/bench/peers/requirements.txt" | tail -1)
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
# Mooncake's library logs every step to stderr (glog lines: I/W and a date);
# they are left out, its errors (E lines) and its calls' failures are not.
# TransferQueue logs an ERROR at every tq.init with a Mooncake master it did
# not start (auto_init off: "Not found available MooncakeStore storage
# resources"), which is how this bench runs it: left out too.
# Ray prefixes its workers' lines with "(Peer pid=N)" or "(Peer pid=N, ip=A)".
quiet() {
    grep -v -E '^([^ ]*\([A-Za-z]+ pid=[0-9]+[^)]*\)[^ ]* )?([IW][0-9]{4} |WARNING: Logging before InitGoogleLogging|\s*cp\.dump\(obj\)|.*ZeroCopyTensorsWarning|.*Not found available MooncakeStore storage resources)' || true
}
export PYTHONPATH="$build/python" DP_CLI="$build/dataplane"
echo "## 1. Mooncake Store, one host"
"$py" "$root/bench/peers/mooncake_store.py" --cli "$build/dataplane" "$@" 2>&1 | quiet
echo
echo "## 2. Mooncake Store, across two hosts"
if [ "$(id -u)" -eq 0 ] && command -v ip >/dev/null && command -v unshare >/dev/null; then
    "$py" "$root/bench/peers/mooncake_store.py" --cli "$build/dataplane" --hosts "$@" 2>&1 | quiet
else
    echo "skipped: network namespaces need root, ip and unshare"
fi
for batch in perftest rl; do
    echo
    echo "## 3. TransferQueue's backends, dataplane's Client and Ray's object store: $batch batch"
    "$py" "$root/bench/python/bench_tq.py" --build "$build" --batch "$batch" --fields 9 --reps 3 \
        --backends SimpleStorage,MooncakeStore,Dataplane,Client,Ray,Ray0copy 2>&1 | quiet
done
echo
if [ "$(id -u)" -eq 0 ] && command -v ip >/dev/null && command -v unshare >/dev/null; then
    for batch in perftest rl; do
        echo
        echo "## 3b. the same across two hosts (put on host 0, got on host 1): $batch batch"
        "$py" "$root/bench/peers/tq_hosts.py" --build "$build" --batch "$batch" --reps 3 2>&1 | quiet
    done
else
    echo "## 3b. across two hosts: skipped (network namespaces need root, ip and unshare)"
fi
echo
echo "## 4. NIXL"
"$py" "$root/bench/peers/nixl_xfer.py" --build "$build" 2>&1 | quiet
