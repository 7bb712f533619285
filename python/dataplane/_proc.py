"""Starting dataplane's own processes from Python (the TQ bootstrap's local
cluster, the units dataplane.ray runs): where the tool is, and tying a child
to its parent."""

import os
import shutil
import signal


def find_cli(explicit=None):
    """The dataplane tool: explicit, $DP_CLI, the one a wheel carries
    (dataplane/bin/dataplane), `dataplane` on PATH, else the one beside this
    package (a build tree's build/dataplane, an install's PREFIX/bin/dataplane);
    None when there is none."""
    pkg = os.path.dirname(os.path.abspath(__file__))
    carried = os.path.join(pkg, "bin", "dataplane")
    if not os.access(carried, os.X_OK):
        carried = None
    for p in (explicit, os.environ.get("DP_CLI"), carried, shutil.which("dataplane")):
        if p:
            return str(p)
    here = os.path.dirname(pkg)
    for p in (os.path.join(os.path.dirname(here), "dataplane"),
              os.path.join(here, "..", "..", "..", "bin", "dataplane")):
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return os.path.normpath(p)
    return None


def die_with_parent():
    """In a child before exec: SIGTERM when the thread that started it ends
    (PR_SET_PDEATHSIG), so that no unit outlives its owner."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)
    except Exception:
        pass
