#!/usr/bin/env bash
# Put and get with 1, 2 and 3 copies of each row, in one run (issue 34):
#
#   large rows: 64 rows x 1 field x 1 MiB per batch
#   small rows: 1024 rows x 4 fields x 4 KiB per batch
#
# For each R: a 3-unit cluster with `dataplane up --replicas R` started here,
# `dataplane bench` of each shape, REPS rounds (the R's take turns within a
# round, so all see the same load); the table gives the medians in GB/s of
# the rows' bytes (one copy) and each R's ratio to R = 1. Then the cost of a
# fallback: R = 2, a batch put, its get timed (p50 of GETS gets), unit 0
# SIGKILLed and restarted empty by `up --restart` (no repair: --repair-rate
# 0), and the same gets timed
# again: each key of unit 0 is missing there and read from its next unit.
# Last the repair: R = 2, REPAIR_MB of 1 MiB rows put, unit 1 SIGKILLed and
# started again by `up --restart`, which fills itself from its peers at
# --repair-rate (REPAIR_RATE) while a foreground client puts and gets 64 x
# 1 MiB batches of other rows: the repair's GB/s, and the foreground's GB/s
# during it against before it. Timings are shown, never asserted.
#
#   bench/replicas.sh [BUILD_DIR]
#
# Environment: ITERS (bench iterations per round, 20), REPS (rounds, 3), SLAB
# (per unit, 1G), GETS (30), REPAIR_MB (512), REPAIR_RATE (256M), PYTHON
# (.venv/bin/python).
set -euo pipefail

BUILD=${1:-build}
CLI="$BUILD/dataplane"
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ITERS=${ITERS:-20}
REPS=${REPS:-3}
SLAB=${SLAB:-1G}
GETS=${GETS:-30}
REPAIR_MB=${REPAIR_MB:-512}
REPAIR_RATE=${REPAIR_RATE:-256M}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
[[ -x "$CLI" ]] || { echo "replicas.sh: no $CLI: build the dataplane-cli target" >&2; exit 2; }

TMP=$(mktemp -d "${TMPDIR:-/tmp}/dp-replicas.XXXXXX")
cleanup() {
    dp_down
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'echo "replicas.sh: interrupted" >&2; exit 130' INT TERM HUP

SHAPES=("large 64 1 1048576" "small 1024 4 4096")
for ((k = 1; k <= REPS; k++)); do
    for r in 1 2 3; do
        echo "### round $k of $REPS: dataplane up --units 3 --replicas $r"
        dp_up "$TMP/c$r.$k" --units 3 --replicas "$r" --slab "$SLAB"
        for shape in "${SHAPES[@]}"; do
            read -r name rows fields bytes <<<"$shape"
            echo "### R=$r $name rows: dataplane bench --rows $rows --fields $fields --bytes $bytes"
            "$CLI" bench --rows "$rows" --fields "$fields" --bytes "$bytes" --iters "$ITERS" \
                --warmup 3 | tee "$TMP/r$r.$name.$k"
        done
        dp_down
    done
done

echo
echo "### GB/s of the rows' bytes (1e9 B/s, one copy counted); ratios to R = 1"
printf '%-6s %-22s | %7s %7s | %7s %7s | %7s %7s | %9s %9s | %9s %9s\n' shape batch \
    "R1 put" "R1 get" "R2 put" "R2 get" "R3 put" "R3 get" "put R2/R1" "get R2/R1" \
    "put R3/R1" "get R3/R1"
for shape in "${SHAPES[@]}"; do
    read -r name rows fields bytes <<<"$shape"
    declare -A v=()
    for r in 1 2 3; do
        v[p$r]=$(for f in "$TMP/r$r.$name".*; do result "$f" put_GBps; done | median)
        v[g$r]=$(for f in "$TMP/r$r.$name".*; do result "$f" get_GBps; done | median)
    done
    awk -v n="$name" -v b="${rows}x${fields}x${bytes}B" -v p1="${v[p1]}" -v g1="${v[g1]}" \
        -v p2="${v[p2]}" -v g2="${v[g2]}" -v p3="${v[p3]}" -v g3="${v[g3]}" '
    function r(a, c) { return (a + 0 > 0 && c + 0 > 0) ? sprintf("%.2f", a / c) : "n/a" }
    function v(a) { return (a == "" || a == "nan") ? "n/a" : sprintf("%.3f", a) }
    BEGIN {
        printf "%-6s %-22s | %7s %7s | %7s %7s | %7s %7s | %9s %9s | %9s %9s\n", n, b,
            v(p1), v(g1), v(p2), v(g2), v(p3), v(g3), r(p2, p1), r(g2, g1), r(p3, p1), r(g3, g1)
    }'
done
echo "ours: a put or get of one whole batch, median of $REPS rounds; the cluster has 3"
echo "units on this host; a put writes every copy (R x the bytes), a get reads one."
echo "targets (issue 34): R = 2 put >= 0.6 x R = 1 on one host; get within 5% of R = 1."

# ---- a fallback's cost ----
echo
echo "### fallback: R = 2, 3 units (--restart), 1024 rows x 4 fields x 4 KiB; unit 0 killed"
dp_up "$TMP/fb" --units 3 --replicas 2 --slab "$SLAB" --restart --repair-rate 0
PYTHONPATH="$BUILD/python${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" - "$DP_CLUSTER" "$GETS" <<'EOF'
import json, os, signal, statistics, sys, time
import numpy as np
import dataplane

path, gets = sys.argv[1], int(sys.argv[2])
c = dataplane.Client(path, timeout_s=30)
rows = list(range(1024))
fields = ["a", "b", "c", "d"]
data = {f: np.random.default_rng(i).integers(0, 255, (1024, 4096), dtype=np.uint8)
        for i, f in enumerate(fields)}
c.put(rows, data)

def timed(label):
    t = []
    for _ in range(gets):
        t0 = time.perf_counter()
        got = c.get(rows, fields, stack=True)
        t.append(time.perf_counter() - t0)
    for f in fields:
        assert np.array_equal(np.asarray(got[f]), data[f]), "wrong bytes"
    p50 = statistics.median(t) * 1e3
    print(f"{label}: get p50 {p50:.2f} ms over {gets} gets (content checked)")
    return p50

before = timed("every first unit holds its rows")
pid = json.load(open(path))["units"][0]["pid"]
os.kill(pid, signal.SIGKILL)
end = time.monotonic() + 60
def pid0():
    try:
        return json.load(open(path))["units"][0]["pid"]
    except (OSError, ValueError):
        return pid  # being replaced
while pid0() == pid:
    assert time.monotonic() < end, "unit 0 was not restarted"
    time.sleep(0.05)
after = timed("unit 0 restarted empty (its keys read from unit 1)")
print(f"RESULT fallback_get_ms_before={before:.3f} fallback_get_ms_after={after:.3f} "
      f"ratio={after / before:.2f}")
c.close()
EOF
dp_down

# ---- the repair ----
echo
echo "### repair: R = 2, 3 units (--restart, --repair-rate $REPAIR_RATE), $REPAIR_MB x 1 MiB rows; unit 1 killed"
dp_up "$TMP/rp" --units 3 --replicas 2 --slab "$SLAB" --restart --repair-rate "$REPAIR_RATE"
PYTHONPATH="$BUILD/python${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" - "$DP_CLUSTER" "$REPAIR_MB" <<'EOF'
import json, os, signal, sys, time
import numpy as np
import dataplane

path, mb = sys.argv[1], int(sys.argv[2])
c = dataplane.Client(path, timeout_s=60)
one = np.random.default_rng(1).integers(0, 255, (64, 1 << 20), dtype=np.uint8)
for first in range(0, mb, 64):
    rows = list(range(first, min(first + 64, mb)))
    c.put(rows, {"x": one[: len(rows)]})
fg_rows = list(range(10**6, 10**6 + 64))


def foreground(until):
    """put + get of 64 x 1 MiB until until() says stop (at least 3 rounds): GB/s."""
    n, t0 = 0, time.perf_counter()
    while n < 3 or not until():
        c.put(fg_rows, {"x": one})
        got = c.get(fg_rows, ["x"], stack=True)["x"]
        n += 1
    assert np.array_equal(np.asarray(got), one), "wrong bytes"
    return 2 * n * one.nbytes / (time.perf_counter() - t0) / 1e9


t_end = time.monotonic() + 3
before = foreground(lambda: time.monotonic() > t_end)


def pid1():
    try:
        return json.load(open(path))["units"][1]["pid"]
    except (OSError, ValueError):
        return None


p = pid1()
os.kill(p, signal.SIGKILL)
while pid1() in (p, None):
    time.sleep(0.02)
t0 = time.monotonic()
state = {}


def repaired():
    st = c.stats()[1]
    state.update(st)
    return st["repair_state"] in (2, 3)


during = foreground(repaired)
took = time.monotonic() - t0
print(f"repair: {state['repair_keys']} keys, {state['repair_bytes'] / 1e6:.0f} MB in "
      f"{took:.2f} s: {state['repair_bytes'] / took / 1e9:.2f} GB/s (state {state['repair_state']})")
print(f"foreground put+get of 64 x 1 MiB: {before:.2f} GB/s before, {during:.2f} GB/s during "
      f"the repair: {during / before:.2f}x")
print(f"RESULT repair_GBps={state['repair_bytes'] / took / 1e9:.3f} fg_before_GBps={before:.3f} "
      f"fg_during_GBps={during:.3f} fg_ratio={during / before:.3f}")
c.close()
EOF
