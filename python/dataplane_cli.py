"""The `dataplane` console script of a wheel: runs the dataplane tool the
wheel carries (site-packages/dataplane/bin/dataplane) in this process's
place, without importing the package (the tool starts as fast as it would
from PATH). `python -m dataplane` does the same through dataplane/__main__.py."""

import os
import sys


def main():
    tool = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dataplane", "bin", "dataplane")
    if not os.access(tool, os.X_OK):
        sys.stderr.write(f"dataplane: {tool} is missing: this installation of the package "
                         "carries no dataplane tool (reinstall the wheel: pip install --force-reinstall dataplane)\n")
        return 127
    os.execv(tool, [tool] + sys.argv[1:])
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
