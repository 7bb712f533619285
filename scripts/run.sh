#!/usr/bin/env bash
# The main job on this machine (`make run`, after the build): start a local
# cluster of 2 units with `dataplane up` in a temporary directory, wait for its
# cluster file, run a short `dataplane bench` against it (or `dataplane stats`
# when this build has no bench command), show the units' counters, and stop
# the cluster again: also on an error or Ctrl-C.
#
#   scripts/run.sh [BUILD_DIR]
#
# Environment: UNITS (2), SLAB (512M), BENCH_ARGS (extra arguments for
# `dataplane bench`).
set -euo pipefail

build=${1:-build}
cli="$build/dataplane"
[[ -x "$cli" ]] || { echo "run.sh: no $cli: build first (make build)" >&2; exit 2; }

dir=$(mktemp -d "${TMPDIR:-/tmp}/dataplane-run.XXXXXX")
up_pid=""

stop_cluster() {
    if [[ -n "$up_pid" ]] && kill -0 "$up_pid" 2>/dev/null; then
        # SIGTERM, not SIGINT: a background job of a script ignores SIGINT.
        kill -TERM "$up_pid" 2>/dev/null || true
        wait "$up_pid" 2>/dev/null || true
    fi
    up_pid=""
    rm -rf "$dir"
}
trap stop_cluster EXIT
trap 'echo "run.sh: interrupted" >&2; exit 130' INT TERM HUP

echo "### dataplane up (${UNITS:-2} units, slab ${SLAB:-512M}) in $dir"
"$cli" up --units "${UNITS:-2}" --slab "${SLAB:-512M}" --dir "$dir" &
up_pid=$!

for ((i = 0; i < 1200; i++)); do
    [[ -f "$dir/cluster.json" ]] && break
    if ! kill -0 "$up_pid" 2>/dev/null; then
        st=0
        wait "$up_pid" || st=$?
        up_pid=""
        echo "run.sh: dataplane up exited with status $st before the cluster came up" >&2
        exit 1
    fi
    sleep 0.1
done
[[ -f "$dir/cluster.json" ]] || { echo "run.sh: no cluster file after 120 s" >&2; exit 1; }
export DP_CLUSTER="$dir/cluster.json"

if "$cli" bench --help >/dev/null 2>&1; then
    echo "### dataplane bench"
    # shellcheck disable=SC2086
    "$cli" bench --rows 64 --fields 2 --bytes 256K --jagged 0.5 --iters 20 ${BENCH_ARGS:-}
else
    echo "### dataplane bench is not in this build: the cluster's counters instead"
fi
echo "### dataplane stats"
"$cli" stats

echo "### stopping the cluster"
kill -TERM "$up_pid"
st=0
wait "$up_pid" || st=$?
up_pid=""
if [[ $st -ne 0 ]]; then
    echo "run.sh: dataplane up exited with status $st" >&2
    exit 1
fi
echo "run.sh: done"
