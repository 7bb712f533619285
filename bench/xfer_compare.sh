#!/usr/bin/env bash
# Compare bench_xfer with ucx_perftest at the same message sizes, in the same run.
#
#   bench/xfer_compare.sh [BUILD_DIR] [-- extra bench_xfer args]
#
# Runs bench_xfer twice: "cold" (512 MiB buffers walked through, larger than the
# caches: the honest number) and "hot" (--hot: every message at offset 0, as
# ucx_perftest does with its one message-sized buffer: the like-for-like one).
# Then, per size, ucx_perftest ucp_put_bw and ucp_get (one-sided, -o: the
# responder does not progress) and ucp_put_lat, server and client on 127.0.0.1
# with a free port, REPS times each (median). Prints one table of GB/s and us
# with our/perftest ratios. perftest reports MB/s as MiB/s; converted to GB/s.
#
# Environment: SIZES (bytes, space separated), REPS (default 3), BENCH_REPS
# (default 5), UCX_TLS etc. pass through to both programs.
set -euo pipefail

BUILD=${1:-build}
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
shift || true
[[ "${1:-}" == "--" ]] && shift
BENCH="$BUILD/bench/bench_xfer"
[[ -x "$BENCH" ]] || { echo "no $BENCH: build the bench_xfer target first" >&2; exit 2; }
command -v ucx_perftest >/dev/null || { echo "ucx_perftest not installed (ucx-utils)" >&2; exit 2; }

SIZES=${SIZES:-"8 64 512 4096 32768 262144 1048576 4194304 16777216 67108864"}
REPS=${REPS:-3}
BENCH_REPS=${BENCH_REPS:-5}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"; jobs -p | xargs -r kill 2>/dev/null || true' EXIT



# perftest TEST SIZE FIELD -> FIELD of the final -f line:
#   iters, latency 50%ile, avg, overall (us), MB/s avg, overall, msg/s avg, overall
perftest() {
    local test=$1 size=$2 field=$3 iters warm port out srv extra=""
    iters=$(( (512 * 1024 * 1024) / size ))
    (( iters > 100000 )) && iters=100000
    (( iters < 50 )) && iters=50
    [[ $test == ucp_put_lat ]] && { iters=$(( iters > 20000 ? 20000 : iters )); } || extra="-o"
    warm=$(( iters / 10 + 1 ))
    for attempt in 1 2 3; do
        port=$(free_port)
        ucx_perftest -p "$port" >"$TMP/srv.txt" 2>&1 &
        srv=$!
        sleep 0.3
        if out=$(timeout 120 ucx_perftest 127.0.0.1 -p "$port" -t "$test" -s "$size" \
                 -n "$iters" -w "$warm" $extra -f 2>"$TMP/cli.err"); then
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
echo "### bench_xfer (cold: buffers larger than the caches)"
"$BENCH" --reps "$BENCH_REPS" --sizes "$SIZES_CSV" "$@" | tee "$TMP/cold.txt"
echo
echo "### bench_xfer --hot (like ucx_perftest: one buffer position)"
"$BENCH" --reps "$BENCH_REPS" --sizes "$SIZES_CSV" --hot --buf 64 --min-mib 256 "$@" |
    grep -v '^#' | tee "$TMP/hot.txt"
echo

printf '### ucx_perftest, %s reps each (median)\n' "$REPS"
for s in $SIZES; do
    pb=$(for i in $(seq "$REPS"); do perftest ucp_put_bw "$s" 6; done | median)
    gb=$(for i in $(seq "$REPS"); do perftest ucp_get "$s" 6; done | median)
    pl=$(for i in $(seq "$REPS"); do perftest ucp_put_lat "$s" 2; done | median)
    echo "$s $pb $gb $pl" >>"$TMP/pf.txt"
    printf '%10s put_bw %10s MB/s  get %10s MB/s  put_lat %8s us\n' "$s" "$pb" "$gb" "$pl"
done
echo

echo "### our / ucx_perftest (GB/s = 1e9 B/s; perftest MB/s are MiB/s)"
awk '
FILENAME ~ /cold/ && $1 == "RESULT" {cw[$2]=$3; cr[$2]=$4; cwl[$2]=$5; crl[$2]=$6}
FILENAME ~ /hot/  && $1 == "RESULT" {hw[$2]=$3; hr[$2]=$4}
FILENAME ~ /pf/   {pw[$1]=$2*1048576/1e9; pg[$1]=$3*1048576/1e9; pl[$1]=$4; order[++n]=$1}
function r(a, b) { return (b > 0) ? sprintf("%.2f", a / b) : "n/a" }
END {
    printf "%10s | %8s %8s %8s %6s %6s | %8s %8s %8s %6s %6s | %9s %9s\n", "size",
           "pf put", "hot WR", "cold WR", "hot/pf", "cold/pf",
           "pf get", "hot RD", "cold RD", "hot/pf", "cold/pf", "pf lat us", "WR lat us"
    for (i = 1; i <= n; i++) {
        s = order[i]
        printf "%10s | %8.3f %8.3f %8.3f %6s %6s | %8.3f %8.3f %8.3f %6s %6s | %9.2f %9.2f\n", s,
               pw[s], hw[s], cw[s], r(hw[s], pw[s]), r(cw[s], pw[s]),
               pg[s], hr[s], cr[s], r(hr[s], pg[s]), r(cr[s], pg[s]), pl[s], cwl[s]
    }
}' "$TMP/cold.txt" "$TMP/hot.txt" "$TMP/pf.txt"
echo "(pf lat: ucp_put_lat median, a ping-pong half round trip; WR lat: one blocking"
echo " single-range transfer() including its flush. Different measures, shown side by side.)"
