#!/bin/sh
# The shared library exports exactly the public API and is the client library:
#   check_exports.sh LIB HEADER_DIR...
# Fails when LIB exports a symbol no public header declares with DP_API (an
# internal helper leaked: dp__fail, dp__log, dp__*...), when a DP_API function
# is declared but not exported, when an internal function has the public dp_
# prefix, when LIB carries the unit's code, or when LIB itself needs libnuma
# (the unit's NUMA placement: only the unit links it; UCX's libucs may still
# pull it in).
set -eu
lib=$1
shift
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

nm -D --defined-only "$lib" | awk '{ print $NF }' | sort -u >"$tmp/exported"
# Every DP_API declaration names its function on the DP_API line.
for dir in "$@"; do
    cat "$dir"/*.h
done | grep '^DP_API' >"$tmp/lines" || true
sed -E -n 's/^DP_API[^(]*[ *](dp_[a-z0-9_]+)\(.*/\1/p' "$tmp/lines" | sort -u >"$tmp/declared"
if [ "$(wc -l <"$tmp/lines")" -ne "$(sed -E -n '/^DP_API[^(]*[ *]dp_[a-z0-9_]+\(/p' "$tmp/lines" | wc -l)" ]; then
    echo "FAIL: a DP_API line does not name a dp_ function:"
    grep -v -E '^DP_API[^(]*[ *]dp_[a-z0-9_]+\(' "$tmp/lines"
    exit 1
fi
status=0
extra=$(comm -23 "$tmp/exported" "$tmp/declared")
missing=$(comm -13 "$tmp/exported" "$tmp/declared")
if [ -n "$extra" ]; then
    echo "FAIL: exported by $lib but not in the public headers:"
    echo "$extra" | sed 's/^/  /'
    status=1
fi
if [ -n "$missing" ]; then
    echo "FAIL: declared DP_API but not exported by $lib:"
    echo "$missing" | sed 's/^/  /'
    status=1
fi
needed=$(readelf -d "$lib" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
if echo "$needed" | grep -q numa; then
    echo "FAIL: $lib needs libnuma (only the unit may link it): $needed" | tr '\n' ' '
    echo
    status=1
fi
if nm --defined-only "$lib" | grep -q ' [Tt] dp__unit_'; then
    echo "FAIL: $lib carries the storage unit's code:"
    nm --defined-only "$lib" | grep ' [Tt] dp__unit_' | head -5
    status=1
fi
# The dp_ prefix is the public API's: an internal function (hidden, so local
# in LIB) that carries it would read as public in a backtrace or a binding.
# Parts the compiler splits off a function (dp_x.cold, dp_x.part.0) count as
# the function.
nm --defined-only "$lib" | awk '$2 ~ /^[Tt]$/ && $3 ~ /^dp_[^_]/ { sub(/\..*/, "", $3); print $3 }' | sort -u \
    >"$tmp/plain"
misnamed=$(comm -23 "$tmp/plain" "$tmp/declared")
if [ -n "$misnamed" ]; then
    echo "FAIL: internal functions named like the public API (rename them dp__...):"
    echo "$misnamed" | sed 's/^/  /'
    status=1
fi
n=$(wc -l <"$tmp/exported")
if [ "$status" -eq 0 ]; then
    echo "ok: $n exported symbols, all public; needs: $(echo $needed)"
fi
exit $status
