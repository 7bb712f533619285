"""A local cluster for the Python benchmarks: `dataplane up` in a temporary
directory, stopped and removed when the block ends (also on an error).

    from local_cluster import local_cluster
    with local_cluster("build/dataplane", slab="1G", prog="rl_batch") as cfile:
        client = dataplane.Client(cfile)
"""

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time


@contextlib.contextmanager
def local_cluster(cli, slab="1G", units=2, prog="bench", timeout_s=60.0):
    """Yields the cluster file's path; exits the program, with up's stderr,
    when the cluster does not come up within timeout_s."""
    tmp = tempfile.mkdtemp(prefix=f"dp-{prog}-")
    err_path = os.path.join(tmp, "up.err")
    with open(err_path, "wb") as err:
        up = subprocess.Popen([cli, "up", "--units", str(units), "--slab", slab, "--dir",
                               os.path.join(tmp, "c")], stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=err)
    try:
        cfile = os.path.join(tmp, "c", "cluster.json")
        end = time.monotonic() + timeout_s
        while not os.path.exists(cfile) and up.poll() is None and time.monotonic() < end:
            time.sleep(0.1)
        if not os.path.exists(cfile):
            with open(err_path, errors="replace") as f:
                sys.exit(f"{prog}: dataplane up did not start: {f.read()[-2000:]}")
        yield cfile
    finally:
        up.terminate()
        try:
            up.wait(30)
        except subprocess.TimeoutExpired:
            up.kill()
            up.wait()
        shutil.rmtree(tmp, ignore_errors=True)
