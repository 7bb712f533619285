"""Build and install the dataplane Python package with pip, offline:

    pip install --no-build-isolation ./python

The extension links libdataplane. Where it comes from, in order:
DATAPLANE_BUILD (a CMake build directory of this repository, e.g. build/),
else pkg-config's dataplane (after `make install`), else ../build beside
this file. The package needs only the C library at run time; numpy and torch
are used when installed.
"""

import glob
import os
import subprocess

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(here)


def _pkg_config(*args):
    try:
        out = subprocess.run(["pkg-config", *args, "dataplane"], check=True,
                             capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.split()


def _link():
    build = os.environ.get("DATAPLANE_BUILD")
    if not build:
        cflags, libs = _pkg_config("--cflags"), _pkg_config("--libs")
        if cflags is not None and libs is not None:
            inc = [f[2:] for f in cflags if f.startswith("-I")]
            libdirs = [f[2:] for f in libs if f.startswith("-L")]
            return inc, libdirs
        build = os.path.join(root, "build")
    build = os.path.abspath(build)
    if not glob.glob(os.path.join(build, "libdataplane.so*")):
        raise SystemExit(
            f"setup.py: no libdataplane.so in {build}: build the C library first "
            f"(make), `make install` it, or set DATAPLANE_BUILD to a build directory")
    source = root
    cache = os.path.join(build, "CMakeCache.txt")
    if os.path.exists(cache):  # the build directory knows its source tree
        for line in open(cache):
            if line.startswith("CMAKE_HOME_DIRECTORY:"):
                source = line.split("=", 1)[1].strip()
    return [os.path.join(source, "include"), os.path.join(build, "include")], [build]


class BuildPyWithPth(build_py):
    """Also puts dataplane-tq.pth at the top of the package directory
    (site-packages once installed): it registers the TransferQueue backend
    in every process (dataplane_tq_hook.py says how)."""

    def run(self):
        super().run()
        self.copy_file(os.path.join(here, "dataplane-tq.pth"),
                       os.path.join(self.build_lib, "dataplane-tq.pth"))


inc, libdirs = _link()
version = "0.0.0"
for d in inc:
    h = os.path.join(d, "dataplane", "version.h")
    if os.path.exists(h):
        for line in open(h):
            if line.startswith("#define DP_VERSION_STRING"):
                version = line.split('"')[1]

setup(
    name="dataplane",
    version=version,
    description="Put and get batches of tensors on a cluster of storage units",
    packages=["dataplane"],
    py_modules=["dataplane_tq_hook"],
    cmdclass={"build_py": BuildPyWithPth},
    ext_modules=[
        Extension(
            "dataplane._core",
            sources=sorted(glob.glob(os.path.join("src", "*.c"))),
            include_dirs=inc,
            library_dirs=libdirs,
            runtime_library_dirs=libdirs,
            libraries=["dataplane"],
            extra_compile_args=["-std=c11", "-D_GNU_SOURCE", "-fvisibility=hidden"],
        )
    ],
    python_requires=">=3.9",
)
