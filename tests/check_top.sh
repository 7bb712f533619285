#!/bin/sh
# `dataplane top` under a real terminal (tmux): it draws the units and the
# total, its rates move while a bench runs, and q quits it at once; piped,
# it prints plain blocks and stops after --iterations.
# Usage: check_top.sh BUILD_DIR   (exit 77: no tmux)
set -eu
cli=$(readlink -f "$1/dataplane")
command -v tmux >/dev/null 2>&1 || { echo "check_top: SKIPPED: no tmux (scripts/deps.sh installs it)"; exit 77; }
tmp=$(mktemp -d)
sock="$tmp/tmux.sock"
up_pid=""
cleanup() {
    tmux -S "$sock" kill-server 2>/dev/null || true
    [ -n "$up_pid" ] && kill "$up_pid" 2>/dev/null && wait "$up_pid" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "check_top: $*" >&2; [ -f "$tmp/pane" ] && cat "$tmp/pane" >&2; exit 1; }

"$cli" up --units 2 --slab 64M --dir "$tmp/c" >"$tmp/up.log" 2>&1 &
up_pid=$!
i=0
while [ ! -f "$tmp/c/cluster.json" ]; do
    i=$((i + 1)); [ $i -lt 400 ] || fail "no cluster after 20 s: $(cat "$tmp/up.log")"
    sleep 0.05
done

# Piped: plain blocks, exactly --iterations of them.
"$cli" top --cluster "$tmp/c" --iterations 2 --interval 0.2 >"$tmp/plain" 2>&1 || fail "top piped failed"
[ "$(grep -c '^dataplane top' "$tmp/plain")" = 2 ] || fail "piped: not 2 blocks: $(cat "$tmp/plain")"
grep -q '^total ' "$tmp/plain" || fail "piped: no total line"
if grep -q "$(printf '\033')" "$tmp/plain"; then fail "piped output has terminal escapes"; fi

# On a terminal.
tmux -S "$sock" new-session -d -x 200 -y 30 -s top "$cli top --cluster $tmp/c --interval 0.3; echo TOP-EXITED-\$?; sleep 30"
capture() { tmux -S "$sock" capture-pane -p -t top >"$tmp/pane"; }
wait_for() { # wait_for PATTERN WHAT
    i=0
    while :; do
        capture
        grep -q -- "$1" "$tmp/pane" && return 0
        i=$((i + 1)); [ $i -lt 100 ] || fail "$2"
        sleep 0.1
    done
}
wait_for '(q quits)' "no header with (q quits) on the terminal"
wait_for '^total ' "no total row on the terminal"
grep -q '^0 ' "$tmp/pane" && grep -q '^1 ' "$tmp/pane" || fail "no row per unit"

# Rates move while a bench runs.
"$cli" bench --cluster "$tmp/c" --iters 300 --rows 8 --bytes 64K >/dev/null 2>&1 &
bench=$!
moved=0
i=0
while [ $i -lt 100 ]; do
    capture
    # the commit/s column (3rd) of the total row
    v=$(awk '$1 == "total" {print $3}' "$tmp/pane")
    if [ -n "$v" ] && [ "$v" != 0 ]; then moved=1; break; fi
    i=$((i + 1)); sleep 0.1
done
kill "$bench" 2>/dev/null || true  # it may have ended already
wait "$bench" 2>/dev/null || true
[ $moved = 1 ] || fail "commit/s never moved while a bench ran"

# q quits at once, leaving the terminal as it was (exit 0).
tmux -S "$sock" send-keys -t top q
wait_for 'TOP-EXITED-0' "q did not end top with status 0"
# A terminal that goes away ends top: it must not run on, unseen.
tmux -S "$sock" new-session -d -x 200 -y 30 -s top2 "exec $cli top --cluster $tmp/c --interval 0.35"
i=0
until pgrep -f "^$cli top --cluster $tmp/c --interval 0.35" >/dev/null; do
    i=$((i + 1)); [ $i -lt 100 ] || fail "the second top did not start"
    sleep 0.05
done
tmux -S "$sock" kill-session -t top2
i=0
while pgrep -f "^$cli top --cluster $tmp/c --interval 0.35" >/dev/null; do
    i=$((i + 1)); [ $i -lt 100 ] || fail "top kept running after its terminal went away"
    sleep 0.05
done
echo "check_top: ok (piped blocks, terminal view, rates moved, q quit, hang-up ends it)"
