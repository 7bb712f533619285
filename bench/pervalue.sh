#!/usr/bin/env bash
# What each value costs beyond its bytes (issue 33), on a local 2-unit
# cluster, for put + get + clear of ROWS x FIELDS values of BYTES (1024 x 4 x
# 4 KiB = 4096 values):
#
#   time          `dataplane bench` p50 batch times (registered memory, with
#                 and without location hints) and one thread's memcpy of the
#                 same pieces (bench_memcpy) in the same run: microseconds per
#                 value beyond memcpy, REPS rounds taking turns, medians;
#   instructions  callgrind (repeatable whatever else the machine does): the
#                 units run under it (`valgrind --trace-children=yes dataplane
#                 up`), their counters zeroed and dumped around each client
#                 run; the client `dataplane bench --no-verify` under it with
#                 CG_A and CG_B iterations; B - A per value, each side split
#                 by where the instructions run (bench/pervalue.py).
#
#   bench/pervalue.sh [BUILD_DIR]
#
# Environment: ROWS (1024), FIELDS (4), BYTES (4K), ITERS (200), REPS (3),
# CG_A (2), CG_B (6); KEEP=1 keeps the callgrind outputs. Needs valgrind (callgrind_annotate, callgrind_control).
# Timings are shown, never asserted.
set -euo pipefail
BUILD=${1:-build}
CLI="$(cd "$BUILD" && pwd)/dataplane"
MEMCPY="$BUILD/bench/bench_memcpy"
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$HERE/lib.sh"
ROWS=${ROWS:-1024} FIELDS=${FIELDS:-4} BYTES=${BYTES:-4K}
ITERS=${ITERS:-200} REPS=${REPS:-3} CG_A=${CG_A:-2} CG_B=${CG_B:-6}
[[ -x "$CLI" && -x "$MEMCPY" ]] || { echo "pervalue.sh: build $CLI and $MEMCPY first (make)" >&2; exit 2; }
for t in valgrind callgrind_annotate callgrind_control; do
    command -v "$t" >/dev/null || { echo "pervalue.sh: $t is missing (apt-get install valgrind)" >&2; exit 2; }
done
(( CG_B > CG_A )) || { echo "pervalue.sh: CG_B must exceed CG_A" >&2; exit 2; }
TMP=$(mktemp -d "${TMPDIR:-/tmp}/dp-pervalue.XXXXXX")
cleanup() {
    dp_down
    if [[ -n "${KEEP:-}" ]]; then echo "pervalue.sh: kept $TMP" >&2; else rm -rf "$TMP"; fi
}
trap cleanup EXIT
trap 'echo "pervalue.sh: interrupted" >&2; exit 130' INT TERM HUP
bytes=$(numfmt --from=iec "$BYTES")
values=$((ROWS * FIELDS))
shape=(--rows "$ROWS" --fields "$FIELDS" --bytes "$BYTES")
echo "# pervalue.sh: $ROWS rows x $FIELDS fields x $BYTES = $values values; $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, load $(cut -d' ' -f1 /proc/loadavg)"

echo "### time: dataplane bench ${shape[*]} --iters $ITERS, and memcpy, $REPS rounds"
dp_up "$TMP/c" --units 2 --slab 1G
timing() { # timing LABEL [env...]: REPS rounds of ours and memcpy taking turns; a table
    local label=$1 k
    shift
    : >"$TMP/put"
    : >"$TMP/get"
    : >"$TMP/geth"
    : >"$TMP/mc"
    for k in $(seq "$REPS"); do
        env "$@" "$CLI" bench "${shape[@]}" --iters "$ITERS" --warmup 5 >"$TMP/b" 2>&1 || { cat "$TMP/b" >&2; exit 1; }
        result "$TMP/b" put_p50_ms >>"$TMP/put"
        result "$TMP/b" get_p50_ms >>"$TMP/get"
        env "$@" "$CLI" bench "${shape[@]}" --iters "$ITERS" --warmup 5 --hints >"$TMP/b" 2>&1 || { cat "$TMP/b" >&2; exit 1; }
        result "$TMP/b" get_p50_ms >>"$TMP/geth"
        "$MEMCPY" --size "$bytes" --reps 3 >"$TMP/m"
        result "$TMP/m" GBps >>"$TMP/mc"
    done
    echo "$label:"
    awk -v p="$(median <"$TMP/put")" -v g="$(median <"$TMP/get")" -v h="$(median <"$TMP/geth")" \
        -v mc="$(median <"$TMP/mc")" -v n="$values" -v b="$bytes" 'BEGIN {
        m = n * b / (mc * 1e9) * 1e3   # ms for one thread to copy the batch
        printf "  one thread memcpy %.2f GB/s: %.3f ms a batch\n", mc, m
        printf "  %-12s %9s %10s %17s\n", "op", "p50 ms", "x memcpy", "us/value beyond"
        printf "  %-12s %9.3f %10.2f %17.3f\n", "put", p, m / p, (p - m) * 1e3 / n
        printf "  %-12s %9.3f %10.2f %17.3f\n", "get", g, m / g, (g - m) * 1e3 / n
        printf "  %-12s %9.3f %10.2f %17.3f\n", "get, hints", h, m / h, (h - m) * 1e3 / n
    }'
}
timing "default copy threads"
timing "one copy thread (DP_COPY_THREADS=1)" DP_COPY_THREADS=1
dp_down
echo
echo "### instructions: callgrind, client runs of $CG_A and $CG_B iterations"
# The units, each run by callgrind itself (`up` re-executes its own binary,
# which under valgrind is valgrind's), and a cluster file naming them.
UNITS=()
for u in 0 1; do
    valgrind --tool=callgrind --callgrind-out-file="$TMP/cg.%p" "$CLI" unit --unit-id "$u" \
        --units 2 --port 0 --slab 256M --cluster-id pervalue >"$TMP/unit$u.out" 2>"$TMP/unit$u.err" &
    UNITS+=($!)
done
stop_units() { kill "${UNITS[@]}" 2>/dev/null || true; wait "${UNITS[@]}" 2>/dev/null || true; }
trap 'stop_units; cleanup' EXIT
for u in 0 1; do
    for ((i = 0; i < 1200; i++)); do
        grep -q '^tcp://' "$TMP/unit$u.out" 2>/dev/null && break
        kill -0 "${UNITS[$u]}" 2>/dev/null || { cat "$TMP/unit$u.err" >&2; exit 1; }
        sleep 0.1
    done
    grep -q '^tcp://' "$TMP/unit$u.out" || { echo "pervalue.sh: unit $u did not start under callgrind" >&2; exit 1; }
done
mkdir -p "$TMP/u"
printf '{"version": 1, "cluster": "pervalue", "units": [%s, %s]}\n' \
    "{\"id\": 0, \"zmq\": \"$(head -1 "$TMP/unit0.out")\", \"agent\": \"unit-0\"}" \
    "{\"id\": 1, \"zmq\": \"$(head -1 "$TMP/unit1.out")\", \"agent\": \"unit-1\"}" >"$TMP/u/cluster.json"
"$CLI" bench --cluster "$TMP/u" "${shape[@]}" --iters 1 --warmup 1 --no-verify >/dev/null # warm the units
dumps=()
for n in "$CG_A" "$CG_B"; do
    for p in "${UNITS[@]}"; do callgrind_control -z "$p" >/dev/null; done
    valgrind --tool=callgrind --callgrind-out-file="$TMP/client.$n" "$CLI" bench \
        --cluster "$TMP/u" "${shape[@]}" --iters "$n" --warmup 0 --no-verify >"$TMP/cb.$n" 2>&1 ||
        { cat "$TMP/cb.$n" >&2; exit 1; }
    for p in "${UNITS[@]}"; do callgrind_control --dump "$p" >/dev/null; done
    sleep 1
    d=""
    for p in "${UNITS[@]}"; do
        f=$(ls -t "$TMP"/cg."$p".* 2>/dev/null | head -1)
        [[ -n "$f" ]] || { echo "pervalue.sh: no dump of unit $p" >&2; exit 1; }
        mv "$f" "$TMP/unit.$p.$n"
        d+="${d:+,}$TMP/unit.$p.$n"
    done
    dumps+=("$d")
done
/usr/bin/python3 "$HERE/pervalue.py" "$values" "$CG_A" "$CG_B" "$TMP/client.$CG_A" \
    "$TMP/client.$CG_B" "${dumps[0]}" "${dumps[1]}"
