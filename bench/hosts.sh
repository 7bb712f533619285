#!/usr/bin/env bash
# Across machines without RDMA, on one host (issue 14): two "hosts", each a
# network namespace with one veth on a bridge that lives in a third
# namespace (addresses 10.215.0.1 and .2, reachable only inside them; nothing
# is added to this machine's own namespace). The units run in host 0, every
# client in host 1 with its own IPC, PID and UTS namespaces, so UCX must treat
# the unit as another machine and use TCP. In one run:
#
#   the link:      iperf3, 1 and 2 streams (host 1 -> host 0)
#   UCX over it:   ucx_perftest am_bw, tag_bw, stream_bw (and ucp_put_bw,
#                  ucp_get: the emulated RMA) at 1 MiB and 4 KiB, UCX_TLS=tcp
#   ours:          `dataplane bench` for 64 x 1 MiB and 1024 x 4 x 4 KiB, with
#                  the default path (two-sided over TCP) and with
#                  DP_TWO_SIDED=never (UCX's emulated RMA), lanes printed
#
# and a table of GB/s (1e9 B/s) with ratios to iperf3's one stream. Goals:
# 64 x 1 MiB >= 0.8x, 1024 x 4 x 4 KiB >= 0.5x. Timings are shown, never
# asserted. Needs root (network namespaces).
#
#   bench/hosts.sh [BUILD_DIR]
#
# Then the same units again with two copies of each row (`up --replicas 2`,
# REPLICAS=1 skips it): put and get against the one-copy run (a put at R = 2
# carries twice the bytes over the link; goal >= 0.45x, get within 5%).
#
# Environment: ITERS (dataplane bench iterations, 20), REPS (rounds, median
# taken, 3), SLAB (per unit, 1G), UNITS (2), SECS (iperf3 seconds, 3),
# REPLICAS (2).
set -euo pipefail

BUILD=${1:-build}
CLI="$(cd "$BUILD" && pwd)/dataplane"
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ITERS=${ITERS:-20}
REPS=${REPS:-3}
SLAB=${SLAB:-1G}
UNITS=${UNITS:-2}
SECS=${SECS:-3}
REPLICAS=${REPLICAS:-2}
[[ -x "$CLI" ]] || { echo "hosts.sh: no $CLI: build first (make)" >&2; exit 2; }
[[ $(id -u) -eq 0 ]] || { echo "hosts.sh: needs root (network namespaces)" >&2; exit 2; }
for t in ip iperf3 ucx_perftest unshare; do
    command -v "$t" >/dev/null || { echo "hosts.sh: $t is missing (scripts/deps.sh)" >&2; exit 2; }
done

P="dphb-$$"
SW="$P-sw" H0="$P-h0" H1="$P-h1"
A0=10.215.0.1 A1=10.215.0.2
TMP=$(mktemp -d "${TMPDIR:-/tmp}/dp-hosts.XXXXXX")
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    # What runs inside the hosts (iperf3, the units) goes with them.
    for n in "$H1" "$H0"; do
        ip netns pids "$n" 2>/dev/null | xargs -r kill 2>/dev/null || true
    done
    sleep 0.5
    for n in "$H1" "$H0"; do
        ip netns pids "$n" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    for n in "$H1" "$H0" "$SW"; do ip netns del "$n" 2>/dev/null || true; done
    rm -rf "$TMP"
}
trap cleanup EXIT INT TERM

ip netns add "$SW"
ip netns add "$H0"
ip netns add "$H1"
ip -n "$SW" link set lo up
ip -n "$SW" link add br0 type bridge
ip -n "$SW" link set br0 up
i=0
for h in "$H0" "$H1"; do
    ip -n "$SW" link add "p$i" type veth peer name eth0 netns "$h"
    ip -n "$SW" link set "p$i" master br0 up
    ip -n "$h" link set lo up
    ip -n "$h" addr add "10.215.0.$((i + 1))/24" dev eth0
    ip -n "$h" link set eth0 up
    i=$((i + 1))
done
# Run "$@" inside host $1 as another machine (own IPC, PID and UTS namespaces).
in_host() {
    local h=$1
    shift
    ip netns exec "$h" unshare --ipc --pid --uts --fork "$@"
}

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "nan" || b == "nan" || b == 0) print "-"; else printf "%.2f", a / b }'; }

echo "### the link: iperf3 host 1 -> host 0, ${SECS}s, $REPS rounds"
in_host "$H0" iperf3 -s -p 5201 >/dev/null 2>&1 &
pids+=($!)
sleep 0.5
iperf() { # streams -> GB/s
    in_host "$H1" iperf3 -c "$A0" -p 5201 -t "$SECS" -P "$1" -J 2>/dev/null |
        /usr/bin/python3 -c 'import json,sys; print("%.3f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"] / 8e9))'
}
: >"$TMP/ip1"
: >"$TMP/ip2"
for k in $(seq "$REPS"); do
    iperf 1 >>"$TMP/ip1"
    iperf 2 >>"$TMP/ip2"
done
IP1=$(median <"$TMP/ip1")
IP2=$(median <"$TMP/ip2")
echo "iperf3: 1 stream $(tr '\n' ' ' <"$TMP/ip1")-> $IP1 GB/s; 2 streams $(tr '\n' ' ' <"$TMP/ip2")-> $IP2 GB/s"

echo "### UCX over the link: ucx_perftest, UCX_TLS=tcp"
perftest() { # test size iters -> GB/s (its average MB/s is MiB/s)
    local port=$((20000 + RANDOM % 20000))
    in_host "$H0" env UCX_TLS=tcp ucx_perftest -p "$port" >/dev/null 2>&1 &
    local sp=$!
    sleep 0.7
    local out
    out=$(in_host "$H1" env UCX_TLS=tcp timeout 60 ucx_perftest "$A0" -p "$port" -t "$1" -s "$2" -n "$3" 2>/dev/null |
        awk '$1 == "Final:" {print $6}')
    wait "$sp" 2>/dev/null || true
    awk -v v="${out:-nan}" 'BEGIN { if (v == "nan" || v == "") print "nan"; else printf "%.3f", v * 1048576 / 1e9 }'
}
declare -A PT
for t in ucp_am_bw tag_bw stream_bw ucp_put_bw ucp_get; do
    PT[$t,1M]=$(perftest "$t" 1048576 300)
    PT[$t,4K]=$(perftest "$t" 4096 20000)
    echo "$t: 1 MiB ${PT[$t,1M]} GB/s, 4 KiB ${PT[$t,4K]} GB/s"
done

echo "### ours: $UNITS units in host 0, dataplane bench in host 1"
in_host "$H0" "$CLI" up --units "$UNITS" --slab "$SLAB" --bind "$A0" --dir "$TMP/c" \
    >"$TMP/up.log" 2>&1 &
pids+=($!)
for _ in $(seq 300); do
    [[ -f "$TMP/c/cluster.json" ]] && break
    sleep 0.1
done
[[ -f "$TMP/c/cluster.json" ]] || { echo "hosts.sh: the units did not start:" >&2; cat "$TMP/up.log" >&2; exit 1; }
declare -A OURS
for mode in auto never; do
    for shape in large small; do
        if [[ $shape == large ]]; then args=(--rows 64 --fields 1 --bytes 1M); else args=(--rows 1024 --fields 4 --bytes 4K); fi
        : >"$TMP/put"
        : >"$TMP/get"
        for k in $(seq "$REPS"); do
            in_host "$H1" env DP_TWO_SIDED="$mode" "$CLI" bench --cluster "$TMP/c" "${args[@]}" \
                --iters "$ITERS" >"$TMP/b" 2>&1 || { cat "$TMP/b" >&2; exit 1; }
            [[ $k -eq 1 ]] && echo "$mode $shape: $(grep '^lanes:' "$TMP/b")"
            result "$TMP/b" put_GBps >>"$TMP/put"
            result "$TMP/b" get_GBps >>"$TMP/get"
        done
        OURS[$mode,$shape,put]=$(median <"$TMP/put")
        OURS[$mode,$shape,get]=$(median <"$TMP/get")
        echo "$mode $shape: put $(tr '\n' ' ' <"$TMP/put")-> ${OURS[$mode,$shape,put]}; get $(tr '\n' ' ' <"$TMP/get")-> ${OURS[$mode,$shape,get]} GB/s"
    done
done

echo
echo "### GB/s (1e9 B/s), medians of $REPS; x link = over iperf3 1 stream ($IP1 GB/s; 2 streams $IP2)"
printf "%-26s %8s %8s %9s %9s %12s %12s\n" "shape" "put" "get" "put/link" "get/link" "put/emulated" "get/emulated"
for shape in large small; do
    if [[ $shape == large ]]; then name="64 x 1 MiB"; else name="1024 x 4 x 4 KiB"; fi
    a=${OURS[auto,$shape,put]} b=${OURS[auto,$shape,get]}
    printf "%-26s %8s %8s %9s %9s %12s %12s\n" "$name" "$a" "$b" "$(ratio "$a" "$IP1")" \
        "$(ratio "$b" "$IP1")" "$(ratio "$a" "${OURS[never,$shape,put]}")" \
        "$(ratio "$b" "${OURS[never,$shape,get]}")"
    printf "%-26s %8s %8s %9s %9s\n" "  (UCX emulated RMA)" "${OURS[never,$shape,put]}" \
        "${OURS[never,$shape,get]}" "$(ratio "${OURS[never,$shape,put]}" "$IP1")" \
        "$(ratio "${OURS[never,$shape,get]}" "$IP1")"
done
echo "ucx_perftest 1 MiB: am ${PT[ucp_am_bw,1M]}, tag ${PT[tag_bw,1M]}, stream ${PT[stream_bw,1M]}, put ${PT[ucp_put_bw,1M]}, get ${PT[ucp_get,1M]}"
echo "ucx_perftest 4 KiB: am ${PT[ucp_am_bw,4K]}, tag ${PT[tag_bw,4K]}, stream ${PT[stream_bw,4K]}, put ${PT[ucp_put_bw,4K]}, get ${PT[ucp_get,4K]}"

if [[ $REPLICAS -gt 1 && $UNITS -ge $REPLICAS ]]; then
    echo
    echo "### ours with $REPLICAS copies of each row: $UNITS units in host 0 (up --replicas $REPLICAS)"
    for p in $(ip netns pids "$H0" 2>/dev/null); do
        grep -qa 'dataplane' "/proc/$p/cmdline" 2>/dev/null && kill "$p" 2>/dev/null || true
    done
    for _ in $(seq 100); do [[ -f "$TMP/c/cluster.json" ]] || break; sleep 0.1; done
    in_host "$H0" "$CLI" up --units "$UNITS" --replicas "$REPLICAS" --slab "$SLAB" --bind "$A0" \
        --dir "$TMP/r" >"$TMP/up-r.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 300); do
        [[ -f "$TMP/r/cluster.json" ]] && break
        sleep 0.1
    done
    [[ -f "$TMP/r/cluster.json" ]] || { echo "hosts.sh: the units did not start:" >&2; cat "$TMP/up-r.log" >&2; exit 1; }
    printf "%-26s %8s %8s %12s %12s\n" "shape" "put" "get" "put/R=1" "get/R=1"
    for shape in large small; do
        if [[ $shape == large ]]; then args=(--rows 64 --fields 1 --bytes 1M); name="64 x 1 MiB"; else args=(--rows 1024 --fields 4 --bytes 4K); name="1024 x 4 x 4 KiB"; fi
        : >"$TMP/put"
        : >"$TMP/get"
        for k in $(seq "$REPS"); do
            in_host "$H1" "$CLI" bench --cluster "$TMP/r" "${args[@]}" --iters "$ITERS" \
                >"$TMP/b" 2>&1 || { cat "$TMP/b" >&2; exit 1; }
            result "$TMP/b" put_GBps >>"$TMP/put"
            result "$TMP/b" get_GBps >>"$TMP/get"
        done
        a=$(median <"$TMP/put") b=$(median <"$TMP/get")
        printf "%-26s %8s %8s %12s %12s\n" "$name" "$a" "$b" "$(ratio "$a" "${OURS[auto,$shape,put]}")" \
            "$(ratio "$b" "${OURS[auto,$shape,get]}")"
    done
    echo "GB/s of the rows' bytes (one copy counted); R=1: the default-path rows above"
fi
