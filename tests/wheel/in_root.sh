#!/bin/sh
# Run by tests/wheel/check_wheel.sh inside the clean root (Debian 12 minbase
# with python3 only; loopback only): the wheel in /root/wheel installed in a
# fresh virtual environment, then a CURVE-authenticated 2-unit cluster from it,
# a put and get with content checks from the tool and from Python, `policy`,
# `stats --lanes`, and what every process mapped.
set -eu
fail() { echo "in_root: $*" >&2; exit 1; }
cd /root
python3 -m venv /root/venv || fail "python3 -m venv failed"
/root/venv/bin/pip install -q --no-index --no-deps --disable-pip-version-check /root/wheel/*.whl ||
    fail "pip install of the wheel failed"
PATH=/root/venv/bin:$PATH
export PATH

# one version everywhere
tool=$(dataplane --version)
mod=$(python -m dataplane --version)
pkg=$(python -c 'import dataplane; print(dataplane.__version__)')
meta=$(python -c 'import importlib.metadata as m; print(m.version("dataplane"))')
[ "$tool" = "dataplane $pkg" ] && [ "$mod" = "$tool" ] && [ "$meta" = "$pkg" ] ||
    fail "versions differ: tool '$tool', python -m '$mod', package '$pkg', metadata '$meta'"
echo "in_root: dataplane $pkg (tool, python -m dataplane, __version__ and the wheel's metadata agree)"

# a cluster that admits one client key
dataplane keygen --out /root/unit >/dev/null
dataplane keygen --out /root/trainer >/dev/null
mkdir -p /root/allow && cp /root/trainer.pub /root/allow/
dataplane up --units 2 --slab 64M --dir /root/c --curve-secret /root/unit.key \
    --curve-allow /root/allow >/root/up.log 2>&1 &
up=$!
trap 'kill $up 2>/dev/null; wait $up 2>/dev/null || true' EXIT
i=0
until [ -s /root/c/cluster.json ]; do
    i=$((i + 1))
    [ $i -lt 300 ] || { cat /root/up.log >&2; fail "dataplane up did not write its cluster file in 30 s"; }
    kill -0 $up 2>/dev/null || { cat /root/up.log >&2; fail "dataplane up exited"; }
    sleep 0.1
done
export DP_CLUSTER=/root/c

# without the key: refused
if dataplane stats >/root/nokey.log 2>&1; then fail "a client without a key was served"; fi
grep -q "CURVE" /root/nokey.log || { cat /root/nokey.log >&2; fail "no CURVE refusal"; }
export DP_CURVE_SECRET=/root/trainer.key

# the tool: 3 MB of random bytes in and out
head -c 3000000 /dev/urandom >/root/v.bin
dataplane put --row 7 --field blob --file /root/v.bin
dataplane get 7@blob -o /root/v.out >/dev/null
cmp /root/v.bin /root/v.out || fail "the tool got back other bytes than it put"
echo "in_root: tool put/get of 3 MB: same bytes"

# Python: 64 rows x 2 fields of bytes, CRC-checked; the tool's value too
python - <<'PY' || fail "the Python put/get failed"
import os, zlib, dataplane
rows = list(range(100, 164))
vals = {f: [os.urandom(1000 + 37 * r) for r in rows] for f in ("a", "b")}
with dataplane.Client("/root/c", curve_secret="/root/trainer.key") as c:
    c.put(rows, vals)
    got = c.get(rows, ["a", "b"])
    for f in vals:
        for want, have in zip(vals[f], got[f]):
            assert zlib.crc32(bytes(have)) == zlib.crc32(want), f"field {f}: other bytes"
    tool = c.get([7], ["blob"])["blob"][0]
    assert bytes(tool) == open("/root/v.bin", "rb").read(), "the tool's value differs"
    maps = open("/proc/self/maps").read()
print(f"in_root: Python put/get of {len(rows)} rows x 2 fields: same bytes (CRC32)")
# the client's libraries are the wheel's
for lib in ("libdataplane", "libucp", "libuct", "libucs", "libzmq", "libcjson", "libcurl"):
    paths = {l.split()[-1] for l in maps.splitlines() if f"/{lib}" in l}
    assert paths and all(p.startswith("/root/venv/") for p in paths), (lib, paths)
PY

# policy: the wheel's UCX answers (TCP is refused, RDMA-only is checked)
if dataplane policy --tls tcp >/root/policy.log 2>&1; then fail "policy allowed TCP"; fi
grep -q "refused" /root/policy.log || { cat /root/policy.log >&2; fail "policy said no verdict"; }
echo "in_root: policy --tls tcp: $(head -n1 /root/policy.log)"

# stats --lanes: the transports UCX opened, cma among them (a module the wheel carries)
dataplane stats --lanes >/root/lanes.log 2>&1 || { cat /root/lanes.log >&2; fail "stats --lanes failed"; }
grep "transports:\|lanes:" /root/lanes.log | sed 's/^/in_root: /'
grep -q "transports: unit 0: .*cma" /root/lanes.log || fail "UCX did not open cma (its module) on unit 0"
grep -q "lanes: unit 0: shm" /root/lanes.log || fail "unit 0's lanes are not shared memory"

# every library a unit mapped: the wheel's, else glibc's and the manylinux
# policy's system libraries (libstdc++, libgcc_s, libz)
python - <<'PY' || fail "a unit mapped a library from outside the wheel"
import json
units = json.load(open("/root/c/cluster.json"))["units"]
allowed = ("libc.so", "libm.so", "libpthread.so", "libdl.so", "librt.so", "ld-linux",
           "libgcc_s.so", "libstdc++.so", "libz.so", "libresolv.so")
mods = set()
for u in units:
    for line in open(f"/proc/{u['pid']}/maps"):
        p = line.split()[-1]
        if ".so" not in p:
            continue
        if p.startswith("/root/venv/"):
            if "/dataplane.libs/ucx/" in p:
                mods.add(p.rsplit("/", 1)[1])
            continue
        name = p.rsplit("/", 1)[1]
        assert name.startswith(allowed), f"unit {u['pid']} mapped {p}"
assert any(m.startswith("libuct_cma") for m in mods), mods
print("in_root: units map only the wheel's libraries and glibc's; UCX modules loaded from the wheel:",
      ", ".join(sorted(mods)))
PY
echo "in_root: passed"
