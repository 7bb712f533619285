#!/usr/bin/env bash
# Does scraping a unit's /metrics slow puts and gets? One 2-unit cluster
# (`dataplane up --metrics`), `dataplane bench` rounds taking turns: without a
# scraper, then with one fetching both units' /metrics every SCRAPE_MS (100 ms:
# 20x what a Prometheus at 1 s does to 2 units), for each shape: 64 x 1 MiB and
# 1024 x 4 x 4 KiB. Prints the median GB/s of each and the ratio with/without.
# Also the cost of one scrape (median wall time of a fetch, and its size).
#
#   bench/metrics.sh [BUILD_DIR]
#
# Environment: ITERS (bench iterations per round, 30), REPS (rounds, 5),
# SCRAPE_MS (100), SLAB (1G). Timings are shown, never asserted.
set -euo pipefail
BUILD=${1:-build}
CLI="$BUILD/dataplane"
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ITERS=${ITERS:-30}
REPS=${REPS:-5}
SCRAPE_MS=${SCRAPE_MS:-100}
SLAB=${SLAB:-1G}
[[ -x "$CLI" ]] || { echo "metrics.sh: no $CLI: build first (make)" >&2; exit 2; }
command -v curl >/dev/null || { echo "metrics.sh: needs curl" >&2; exit 2; }
TMP=$(mktemp -d "${TMPDIR:-/tmp}/dp-metrics.XXXXXX")
scr_pid=""
cleanup() {
    [[ -n "$scr_pid" ]] && kill "$scr_pid" 2>/dev/null && wait "$scr_pid" 2>/dev/null
    dp_down
    rm -rf "$TMP"
}
trap cleanup EXIT

port=$(( (RANDOM % 20000) + 30000 ))
dp_up "$TMP/cluster" --units 2 --slab "$SLAB" --metrics "127.0.0.1:$port"
urls=("http://127.0.0.1:$port/metrics" "http://127.0.0.1:$((port + 1))/metrics")
for u in "${urls[@]}"; do curl -sf --noproxy '*' "$u" >/dev/null || { echo "metrics.sh: $u does not answer" >&2; exit 1; }; done

scraper() {
    while :; do
        for u in "${urls[@]}"; do curl -s --noproxy '*' -o /dev/null "$u"; done
        sleep "$(awk -v m="$SCRAPE_MS" 'BEGIN {print m / 1000}')"
    done
}

echo "bench/metrics.sh: 2 units, $REPS rounds x $ITERS iterations per shape, scraper every ${SCRAPE_MS} ms"
printf "%-18s %10s %10s %10s %10s %8s %8s\n" shape put_plain put_scraped get_plain get_scraped put_x get_x
for shape in "64 1 1M" "1024 4 4K"; do
    read -r rows fields bytes <<<"$shape"
    : >"$TMP/pp"; : >"$TMP/ps"; : >"$TMP/gp"; : >"$TMP/gs"
    for r in $(seq "$REPS"); do
        for mode in plain scraped; do
            if [[ $mode == scraped ]]; then scraper & scr_pid=$!; fi
            "$CLI" bench --rows "$rows" --fields "$fields" --bytes "$bytes" --iters "$ITERS" \
                --warmup 3 --no-verify >"$TMP/out" 2>/dev/null
            if [[ $mode == scraped ]]; then kill "$scr_pid"; wait "$scr_pid" 2>/dev/null || true; scr_pid=""; fi
            if [[ $mode == plain ]]; then
                result "$TMP/out" put_GBps >>"$TMP/pp"; result "$TMP/out" get_GBps >>"$TMP/gp"
            else
                result "$TMP/out" put_GBps >>"$TMP/ps"; result "$TMP/out" get_GBps >>"$TMP/gs"
            fi
        done
    done
    pp=$(median <"$TMP/pp"); ps=$(median <"$TMP/ps"); gp=$(median <"$TMP/gp"); gs=$(median <"$TMP/gs")
    printf "%-18s %10.3f %10.3f %10.3f %10.3f %8.2f %8.2f\n" "${rows}x${fields}x${bytes}" \
        "$pp" "$ps" "$gp" "$gs" "$(awk -v a="$ps" -v b="$pp" 'BEGIN{print a/b}')" \
        "$(awk -v a="$gs" -v b="$gp" 'BEGIN{print a/b}')"
done
# One scrape: wall time (median of 50) and size.
for _ in $(seq 50); do curl -s --noproxy '*' -o /dev/null -w '%{time_total}\n' "${urls[0]}"; done | median >"$TMP/t"
size=$(curl -s --noproxy '*' "${urls[0]}" | wc -c)
echo "one scrape: $(awk '{printf "%.3f", $1 * 1000}' "$TMP/t") ms median (curl, 50 fetches), $size bytes"
