#!/usr/bin/env bash
# The wheel works where nothing of dataplane's dependencies is installed
# (`make wheel-check`; CI runs it):
#
#   tests/wheel/check_wheel.sh WHEEL
#
# 1. On this machine, in a fresh virtual environment: a C program compiled
#    against the wheel's headers and library (dataplane.get_include(),
#    get_lib(), and its pkg-config file) runs and prints the same version;
#    `uv pip install` of the wheel gives a working tool and package.
# 1b. `pip install` of the source distribution beside WHEEL (built here with
#    this machine's -dev packages) installs the same files, and its tool and
#    package run a cluster.
# 2. In a clean root: Debian 12 minbase with python3 and python3-venv only
#    (debootstrap, kept as a tarball in DP_ROOTFS_CACHE, default
#    /var/cache/dataplane, and made again when missing), which has none of
#    UCX, ZMQ, cJSON, libcurl, libmicrohttpd or libnuma (checked), entered
#    with chroot in new mount, PID, network, IPC and UTS namespaces (only
#    loopback): tests/wheel/in_root.sh installs the wheel in a fresh virtual
#    environment and runs a CURVE-authenticated cluster from it.
# Needs root (debootstrap, chroot, unshare).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
whl=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
[ -f "$whl" ] || { echo "check_wheel: no wheel $1" >&2; exit 1; }
fail() { echo "check_wheel: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || fail "needs root (debootstrap, chroot, unshare): run it as root"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dp-wheel.XXXXXX")
cleanup() {
    # the namespaces' mounts die with them; the root is plain files
    rm -rf "$tmp"
}
trap cleanup EXIT

# --- 1. C users, on this machine ------------------------------------------
py=${PYTHON:-$(cd "$here/../.." && pwd)/.venv-wheel/bin/python} # the one that built it
[ -x "$py" ] || py=python3
"$py" -m venv "$tmp/hv" || fail "$py -m venv failed"
"$tmp/hv/bin/pip" install -q --no-index --no-deps --disable-pip-version-check "$whl" ||
    fail "pip install $whl failed"
inc=$("$tmp/hv/bin/python" -c 'import dataplane; print(dataplane.get_include())')
lib=$("$tmp/hv/bin/python" -c 'import dataplane; print(dataplane.get_lib())')
pyv=$("$tmp/hv/bin/python" -c 'import dataplane; print(dataplane.__version__)')
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
cc -o "$tmp/v" "$tmp/v.c" -I"$inc" -L"$lib" -ldataplane -Wl,-rpath,"$lib" ||
    fail "a C program did not build against get_include()/get_lib()"
cv=$("$tmp/v") || fail "the C program failed"
[ "$cv" = "$pyv" ] || fail "C library says $cv, the package $pyv"
# shellcheck disable=SC2046
cc -o "$tmp/v2" "$tmp/v.c" $(PKG_CONFIG_PATH="$lib/pkgconfig" pkg-config --cflags --libs dataplane) \
    -Wl,-rpath,"$lib" || fail "a C program did not build with the wheel's pkg-config file"
[ "$("$tmp/v2")" = "$pyv" ] || fail "pkg-config build: wrong version"
grep -q "$lib" <(LD_DEBUG=libs "$tmp/v2" 2>&1 | grep 'calling init: .*libdataplane') ||
    fail "the C program did not load the wheel's libdataplane"
echo "check_wheel: C program against the wheel: version $cv (get_include/get_lib and pkg-config)"

# uv installs it the same way
uv=$(dirname "$py")/uv
if [ -x "$uv" ]; then
    "$uv" venv -q -p "$py" "$tmp/uv" && VIRTUAL_ENV=$tmp/uv "$uv" pip install -q --offline "$whl" ||
        fail "uv pip install $whl failed"
    [ "$("$tmp/uv/bin/dataplane" --version)" = "dataplane $pyv" ] &&
        "$tmp/uv/bin/python" -c 'import dataplane, sys; sys.exit(dataplane.get_lib() is None)' ||
        fail "the wheel installed by uv does not run"
    echo "check_wheel: uv pip install: dataplane $pyv runs"
fi

# --- 1b. pip install of the source distribution beside it (built here, --------
# against this machine's -dev packages): the same files, a working cluster
sdist=$(ls "$(dirname "$whl")"/dataplane-"$pyv".tar.gz 2>/dev/null || true)
if [ -n "$sdist" ]; then
    "$py" -m venv "$tmp/sv" || fail "$py -m venv failed"
    "$tmp/sv/bin/pip" install -q --no-deps --disable-pip-version-check "$sdist" >"$tmp/sdist.log" 2>&1 ||
        { tail -30 "$tmp/sdist.log" >&2; fail "pip install $(basename "$sdist") failed"; }
    list() { (cd "$1" && find dataplane dataplane_cli.py dataplane_tq_hook.py dataplane-tq.pth \
        -name __pycache__ -prune -o -type f -print | sort); }
    a=$(list "$("$tmp/hv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')")
    b=$(list "$("$tmp/sv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')")
    [ "$a" = "$b" ] || fail "the source distribution installs other files than the wheel: $(diff <(echo "$a") <(echo "$b"))"
    "$tmp/sv/bin/dataplane" up --units 2 --slab 64M --dir "$tmp/sc" >"$tmp/sup.log" 2>&1 &
    sup=$!
    "$tmp/sv/bin/python" - "$tmp/sc" <<'PY' || { kill $sup; cat "$tmp/sup.log" >&2; fail "the source install's cluster failed"; }
import os, sys, time, dataplane
d = sys.argv[1]
for _ in range(300):
    if os.path.exists(os.path.join(d, "cluster.json")):
        break
    time.sleep(0.1)
vals = [os.urandom(5000 + r) for r in range(16)]
with dataplane.Client(d) as c:
    c.put(list(range(16)), {"v": vals})
    assert [bytes(x) for x in c.get(list(range(16)), ["v"])["v"]] == vals
PY
    kill $sup && wait $sup 2>/dev/null || true
    echo "check_wheel: pip install $(basename "$sdist"): the wheel's files; its cluster puts and gets 16 values intact"
fi

# --- 2. the clean root ------------------------------------------------------
cache=${DP_ROOTFS_CACHE:-/var/cache/dataplane}
tarball=$cache/bookworm-minbase-python3.tar
if [ ! -s "$tarball" ]; then
    command -v debootstrap >/dev/null || fail "debootstrap is missing (scripts/deps.sh installs it)"
    mirror=${DP_DEBIAN_MIRROR:-http://deb.debian.org/debian}
    echo "check_wheel: making the clean root (debootstrap bookworm minbase + python3, python3-venv from $mirror; once, kept in $tarball)"
    mkdir -p "$cache"
    debootstrap --variant=minbase --include=python3,python3-venv bookworm "$tmp/mk" "$mirror" \
        >"$tmp/debootstrap.log" 2>&1 || { tail -20 "$tmp/debootstrap.log" >&2; fail "debootstrap failed"; }
    rm -rf "$tmp/mk/var/cache/apt/archives"/*.deb
    tar -C "$tmp/mk" -cf "$tarball.part" . && mv "$tarball.part" "$tarball"
    rm -rf "$tmp/mk"
fi
root=$tmp/root
mkdir -p "$root"
tar -C "$root" -xf "$tarball" || fail "cannot unpack $tarball (remove it to make it again)"

# none of what the wheel bundles is in the root
for p in libucx0 libzmq5 libcjson1 libcurl4 libmicrohttpd12 libnuma1 libsodium23; do
    if chroot "$root" dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        fail "the clean root has $p installed"
    fi
done
found=$(find "$root" \( -name 'libuc[pstm]*.so*' -o -name 'libzmq*.so*' -o -name 'libcjson*.so*' \
    -o -name 'libcurl*.so*' -o -name 'libmicrohttpd*.so*' -o -name 'libnuma*.so*' \) -print)
[ -z "$found" ] || fail "the clean root has: $found"

mkdir -p "$root/root/wheel"
cp "$whl" "$root/root/wheel/"
cp "$here/in_root.sh" "$root/root/in_root.sh"
unshare --mount --pid --fork --net --ipc --uts --propagation private sh -c '
    set -e
    r=$1
    ip link set lo up
    mount -t proc proc "$r/proc"
    mount -t sysfs sysfs "$r/sys"
    mount --rbind /dev "$r/dev"
    mount -t tmpfs -o size=512m tmpfs "$r/dev/shm"
    mount -t tmpfs tmpfs "$r/tmp"
    hostname clean-root
    exec chroot "$r" /usr/bin/env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/root \
        DP_LOG_LEVEL=warn /bin/sh /root/in_root.sh
' sh "$root" || fail "the wheel failed in the clean root (above)"
echo "check_wheel: passed"
