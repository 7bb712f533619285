"""`python -m dataplane ARGS` and the `dataplane` console script of a wheel:
run the dataplane tool that the wheel carries (dataplane/bin/dataplane) with
ARGS, in this process's place, so that signals, exit status and terminal
behave as the tool's own."""

import os
import sys


def _tool():
    here = os.path.dirname(os.path.abspath(__file__))
    bundled = os.path.join(here, "bin", "dataplane")
    if os.access(bundled, os.X_OK):
        return bundled
    from ._proc import find_cli  # a build tree or `make install`

    found = find_cli()
    if found and os.path.realpath(found) != os.path.realpath(sys.argv[0]):
        return found
    return None


def main():
    tool = _tool()
    if tool is None:
        sys.stderr.write("dataplane: this installation of the Python package carries no "
                         "dataplane tool (install the wheel, or `make install`, or set DP_CLI)\n")
        return 127
    os.execv(tool, [tool] + sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
