#!/bin/sh
# make install and pip install work from a build tree (CTest test_install):
#   check_install.sh BUILD_DIR SOURCE_DIR PYTHON
# 1. `cmake --install BUILD --prefix P` into a temporary prefix: a C program
#    compiled with `pkg-config --cflags --libs dataplane` runs against the
#    installed library; the installed tool prints its version; the installed
#    Python package imports from outside the source tree and reports the same
#    version, loading the installed library (not the build tree's).
# 2. `pip install --no-build-isolation --no-index --target T SOURCE/python`
#    builds the package offline against BUILD and it imports from T.
# Both install dataplane-tq.pth, which registers the TransferQueue backend in
# every process of that site directory (checked where TransferQueue is installed).
set -eu
build=$1
src=$2
py=$3
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dp-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "check_install: $*" >&2; exit 1; }

cmake --install "$build" --prefix "$tmp/p" >"$tmp/install.log" 2>&1 ||
    { cat "$tmp/install.log" >&2; fail "cmake --install failed"; }
pc="$tmp/p/lib/pkgconfig"
[ -f "$pc/dataplane.pc" ] || fail "no dataplane.pc installed"
sed -i "s|^prefix=.*|prefix=$tmp/p|" "$pc/dataplane.pc"
cat >"$tmp/v.c" <<'C'
#include <stdio.h>
#include <string.h>
#include <dataplane/dataplane.h>
int main(void)
{
    printf("%s\n", dp_version_string());
    return strcmp(dp_version_string(), DP_VERSION_STRING) != 0;
}
C
# shellcheck disable=SC2046
cc -o "$tmp/v" "$tmp/v.c" $(PKG_CONFIG_PATH="$pc" pkg-config --cflags --libs dataplane) ||
    fail "a program built with pkg-config's flags did not compile"
lib_v=$(LD_LIBRARY_PATH="$tmp/p/lib" "$tmp/v") || fail "the C program failed"
cli_v=$("$tmp/p/bin/dataplane" --version) || fail "the installed tool failed"
case "$cli_v" in *"$lib_v"*) ;; *) fail "tool says '$cli_v', library '$lib_v'" ;; esac

site=$(find "$tmp/p" -type d -name dataplane -path '*-packages/*' | head -n1)
[ -n "$site" ] || fail "the Python package was not installed"
out=$(cd "$tmp" && PYTHONPATH=$(dirname "$site") "$py" -c '
import dataplane, dataplane._core as c, sys
print(dataplane.version(), dataplane.__file__)
print(open("/proc/self/maps").read().count("'"$tmp"'/p/lib/libdataplane"))
') || fail "the installed package does not import"
echo "$out" | head -n1 | grep -q "^$lib_v $site/__init__.py" ||
    fail "installed package: $out"
[ "$(echo "$out" | sed -n 2p)" -gt 0 ] || fail "the package did not load the installed library"

# dataplane-tq.pth: a site directory holding the install registers the
# TransferQueue backend in a process that imports only transfer_queue
check_pth() { # SITE_DIR WHAT
    [ -f "$1/dataplane-tq.pth" ] && [ -f "$1/dataplane_tq_hook.py" ] ||
        fail "$2: no dataplane-tq.pth and dataplane_tq_hook.py in $1"
    r=$(cd "$tmp" && env -u PYTHONPATH "$py" -c '
import site, sys
site.addsitedir(sys.argv[1])
print("dataplane_tq_hook" in sys.modules, end=" ")
try:
    import transfer_queue.storage.managers.base as b
except ImportError:
    print("no-tq")
else:
    print("Dataplane" in b.StorageManagerFactory._registry)
' "$1" 2>/dev/null) || fail "$2: the site directory does not load"
    case "$r" in
    "True True" | "True no-tq") ;;
    *) fail "$2: dataplane-tq.pth did not register the backend ($r)" ;;
    esac
}
check_pth "$(dirname "$site")" "make install"

if "$py" -m pip --version >/dev/null 2>&1; then
    cp -r "$src/python" "$tmp/pysrc"
    rm -rf "$tmp/pysrc/build" "$tmp/pysrc"/*.egg-info
    (cd "$tmp/pysrc" && DATAPLANE_BUILD="$build" "$py" -m pip install -q --no-build-isolation \
        --no-deps --no-index --target "$tmp/t" . >"$tmp/pip.log" 2>&1) ||
        { cat "$tmp/pip.log" >&2; fail "pip install failed"; }
    (cd "$tmp" && PYTHONPATH="$tmp/t" "$py" -c 'import dataplane; print(dataplane.version())') |
        grep -qx "$lib_v" || fail "the pip-installed package does not import"
    check_pth "$tmp/t" "pip install"
    echo "check_install: make install and pip install: ok ($lib_v)"
else
    echo "check_install: make install ok ($lib_v); no pip for $py: pip install not checked"
fi
