#!/usr/bin/env bash
# Our put and get next to the limits and the alternative, in one run (issue 5):
#
#   large rows: 64 rows x 1 field x 1 MiB per batch
#   small rows: 1024 rows x 4 fields x 4 KiB per batch
#
# For each shape: `dataplane bench` against a local 2-unit cluster started
# here (or bench_client, if built and --bench-client is given), memcpy of the
# same piece size over buffers larger than the caches (bench_memcpy) on one
# thread and on two (the client shares large copies between two threads by
# default, DP_COPY_THREADS: so both limits are shown), ucx_perftest one-sided put (ucp_put_bw) and get (ucp_get)
# at the same message size on 127.0.0.1, and Redis SET/GET of the same value
# size (redis-server on a free port, started and stopped here;
# redis-benchmark pipelined). One table of GB/s (1e9 B/s) and ratios.
#
# Targets: large rows put and get >= 0.8x memcpy; small rows >= 0.5x memcpy;
# >= 2x Redis at 1 MiB. Timings are shown, never asserted.
#
#   bench/compare.sh [BUILD_DIR]
#
# Environment: ITERS (dataplane bench iterations per round, 30), REPS (rounds
# of ours and memcpy taking turns, and perftest repetitions, 3), SLAB (per
# unit, 1G), UCX_TLS etc. pass through.
set -euo pipefail

BUILD=${1:-build}
CLI="$BUILD/dataplane"
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
MEMCPY="$BUILD/bench/bench_memcpy"
ITERS=${ITERS:-30}
REPS=${REPS:-3}
SLAB=${SLAB:-1G}
[[ -x "$CLI" ]] || { echo "compare.sh: no $CLI: build the dataplane-cli target" >&2; exit 2; }
[[ -x "$MEMCPY" ]] || { echo "compare.sh: no $MEMCPY: build bench_memcpy" >&2; exit 2; }
"$CLI" bench --help >/dev/null 2>&1 ||
    { echo "compare.sh: this dataplane has no bench command" >&2; exit 2; }

TMP=$(mktemp -d "${TMPDIR:-/tmp}/dp-compare.XXXXXX")
redis_pid=""
cleanup() {
    [[ -n "$redis_pid" ]] && kill "$redis_pid" 2>/dev/null && wait "$redis_pid" 2>/dev/null
    dp_down
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'echo "compare.sh: interrupted" >&2; exit 130' INT TERM HUP


# ---- the cluster ----
echo "### dataplane up: 2 units, slab $SLAB each"
dp_up "$TMP/cluster" --units 2 --slab "$SLAB"

# ---- the shapes: name rows fields bytes ----
# "hints": the small shape with the puts' location hints handed to the gets.
SHAPES=("large 64 1 1048576" "small 1024 4 4096" "hints 1024 4 4096 --hints")

# Ours and memcpy take turns, REPS rounds each, and the table takes the median
# round of each: on a shared machine both then see the same load.
for shape in "${SHAPES[@]}"; do
    read -r name rows fields bytes extra <<<"$shape"
    for ((k = 1; k <= REPS; k++)); do
        echo "### $name rows, round $k of $REPS: dataplane bench --rows $rows --fields $fields --bytes $bytes $extra"
        # shellcheck disable=SC2086 # extra: options, split on purpose
        "$CLI" bench --rows "$rows" --fields "$fields" --bytes "$bytes" --iters "$ITERS" \
            --warmup 3 $extra | tee "$TMP/ours.$name.$k"
        echo "### $name rows, round $k of $REPS: memcpy of $bytes-byte pieces"
        "$MEMCPY" --size "$bytes" --reps 3 | tee "$TMP/memcpy.$name.$k"
        "$MEMCPY" --size "$bytes" --reps 3 --threads 2 | tee "$TMP/memcpy2.$name.$k"
    done
done

# ---- ucx_perftest (MB/s printed are MiB/s) ----
perftest() { # perftest TEST SIZE -> overall MB/s of the final line
    local test=$1 size=$2 iters port srv out
    iters=$(( (512 * 1024 * 1024) / size ))
    (( iters > 100000 )) && iters=100000
    (( iters < 50 )) && iters=50
    for attempt in 1 2 3; do
        port=$(free_port)
        ucx_perftest -p "$port" >"$TMP/pf-srv.txt" 2>&1 &
        srv=$!
        sleep 0.3
        if out=$(timeout 120 ucx_perftest 127.0.0.1 -p "$port" -t "$test" -s "$size" \
                 -n "$iters" -w $((iters / 10 + 1)) -o -f 2>"$TMP/pf-cli.err"); then
            wait "$srv" 2>/dev/null || true
            echo "$out" | awk 'NF>=8 && $1 ~ /^[0-9]+$/ {v=$6} END {print v}'
            return 0
        fi
        kill "$srv" 2>/dev/null || true
        wait "$srv" 2>/dev/null || true
    done
    echo nan
}
if command -v ucx_perftest >/dev/null; then
    for shape in "${SHAPES[@]}"; do
        read -r name rows fields bytes extra <<<"$shape"
        [[ -n "$extra" ]] && continue
        echo "### $name rows: ucx_perftest ucp_put_bw / ucp_get -o at $bytes bytes ($REPS reps)"
        pb=$(for i in $(seq "$REPS"); do perftest ucp_put_bw "$bytes"; done | median)
        gb=$(for i in $(seq "$REPS"); do perftest ucp_get "$bytes"; done | median)
        echo "put $pb MB/s  get $gb MB/s"
        echo "$pb $gb" >"$TMP/pf.$name"
    done
else
    echo "### ucx_perftest not installed (ucx-utils): skipped"
fi

# ---- Redis ----
if command -v redis-server >/dev/null && command -v redis-benchmark >/dev/null; then
    port=$(free_port)
    redis-server --bind 127.0.0.1 --port "$port" --save "" --appendonly no \
        --protected-mode yes --logfile "$TMP/redis.log" >/dev/null 2>&1 &
    redis_pid=$!
    for ((i = 0; i < 100; i++)); do
        redis-cli -p "$port" ping >/dev/null 2>&1 && break
        sleep 0.1
    done
    for shape in "${SHAPES[@]}"; do
        read -r name rows fields bytes extra <<<"$shape"
        [[ -n "$extra" ]] && continue
        # The same bytes as about 20 of our batches; pipelined like a batch.
        if (( bytes >= 65536 )); then n=2000; p=16; else n=200000; p=64; fi
        echo "### $name rows: redis-benchmark -t set,get -d $bytes -n $n -P $p"
        redis-benchmark -h 127.0.0.1 -p "$port" -t set,get -d "$bytes" -n "$n" -P "$p" \
            --csv 2>/dev/null | tee "$TMP/redis.$name"
    done
    kill "$redis_pid" 2>/dev/null || true
    wait "$redis_pid" 2>/dev/null || true
    redis_pid=""
else
    echo "### redis-server / redis-benchmark not installed: skipped"
fi

# ---- the table ----
echo
echo "### GB/s (1e9 B/s); ratios ours / other"
printf '%-6s %-22s | %7s %7s | %7s %7s | %7s %7s | %7s %7s | %8s %8s | %9s %9s | %8s %8s | %8s %8s\n' \
    shape batch "put" "get" memcpy "mcp x2" "pf put" "pf get" "rd set" "rd get" \
    "put/mcp" "get/mcp" "put/mcp2" "get/mcp2" "put/pf" "get/pf" "put/rd" "get/rd"
for shape in "${SHAPES[@]}"; do
    read -r name rows fields bytes extra <<<"$shape"
    put=$(for f in "$TMP/ours.$name".*; do result "$f" put_GBps; done | median)
    get=$(for f in "$TMP/ours.$name".*; do result "$f" get_GBps; done | median)
    mcp=$(for f in "$TMP/memcpy.$name".*; do result "$f" GBps; done | median)
    mcp2=$(for f in "$TMP/memcpy2.$name".*; do result "$f" GBps; done | median)
    pfp=nan pfg=nan rds=nan rdg=nan
    if [[ -f "$TMP/pf.$name" ]]; then
        read -r a b <"$TMP/pf.$name"
        pfp=$(awk -v v="$a" 'BEGIN { if (v == "nan" || v == "") print "nan"; else printf "%.3f", v * 1048576 / 1e9 }')
        pfg=$(awk -v v="$b" 'BEGIN { if (v == "nan" || v == "") print "nan"; else printf "%.3f", v * 1048576 / 1e9 }')
    fi
    if [[ -f "$TMP/redis.$name" ]]; then
        # "SET","<rps>",... -> GB/s = rps * value size
        rds=$(awk -F'"' -v s="$bytes" '$2 == "SET" { printf "%.3f", $4 * s / 1e9 }' "$TMP/redis.$name")
        rdg=$(awk -F'"' -v s="$bytes" '$2 == "GET" { printf "%.3f", $4 * s / 1e9 }' "$TMP/redis.$name")
    fi
    awk -v n="$name" -v b="${rows}x${fields}x${bytes}B" -v put="$put" -v get="$get" \
        -v mcp="$mcp" -v mcp2="$mcp2" -v pfp="$pfp" -v pfg="$pfg" -v rds="$rds" -v rdg="$rdg" '
    function r(a, c) { return (a + 0 > 0 && c + 0 > 0) ? sprintf("%.2f", a / c) : "n/a" }
    function v(a) { return (a == "" || a == "nan") ? "n/a" : sprintf("%.3f", a) }
    BEGIN {
        printf "%-6s %-22s | %7s %7s | %7s %7s | %7s %7s | %7s %7s | %8s %8s | %9s %9s | %8s %8s | %8s %8s\n",
            n, b, v(put), v(get), v(mcp), v(mcp2), v(pfp), v(pfg), v(rds), v(rdg),
            r(put, mcp), r(get, mcp), r(put, mcp2), r(get, mcp2), r(put, pfp), r(get, pfg),
            r(put, rds), r(get, rdg)
    }'
done
echo
echo "targets: large rows put and get >= 0.80 x memcpy; small rows >= 0.50 x memcpy"
echo "         (>= 0.8 x with location hints, the hints row);"
echo "         >= 2 x Redis at 1 MiB (put/rd, get/rd of the large shape)."
echo "ours: a put or get of one whole batch (rows x fields values), median of $REPS rounds"
echo "taking turns with memcpy; memcpy:"
echo "single thread, pieces of the value size through 2 x 512 MiB (DRAM to DRAM);"
echo "mcp x2: the same on two threads, each through its own half (the client shares"
echo "an op's copies of 512 KiB or more between two threads: DP_COPY_THREADS);"
echo "pf: ucx_perftest, one message of that size at a time (-o), MiB/s converted; it"
echo "reuses one message-sized buffer, so its data stays in the caches: an upper bound"
echo "of the transport, not the DRAM limit; rd: redis-benchmark pipelined SET/GET of"
echo "that value size, requests/s x size."
