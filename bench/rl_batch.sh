#!/usr/bin/env bash
# The RL-shaped batch (bench_rl_batch) against a local 2-unit cluster started
# here, without and with location hints, then its Python version
# (bench/python/rl_batch.py, which starts a cluster of its own). Ratios are
# to memcpy (C) and torch copy_ (Python) measured in the same loops.
#
#   bench/rl_batch.sh [BUILD_DIR]      (ITERS: 20, SLAB: 1G)
set -euo pipefail
BUILD=${1:-build}
CLI="$BUILD/dataplane"
RL="$BUILD/bench/bench_rl_batch"
[[ -x "$CLI" && -x "$RL" ]] || { echo "rl_batch.sh: build $CLI and $RL first (make)" >&2; exit 2; }
TMP=$(mktemp -d "${TMPDIR:-/tmp}/dp-rl.XXXXXX")
up_pid=""
cleanup() {
    if [[ -n "$up_pid" ]] && kill -0 "$up_pid" 2>/dev/null; then
        kill -TERM "$up_pid" 2>/dev/null || true
        wait "$up_pid" 2>/dev/null || true
    fi
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'echo "rl_batch.sh: interrupted" >&2; exit 130' INT TERM HUP
"$CLI" up --units 2 --slab "${SLAB:-1G}" --dir "$TMP/cluster" >"$TMP/up.out" 2>"$TMP/up.err" &
up_pid=$!
for ((i = 0; i < 1200; i++)); do
    [[ -f "$TMP/cluster/cluster.json" ]] && break
    kill -0 "$up_pid" 2>/dev/null || { cat "$TMP/up.err" >&2; echo "rl_batch.sh: up failed" >&2; exit 1; }
    sleep 0.1
done
export DP_CLUSTER="$TMP/cluster/cluster.json"
echo "### C, without hints"
"$RL" --iters "${ITERS:-20}"
echo "### C, with location hints"
"$RL" --iters "${ITERS:-20}" --hints
kill -TERM "$up_pid" 2>/dev/null || true
wait "$up_pid" 2>/dev/null || true
up_pid=""
echo "### Python (Client, TQ adapter with hints, torch copy_)"
PY=${PYTHON:-/usr/bin/python3}
if [[ -x "$PY" ]]; then
    "$PY" "$(dirname "${BASH_SOURCE[0]}")/python/rl_batch.py" --build "$BUILD"
else
    echo "no $PY: Python version skipped"
fi
