#!/usr/bin/env bash
# Compare bench_direct with ucx_perftest one-sided get at the same sizes, in the same run.
#
#   bench/direct_compare.sh [BUILD_DIR] [-- extra bench_direct args]
#
# Runs bench_direct (fetch of one-buffer objects between two processes, the
# publisher's buffer either registered per buffer or copied into its pool;
# then the publish+free cost per MiB), then, per size, ucx_perftest ucp_get
# with -o (one-sided: the responder does not progress), server and client on
# 127.0.0.1 with a free port, REPS times each (median). Prints one table of
# GB/s and microseconds per object with our/perftest ratios. perftest reports
# MB/s as MiB/s; converted to GB/s (1e9 B/s).
#
# Environment: SIZES (bytes, space separated; default 4 KiB .. 256 MiB), REPS
# (perftest repetitions, default 3), BENCH_REPS (default 7), BENCH_MIN_MIB
# (bytes fetched per size at least, default 512). UCX_TLS etc. pass through.
set -euo pipefail

BUILD=${1:-build}
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
shift || true
[[ "${1:-}" == "--" ]] && shift
BENCH="$BUILD/bench/bench_direct"
[[ -x "$BENCH" ]] || { echo "no $BENCH: build the bench_direct target first" >&2; exit 2; }
command -v ucx_perftest >/dev/null || { echo "ucx_perftest not installed (ucx-utils)" >&2; exit 2; }

SIZES=${SIZES:-"4096 65536 1048576 4194304 16777216 67108864 268435456"}
REPS=${REPS:-3}
BENCH_REPS=${BENCH_REPS:-7}
BENCH_MIN_MIB=${BENCH_MIN_MIB:-512}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"; jobs -p | xargs -r kill 2>/dev/null || true' EXIT



# perftest_get SIZE FIELD -> FIELD of the final -f line of ucp_get -o:
#   iters, latency typical, avg, overall (us), MB/s avg, overall, msg/s avg, overall
perftest_get() {
    local size=$1 field=$2 iters warm port out srv
    iters=$(( (512 * 1024 * 1024) / size ))
    (( iters > 100000 )) && iters=100000
    (( iters < 50 )) && iters=50
    warm=$(( iters / 10 + 1 ))
    for attempt in 1 2 3; do
        port=$(free_port)
        ucx_perftest -p "$port" >"$TMP/srv.txt" 2>&1 &
        srv=$!
        sleep 0.3
        if out=$(timeout 120 ucx_perftest 127.0.0.1 -p "$port" -t ucp_get -s "$size" \
                 -n "$iters" -w "$warm" -o -f 2>"$TMP/cli.err"); then
            wait "$srv" 2>/dev/null || true
            echo "$out" | awk -v f="$field" 'NF>=8 && $1 ~ /^[0-9]+$/ {v=$f} END {print v}'
            return 0
        fi
        kill "$srv" 2>/dev/null || true
        wait "$srv" 2>/dev/null || true
    done
    echo nan
}

SIZES_CSV=$(echo $SIZES | tr ' ' ',')
echo "### bench_direct"
"$BENCH" --reps "$BENCH_REPS" --min-mib "$BENCH_MIN_MIB" --sizes "$SIZES_CSV" "$@" | tee "$TMP/bd.txt"
echo

printf '### ucx_perftest ucp_get -o, %s reps each (median)\n' "$REPS"
for s in $SIZES; do
    bw=$(for i in $(seq "$REPS"); do perftest_get "$s" 6; done | median)
    lat=$(for i in $(seq "$REPS"); do perftest_get "$s" 4; done | median)
    echo "$s $bw $lat" >>"$TMP/pf.txt"
    printf '%10s get %10s MB/s  %10s us/op\n' "$s" "$bw" "$lat"
done
echo

echo "### direct fetch / ucx_perftest get (GB/s = 1e9 B/s; perftest MB/s are MiB/s)"
awk '
FILENAME ~ /bd/ && $1 == "RESULT" && $2 == "reg"  {rg[$3]=$4; ru[$3]=$5; rp[$3]=$6}
FILENAME ~ /bd/ && $1 == "RESULT" && $2 == "pool" {pg[$3]=$4; pu[$3]=$5; pp[$3]=$6}
FILENAME ~ /bd/ && $1 == "REGCOST" {cr[$2]=$3; cp[$2]=$4}
FILENAME ~ /pf/ {fg[$1]=$2*1048576/1e9; fu[$1]=$3; order[++n]=$1}
function r(a, b) { return (b > 0) ? sprintf("%.2f", a / b) : "n/a" }
END {
    printf "%10s | %8s %8s %8s %7s %7s | %9s %9s %9s | %10s %10s\n", "size",
           "pf get", "reg", "pool", "reg/pf", "pool/pf", "pf us", "reg us", "pool us",
           "reg us/MiB", "pool us/MiB"
    for (i = 1; i <= n; i++) {
        s = order[i]
        printf "%10s | %8.3f %8.3f %8.3f %7s %7s | %9.2f %9.2f %9.2f | %10.1f %10.1f\n", s,
               fg[s], rg[s], pg[s], r(rg[s], fg[s]), r(pg[s], fg[s]), fu[s], ru[s], pu[s],
               cr[s], cp[s]
    }
}' "$TMP/bd.txt" "$TMP/pf.txt"
echo "(reg: publisher buffer from malloc, registered per buffer; pool: copied into the"
echo " publisher's pre-registered pool at publish. us: per fetch (fetch + wait) vs perftest's"
echo " time per get; us/MiB: publisher-side publish+free cost, registration vs pool copy.)"
