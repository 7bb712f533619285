#!/usr/bin/env bash
# Many units and many clients on this machine (issue 38's first measurement):
# bench/scale.py with each shape of SHAPES, N units x M clients, every client
# opening at about the same moment, then putting and getting a batch that
# touches every unit (content checked by each client). Reports open times,
# batch times against one client on 2 units, and per unit and per client the
# memory, descriptors and threads each connection costs, and the TCP
# connections. Timings are shown, never asserted.
#
#   bench/scale.sh [BUILD_DIR]
#
# Then, as root, HOST_SHAPES across three network-namespace hosts (units in
# host 0, clients in hosts 1 and 2: UCX over TCP).
#
# Environment: SHAPES ("16x32 64x128": UNITSxCLIENTS), HOST_SHAPES ("16x32
# 64x128"; empty: none), SLAB (32M), BYTES (64K), ROUNDS (3). The open-file
# limit is raised to the hard one here (each client holds descriptors per unit;
# the report says how many).
set -euo pipefail
build=${1:-build}
root=$(cd "$(dirname "$0")/.." && pwd)
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
run() { # SHAPE [--hosts]
    python3 "$root/bench/scale.py" "$build" --units "${1%x*}" --clients "${1#*x}" \
        --slab "${SLAB:-32M}" --bytes "${BYTES:-64K}" --rounds "${ROUNDS:-3}" "${@:2}"
    echo
}
for s in ${SHAPES-16x32 64x128}; do run "$s"; done
if [ "$(id -u)" -eq 0 ]; then
    for s in ${HOST_SHAPES-16x32 64x128}; do run "$s" --hosts; done
else
    echo "scale: across hosts needs root (network namespaces): skipped"
fi
