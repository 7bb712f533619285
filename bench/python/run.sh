#!/usr/bin/env bash
# bench/python/bench_py.py with the project's virtual environment (numpy,
# torch, redis-py: scripts/venv.sh makes it; PYTHON picks another interpreter).
#
#   bench/python/run.sh [--build build] [--reps 5] [--iters 20] [--shapes large,small] [--no-redis]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PY=${PYTHON:-$root/.venv/bin/python}
[[ -x "$PY" ]] || PY=$("$root/scripts/venv.sh")
[[ -x "$PY" ]] || { echo "run.sh: no $PY (set PYTHON to an interpreter with torch and redis-py)" >&2; exit 2; }
exec "$PY" "$(dirname "${BASH_SOURCE[0]}")/bench_py.py" "$@"
