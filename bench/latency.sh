#!/usr/bin/env bash
# One small value end to end against a bare ZMQ round trip, in one run
# (issue 17): `dataplane bench --rows 1 --fields 1 --bytes SIZE` put p50 and
# get p50 with inline values (the default) and without (DP_INLINE=off: alloc,
# WRITE, commit; resolve_keys, READ, unpin), taking turns with bench_ctl's
# bare ZMQ ping-pong (the same DEALER/ROUTER pair, 127.0.0.1, no dataplane
# code), REPS rounds each; the table takes the median round of each.
#
# Goal: put + get <= 3x the bare round trip. Timings are shown, never asserted.
#
#   bench/latency.sh [BUILD_DIR]
#
# Environment: SIZES (value sizes, "4K"), ITERS (iterations per round, 1000),
# REPS (rounds, 3).
set -euo pipefail

BUILD=${1:-build}
CLI="$BUILD/dataplane"
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
CTL="$BUILD/bench/bench_ctl"
SIZES=${SIZES:-4K}
ITERS=${ITERS:-1000}
REPS=${REPS:-3}
[[ -x "$CLI" ]] || { echo "latency.sh: no $CLI: build the dataplane-cli target" >&2; exit 2; }
[[ -x "$CTL" ]] || { echo "latency.sh: no $CTL: build bench_ctl" >&2; exit 2; }

TMP=$(mktemp -d "${TMPDIR:-/tmp}/dp-latency.XXXXXX")
cleanup() {
    dp_down
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'echo "latency.sh: interrupted" >&2; exit 130' INT TERM HUP

echo "### dataplane up: 2 units, slab 256M each"
dp_up "$TMP/cluster" --units 2 --slab 256M

printf '\n%-6s %-7s %9s %9s %9s %9s %8s\n' size inline "put p50" "get p50" "sum" "bare" "sum/bare"
for size in $SIZES; do
    for mode in on off; do
        : >"$TMP/bare.$mode" && : >"$TMP/put.$mode" && : >"$TMP/get.$mode" && : >"$TMP/ratio.$mode"
    done
    for ((k = 1; k <= REPS; k++)); do
        for mode in on off; do
            echo "### $size, inline $mode, round $k of $REPS: bench_ctl bare ping-pong, then dataplane bench" >&2
            "$CTL" --iters "$ITERS" >"$TMP/ctl.out" 2>&1
            bare=$(result "$TMP/ctl.out" bare_p50)
            env_mode=$([[ $mode == on ]] && echo "" || echo off)
            DP_INLINE=$env_mode "$CLI" bench --rows 1 --fields 1 --bytes "$size" \
                --iters "$ITERS" --warmup 50 >"$TMP/dp.out" 2>&1
            put=$(result "$TMP/dp.out" put_p50_ms)
            get=$(result "$TMP/dp.out" get_p50_ms)
            echo "$bare" >>"$TMP/bare.$mode"
            awk -v p="$put" 'BEGIN {print p * 1000}' >>"$TMP/put.$mode"
            awk -v g="$get" 'BEGIN {print g * 1000}' >>"$TMP/get.$mode"
            awk -v p="$put" -v g="$get" -v b="$bare" 'BEGIN {print (p + g) * 1000 / b}' \
                >>"$TMP/ratio.$mode"
        done
    done
    for mode in on off; do
        put=$(median <"$TMP/put.$mode")
        get=$(median <"$TMP/get.$mode")
        bare=$(median <"$TMP/bare.$mode")
        ratio=$(median <"$TMP/ratio.$mode")
        printf '%-6s %-7s %7.1fus %7.1fus %7.1fus %7.1fus %7.2fx\n' "$size" "$mode" "$put" "$get" \
            "$(awk -v p="$put" -v g="$get" 'BEGIN {print p + g}')" "$bare" "$ratio"
    done
done
echo
echo "sum/bare: the median of each round's (put p50 + get p50) / bare p50; goal <= 3x."
