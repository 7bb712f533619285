# shellcheck shell=bash
# Helpers the benchmark scripts source (bash): medians, RESULT fields, a free
# port, and a local cluster started and stopped for them.
#
#   . "$(dirname "${BASH_SOURCE[0]}")/lib.sh"   # needs CLI (the dataplane binary)

# Median of the numbers on stdin, one per line ("nan" for none).
median() { sort -g | awk '{v[NR]=$1} END {if (NR==0) print "nan"; else if (NR%2) print v[(NR+1)/2]; else print (v[NR/2]+v[NR/2+1])/2}'; }

# result FILE KEY: the value of KEY=... on FILE's last RESULT line.
result() { awk -v k="$2" '$1 == "RESULT" { for (i = 2; i <= NF; i++) { split($i, kv, "="); if (kv[1] == k) print kv[2] } }' "$1" | tail -1; }

# A TCP port free on 127.0.0.1 now.
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' \
        2>/dev/null || echo $((20000 + RANDOM % 40000))
}

# dp_up DIR [up options...]: `$CLI up --dir DIR ...` in the background (its
# output in DIR.out and DIR.err), waits up to 120 s for DIR/cluster.json and
# exports DP_CLUSTER; DP_UP_PID is its pid. Exits 1, with up's stderr, when it
# stops or does not come up.
DP_UP_PID=""
dp_up() {
    local dir=$1 i
    shift
    "$CLI" up --dir "$dir" "$@" >"$dir.out" 2>"$dir.err" &
    DP_UP_PID=$!
    for ((i = 0; i < 1200; i++)); do
        [[ -f "$dir/cluster.json" ]] && { export DP_CLUSTER="$dir/cluster.json"; return 0; }
        kill -0 "$DP_UP_PID" 2>/dev/null || break
        sleep 0.1
    done
    cat "$dir.err" >&2
    echo "$(basename "$0"): dataplane up did not start" >&2
    exit 1
}

# dp_down: stops the cluster of dp_up (SIGTERM; up stops its units), if it runs.
dp_down() {
    if [[ -n "$DP_UP_PID" ]] && kill -0 "$DP_UP_PID" 2>/dev/null; then
        kill -TERM "$DP_UP_PID" 2>/dev/null || true
        wait "$DP_UP_PID" 2>/dev/null || true
    fi
    DP_UP_PID=""
}
