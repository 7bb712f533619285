#!/usr/bin/env bash
# What CURVE on the control plane costs: a 2-unit cluster (`dataplane up`)
# without and with --curve-secret/--curve-allow, taking turns, and
# `dataplane bench` against each: 64 x 1 MiB (GB/s: the data path, which CURVE
# does not touch) and 1 row x 4 KiB (p50 latency of one put and one get: a
# few control round trips each, where CURVE's per-message crypto shows).
# Medians of REPS rounds; the ratio is with/without.
#
#   bench/curve.sh [BUILD_DIR]
#
# Environment: REPS (5), ITERS (bench iterations for 64 x 1 MiB, 20; the
# 4 KiB shape runs 25x that). Timings are shown, never asserted.
set -euo pipefail
BUILD=${1:-build}
CLI="$BUILD/dataplane"
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
REPS=${REPS:-5}
ITERS=${ITERS:-20}
[[ -x "$CLI" ]] || { echo "curve.sh: no $CLI: build first (make)" >&2; exit 2; }
TMP=$(mktemp -d "${TMPDIR:-/tmp}/dp-curve.XXXXXX")
cleanup() {
    dp_down
    rm -rf "$TMP"
}
trap cleanup EXIT

mkdir -p "$TMP/allow"
"$CLI" keygen --out "$TMP/unit" >/dev/null 2>&1
"$CLI" keygen --out "$TMP/client" >/dev/null 2>&1
cp "$TMP/client.pub" "$TMP/allow/"

start() { # start plain|curve
    rm -rf "$TMP/c"
    local extra=()
    [[ $1 == curve ]] && extra=(--curve-secret "$TMP/unit.key" --curve-allow "$TMP/allow")
    dp_up "$TMP/c" --units 2 --slab 1G "${extra[@]}"
}
stop() { dp_down; }

for mode in plain curve; do : >"$TMP/$mode.big.put"; : >"$TMP/$mode.big.get"; : >"$TMP/$mode.small.put"; : >"$TMP/$mode.small.get"; done
for r in $(seq "$REPS"); do
    for mode in plain curve; do
        start "$mode"
        env=()
        [[ $mode == curve ]] && env=(DP_CURVE_SECRET="$TMP/client.key")
        env "${env[@]}" "$CLI" bench --cluster "$TMP/c" --rows 64 --bytes 1M --iters "$ITERS" \
            --warmup 3 --no-verify >"$TMP/out" 2>/dev/null
        result "$TMP/out" put_GBps >>"$TMP/$mode.big.put"
        result "$TMP/out" get_GBps >>"$TMP/$mode.big.get"
        env "${env[@]}" "$CLI" bench --cluster "$TMP/c" --rows 1 --bytes 4K \
            --iters $((ITERS * 25)) --warmup 20 --no-verify >"$TMP/out" 2>/dev/null
        result "$TMP/out" put_p50_ms >>"$TMP/$mode.small.put"
        result "$TMP/out" get_p50_ms >>"$TMP/$mode.small.get"
        stop
    done
done
echo "bench/curve.sh: 2 units, $REPS rounds, medians (ratio: with CURVE / without)"
printf "%-28s %10s %10s %8s\n" measure plain curve ratio
for m in "big.put:64x1MiB put GB/s" "big.get:64x1MiB get GB/s" "small.put:1x4KiB put p50 ms" "small.get:1x4KiB get p50 ms"; do
    key=${m%%:*} name=${m#*:}
    p=$(median <"$TMP/plain.$key"); c=$(median <"$TMP/curve.$key")
    printf "%-28s %10.3f %10.3f %8.2f\n" "$name" "$p" "$c" "$(awk -v a="$c" -v b="$p" 'BEGIN{print a/b}')"
done
