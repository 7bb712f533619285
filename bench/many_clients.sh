#!/usr/bin/env bash
# Many clients against one cluster (issue 17): CLIENTS client processes
# (`dataplane bench`, each on rows of its own) against a local 2-unit
# cluster, all started together; the aggregate GB/s (sum of the clients'
# put and get GB/s) next to memcpy measured just before with as many
# concurrent copies as the machine has cores (bench_memcpy, one per core).
# A figure, never asserted.
#
#   bench/many_clients.sh [BUILD_DIR]
#
# Environment: CLIENTS (8), ROWS/FIELDS/BYTES (1024 / 4 / 4K), ITERS (20),
# SLAB (per unit, 1G), BENCH_ARGS (more `dataplane bench` options, e.g.
# --hints).
set -euo pipefail

BUILD=${1:-build}
CLI="$BUILD/dataplane"
MEMCPY="$BUILD/bench/bench_memcpy"
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
CLIENTS=${CLIENTS:-8}
ROWS=${ROWS:-1024}
FIELDS=${FIELDS:-4}
BYTES=${BYTES:-4K}
ITERS=${ITERS:-20}
SLAB=${SLAB:-1G}
[[ -x "$CLI" && -x "$MEMCPY" ]] ||
    { echo "many_clients.sh: build $CLI and $MEMCPY first (make)" >&2; exit 2; }
[[ "$CLIENTS" =~ ^[1-9][0-9]*$ ]] || { echo "many_clients.sh: CLIENTS must be >= 1" >&2; exit 2; }

TMP=$(mktemp -d "${TMPDIR:-/tmp}/dp-many.XXXXXX")
cleanup() {
    dp_down
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'echo "many_clients.sh: interrupted" >&2; exit 130' INT TERM HUP

cores=$(nproc)
echo "### memcpy: $cores concurrent copies of $BYTES pieces (one per core)"
bytes=$("$CLI" bench --help >/dev/null 2>&1; awk -v s="$BYTES" 'BEGIN {
    n = s + 0; u = toupper(substr(s, length(s)));
    if (u == "K") n *= 1024; else if (u == "M") n *= 1048576; else if (u == "G") n *= 1073741824;
    print n }')
for ((i = 0; i < cores; i++)); do
    "$MEMCPY" --size "$bytes" --buf 256 --reps 3 >"$TMP/memcpy.$i" &
done
wait
mc=$(awk '$1 == "RESULT" { split($3, kv, "="); s += kv[2] } END { printf "%.3f", s }' "$TMP"/memcpy.*)
echo "memcpy aggregate: $mc GB/s"

echo "### dataplane up: 2 units, slab $SLAB each"
dp_up "$TMP/cluster" --units 2 --slab "$SLAB"

echo "### $CLIENTS clients at once: dataplane bench --rows $ROWS --fields $FIELDS --bytes $BYTES --iters $ITERS ${BENCH_ARGS:-}"
pids=()
t0=$(date +%s.%N)
for ((k = 0; k < CLIENTS; k++)); do
    # shellcheck disable=SC2086 # BENCH_ARGS: options, split on purpose
    "$CLI" bench --rows "$ROWS" --fields "$FIELDS" --bytes "$BYTES" --iters "$ITERS" \
        --warmup 2 --first-row $((k * 1000000)) ${BENCH_ARGS:-} >"$TMP/client.$k" 2>&1 &
    pids+=($!)
done
fail=0
for p in "${pids[@]}"; do wait "$p" || fail=1; done
t1=$(date +%s.%N)
if ((fail)); then
    for ((k = 0; k < CLIENTS; k++)); do tail -3 "$TMP/client.$k" >&2; done
    echo "many_clients.sh: a client failed" >&2
    exit 1
fi
awk -v mc="$mc" -v n="$CLIENTS" -v wall="$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" \
    -v iters="$((ITERS + 2))" '
$1 == "RESULT" {
    for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
    put += v["put_GBps"]; get += v["get_GBps"]; k++
    moved += 2 * iters * v["rows"] * v["fields"] * v["bytes"]
    printf "client %d: put %.3f GB/s, get %.3f GB/s (p50 %s / %s ms)\n", k, v["put_GBps"], v["get_GBps"], v["put_p50_ms"], v["get_p50_ms"]
}
END {
    printf "aggregate of %d clients: put %.3f GB/s (%.2fx memcpy on all cores), get %.3f GB/s (%.2fx); memcpy %.3f GB/s\n", n, put, put / mc, get, get / mc, mc
    printf "wall clock: %.3f GB/s put+get over the %.2f s all clients ran (a lower bound: it includes their fills, CRC checks and clears)\n", moved / wall / 1e9, wall
    printf "RESULT clients=%d put_GBps=%.3f get_GBps=%.3f memcpy_GBps=%.3f wall_GBps=%.3f\n", n, put, get, mc, moved / wall / 1e9
}' "$TMP"/client.*
echo "(each client's GB/s is its own bytes over its own op time; the clients overlap,"
echo " so the sum is the aggregate while all of them run)"
