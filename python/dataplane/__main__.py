"""`python -m dataplane ARGS`: run the dataplane tool with ARGS in this
process's place (the one a wheel carries, else the one a build tree or
`make install` has: dataplane._proc.find_cli), so that signals, exit status
and terminal behave as the tool's own. A wheel's `dataplane` console script
does the same without importing the package (dataplane_cli.py)."""

import os
import sys

from ._proc import find_cli


def main():
    tool = find_cli()
    if tool is None or os.path.realpath(tool) == os.path.realpath(sys.argv[0]):
        sys.stderr.write("dataplane: this installation of the Python package carries no "
                         "dataplane tool (install the wheel, or `make install`, or set DP_CLI)\n")
        return 127
    os.execv(tool, [tool] + sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
