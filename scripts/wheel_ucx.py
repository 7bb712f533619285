#!/usr/bin/env python3
"""Add UCX's transport modules to a wheel that auditwheel repaired.

    wheel_ucx.py WHEEL MODULE_DIR

UCX loads its transports (cma, ib, rdmacm, ...) as plugins, with dlopen, from
the directory `ucx` beside the libucs it was loaded from, named like that
libucs's file (libucs-1a2b3c4d.so.0.0.0 -> libuct_cma.so.0.0.0). auditwheel
cannot see them (nothing links them), so this copies MODULE_DIR's modules to
<pkg>.libs/ucx/ in WHEEL, points their links at the libraries the wheel
bundles (patchelf), and packs the wheel again in place (its RECORD
rewritten). Libraries a module needs that the wheel does not bundle (the
host's RDMA stack: libibverbs, librdmacm, libmlx5) stay the host's: on a host
without them that module does not load and UCX goes on without it.
GPU modules (cuda, rocm, gdrcopy, ze) are left out: the wheel is for hosts
without a GPU stack of its choosing (docs/packaging.md).
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile

GLIBC = ("libc.", "libm.", "libpthread.", "libdl.", "librt.")
SKIP = re.compile(r"cuda|rocm|gdr|_ze|xpmem|knem")


def run(*args):
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout


def needed(path):
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", run("readelf", "-d", path))


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    wheel, moddir = os.path.abspath(sys.argv[1]), sys.argv[2]
    if not os.path.isdir(moddir):
        sys.exit(f"wheel_ucx: no UCX module directory {moddir}")
    tmp = tempfile.mkdtemp(prefix="dp-wheel-")
    try:
        subprocess.run([sys.executable, "-m", "wheel", "unpack", "-d", tmp, wheel], check=True,
                       stdout=subprocess.DEVNULL)
        (root,) = [os.path.join(tmp, d) for d in os.listdir(tmp)]
        libs = [d for d in os.listdir(root) if d.endswith(".libs")]
        if len(libs) != 1:
            sys.exit(f"wheel_ucx: {wheel} has no single <package>.libs directory (run auditwheel repair first)")
        libdir = os.path.join(root, libs[0])
        bundled = os.listdir(libdir)
        ucs = [f for f in bundled if re.match(r"libucs-[0-9a-f]+\.so", f)]
        if len(ucs) != 1:
            sys.exit(f"wheel_ucx: no bundled libucs in {libdir}")
        ext = ucs[0][ucs[0].index(".so"):]  # what UCX appends to a module's name

        # soname base (libucs.so.0 -> libucs) -> the bundled file
        def base(name):
            return name.split(".so")[0]

        renamed = {}
        for f in bundled:
            m = re.match(r"(.+)-[0-9a-f]{8}(\.so.*)$", f)
            if m:
                renamed[m.group(1)] = f
        mods = sorted(f for f in os.listdir(moddir)
                      if re.match(r"lib(uct|ucm|ucs|ucp)_\w+\.so\.\d+$", f) and not SKIP.search(f))
        if not mods:
            sys.exit(f"wheel_ucx: no UCX modules in {moddir}")
        out = os.path.join(libdir, "ucx")
        os.makedirs(out, exist_ok=True)
        names = {base(m): base(m) + ext for m in mods}
        for m in mods:
            dst = os.path.join(out, names[base(m)])
            shutil.copyfile(os.path.realpath(os.path.join(moddir, m)), dst)
            os.chmod(dst, 0o755)
            args = []
            for n in needed(dst):
                b = base(n)
                if b in names:
                    args += ["--replace-needed", n, names[b]]
                elif b in renamed:
                    args += ["--replace-needed", n, renamed[b]]
            run("patchelf", *args, "--set-rpath", "$ORIGIN:$ORIGIN/..", dst)
            own = set(bundled) | set(names.values())
            host = [n for n in needed(dst) if n not in own and not n.startswith(GLIBC)]
            print(f"wheel_ucx: {libs[0]}/ucx/{names[base(m)]}"
                  f" (from the host: {', '.join(host) or 'nothing'})")
        os.unlink(wheel)
        subprocess.run([sys.executable, "-m", "wheel", "pack", "-d", os.path.dirname(wheel), root],
                       check=True, stdout=subprocess.DEVNULL)
        if not os.path.exists(wheel):
            sys.exit(f"wheel_ucx: packing did not give back {wheel}")
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
