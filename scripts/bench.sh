#!/usr/bin/env bash
# Every benchmark, one after another (`make bench`). Each prints its own table
# with ratios against limits measured in the same run; nothing here asserts a
# timing. The whole suite takes several minutes; run a single one instead with
# its own command (see docs/benchmarks.md).
#
#   scripts/bench.sh [BUILD_DIR] [NAME...]
#
# NAMES: alloc crc32c wire ctl xfer direct client ssd compare latency rl_batch many python hosts cuda
# peers pervalue scale replicas (default: all but hosts, cuda, peers, pervalue, scale and replicas; hosts needs root: network
# namespaces; cuda a GPU and a python3, or $PYTHON, whose torch has CUDA; peers installs the peers
# from the package index; pervalue needs valgrind).
set -euo pipefail
build=${1:-build}
shift || true
root=$(cd "$(dirname "$0")/.." && pwd)
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(alloc crc32c wire ctl xfer direct ssd compare latency rl_batch many python)

run() {
    printf '\n==== %s ====\n' "$1"
    shift
    "$@"
}

for n in "${names[@]}"; do
    case "$n" in
    alloc) run "slab allocator: alloc/free pairs at 1e5 live blocks" "$build/bench/bench_alloc" ;;
    crc32c) run "CRC32C: SSE4.2 vs table" "$build/bench/bench_crc32c" ;;
    wire) run "control-message codec" "$build/bench/bench_wire" ;;
    ctl) run "control-plane round trips vs bare ZMQ" "$build/bench/bench_ctl" ;;
    xfer) run "endpoint WRITE/READ vs ucx_perftest" "$root/bench/xfer_compare.sh" "$build" ;;
    direct) run "direct transport fetch vs ucx_perftest get" "$root/bench/direct_compare.sh" "$build" ;;
    client) run "client put/get vs memcpy" "$build/bench/bench_client" ;;
    ssd) run "SSD tier spill/stage vs plain file I/O" "$build/bench/bench_ssd" "${TMPDIR:-/tmp}" ;;
    compare) run "put/get vs memcpy, ucx_perftest and Redis" "$root/bench/compare.sh" "$build" ;;
    latency) run "one small value's put + get vs a bare ZMQ round trip" "$root/bench/latency.sh" "$build" ;;
    rl_batch) run "an RL-shaped batch vs memcpy (C, with and without hints) and torch (Python)" "$root/bench/rl_batch.sh" "$build" ;;
    many) run "8 client processes at once vs memcpy on every core" "$root/bench/many_clients.sh" "$build" ;;
    python) run "Python package vs the C library, torch and redis-py" "$root/bench/python/run.sh" --build "$build" ;;
    hosts) run "across namespaces over TCP vs iperf3 and ucx_perftest" "$root/bench/hosts.sh" "$build" ;;
    peers) run "side by side with Mooncake Store, NIXL, TransferQueue and Ray" "$root/bench/peers/run.sh" "$build" ;;
    pervalue) run "what each value costs beyond its bytes: time and callgrind's instructions" "$root/bench/pervalue.sh" "$build" ;;
    scale) run "many units x many clients: open, batches, what each connection costs" "$root/bench/scale.sh" "$build" ;;
    replicas) run "put and get with 1, 2 and 3 copies of each row; a fallback; a repair" "$root/bench/replicas.sh" "$build" ;;
    cuda) run "CUDA tensors through the staging vs the device copies and host tensors" "${PYTHON:-python3}" "$root/bench/python/bench_cuda.py" --build "$build" ;;
    *)
        echo "bench.sh: unknown benchmark '$n' (alloc crc32c wire ctl xfer direct client ssd compare latency rl_batch many python hosts cuda peers pervalue scale replicas)" >&2
        exit 2
        ;;
    esac
done
