#!/usr/bin/env bash
# The main job on this machine. Until the storage units exist this runs the
# component self-checks: the unit tests of every module that is built.
set -euo pipefail
build=${1:-build}
cd "$build"
exec ctest --output-on-failure
