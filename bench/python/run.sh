#!/usr/bin/env bash
# bench/python/bench_py.py with Debian's interpreter (numpy, torch, redis-py):
# another python3 first on PATH (pyenv) lacks them.
#
#   bench/python/run.sh [--build build] [--reps 5] [--iters 20] [--shapes large,small] [--no-redis]
set -euo pipefail
PY=${PYTHON:-/usr/bin/python3}
[[ -x "$PY" ]] || { echo "run.sh: no $PY (set PYTHON to an interpreter with torch and redis-py)" >&2; exit 2; }
exec "$PY" "$(dirname "${BASH_SOURCE[0]}")/bench_py.py" "$@"
