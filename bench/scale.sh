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
# Environment: SHAPES ("16x32 64x128": UNITSxCLIENTS), SLAB (32M), BYTES (64K),
# ROUNDS (3). Raise the open-file limit first for many clients: each client
# holds descriptors per unit (the report says how many).
set -euo pipefail
build=${1:-build}
root=$(cd "$(dirname "$0")/.." && pwd)
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
for s in ${SHAPES:-16x32 64x128}; do
    python3 "$root/bench/scale.py" "$build" --units "${s%x*}" --clients "${s#*x}" \
        --slab "${SLAB:-32M}" --bytes "${BYTES:-64K}" --rounds "${ROUNDS:-3}"
    echo
done
