#!/usr/bin/env bash
# dataplane side by side with the systems a user would pick instead, in one
# run (`make bench BENCH=peers`): makes the peers' virtual environment
# (bench/peers/.venv, from bench/peers/requirements.txt, pinned; nothing of
# theirs is in this repository), then runs each comparison with the built
# Python package on PYTHONPATH. Prints tables and ratios; asserts no timing.
#
#   bench/peers/run.sh [BUILD_DIR] [--reps N]
#
# Now: Mooncake Store on one host (bench/peers/mooncake_store.py) and NIXL's
# one-sided transfers against the direct transport (bench/peers/nixl_xfer.py).
# Figures and what each peer was configured with: docs/benchmarks.md,
# "Peers".
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
shift || true
case "$build" in /*) ;; *) build=$root/$build ;; esac
[ -x "$build/dataplane" ] || { echo "peers: no $build/dataplane: build first (make build)" >&2; exit 2; }
[ -d "$build/python/dataplane" ] || { echo "peers: no Python package in $build/python: build first" >&2; exit 2; }
py=$(DP_VENV_NO_DEPS=1 "$root/scripts/venv.sh" "$root/bench/peers/.venv" "$root/bench/peers/requirements.txt" | tail -1)
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
# Mooncake's library logs every step to stderr (glog lines: I/W/E and a date);
# they are left out, its errors are not (its calls' failures are reported).
PYTHONPATH="$build/python" DP_CLI="$build/dataplane" "$py" "$root/bench/peers/mooncake_store.py" \
    --cli "$build/dataplane" "$@" 2>&1 | { grep -v -E '^[IW][0-9]{4} ' || true; }
echo
PYTHONPATH="$build/python" "$py" "$root/bench/peers/nixl_xfer.py" 2>&1 |
    { grep -v -E '^[IW][0-9]{4} ' || true; }
