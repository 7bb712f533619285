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
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
[[ -x "$CLI" && -x "$RL" ]] || { echo "rl_batch.sh: build $CLI and $RL first (make)" >&2; exit 2; }
TMP=$(mktemp -d "${TMPDIR:-/tmp}/dp-rl.XXXXXX")
cleanup() {
    dp_down
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'echo "rl_batch.sh: interrupted" >&2; exit 130' INT TERM HUP
dp_up "$TMP/cluster" --units 2 --slab "${SLAB:-1G}"
echo "### C, without hints"
"$RL" --iters "${ITERS:-20}"
echo "### C, with location hints"
"$RL" --iters "${ITERS:-20}" --hints
dp_down
echo "### Python (Client, TQ adapter with hints, torch copy_)"
PY=${PYTHON:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.venv/bin/python}
if [[ -x "$PY" ]]; then
    "$PY" "$(dirname "${BASH_SOURCE[0]}")/python/rl_batch.py" --build "$BUILD"
else
    echo "no $PY: Python version skipped"
fi
