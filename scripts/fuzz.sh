#!/usr/bin/env bash
# Run every libFuzzer target in BUILD for SECONDS each, starting from its seed
# corpus in fuzz/corpus/<target>/. Fails on the first crash or sanitizer report;
# the reproducer is left in fuzz/artifacts/.
set -euo pipefail
build=${1:-build-fuzz}
seconds=${2:-20}
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$root/fuzz/artifacts"
status=0
ran=0
for bin in "$build"/fuzz/fuzz_*; do
    [ -x "$bin" ] || continue
    name=$(basename "$bin")
    seeds="$root/fuzz/corpus/$name"
    work=$(mktemp -d)
    [ -d "$seeds" ] && cp -r "$seeds"/. "$work"/ 2>/dev/null || true
    echo "fuzz: $name for ${seconds}s"
    if ! "$bin" -max_total_time="$seconds" -rss_limit_mb=2048 -malloc_limit_mb=1024 \
        -timeout=10 -print_final_stats=1 -artifact_prefix="$root/fuzz/artifacts/$name-" \
        "$work" >"$work.log" 2>&1; then
        echo "fuzz: $name FAILED; log follows" >&2
        tail -n 60 "$work.log" >&2
        status=1
    else
        grep -E '^stat::number_of_executed_units|^Done' "$work.log" | sed "s/^/  /" || true
    fi
    rm -rf "$work" "$work.log"
    ran=$((ran + 1))
done
if [ "$ran" -eq 0 ]; then
    echo "fuzz: no fuzz targets found in $build/fuzz" >&2
    exit 1
fi
echo "fuzz: $ran targets, $([ $status -eq 0 ] && echo clean || echo FAILED)"
exit $status
