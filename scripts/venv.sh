#!/usr/bin/env bash
# The project's virtual environment: the Python packages of
# python/requirements.txt (pinned) in VENV (default .venv at the root).
#
#   scripts/venv.sh [VENV [REQUIREMENTS]]   prints VENV's python on its last line
#
# REQUIREMENTS (default python/requirements.txt) makes another environment
# from another pinned file (bench/peers/ makes the peers' one so; it includes
# the project's file with "-r", and a change to either makes it again).
# DP_VENV_NO_DEPS=1 installs with --no-deps: for a file that pins every
# package it needs itself, where pip would otherwise pull an optional
# requirement (bench/peers/: NIXL's torch, a CUDA build of several GB).
#
# Idempotent: the environment is reused while it holds what the requirements
# file names (a stamp of the file's hash), and made again when the file
# changed or an earlier run did not finish. The interpreter is the first
# python3.11 / python3 on PATH that has its C headers (the extension is
# compiled against them), else Debian's /usr/bin/python3 (python3-dev and
# python3-venv, which scripts/deps.sh installs).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${1:-$root/.venv}
req=${2:-$root/python/requirements.txt}
reqname=${req#"$root"/}
stamp=$venv/.dataplane-requirements
# the stamp covers the file and the files it includes ("-r FILE", one level)
included() {
    sed -n 's/^-r[[:space:]]*\([^[:space:]#]*\).*/\1/p' "$1" |
        while read -r f; do case "$f" in /*) echo "$f" ;; *) echo "$(dirname "$1")/$f" ;; esac; done
}
want=$(cat "$req" $(included "$req") | sha256sum | cut -d' ' -f1)
say() { [ -n "${DP_DEPS_QUIET:-}" ] || echo "venv: $*" >&2; }

if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
    say "$venv is current"
    echo "$venv/bin/python"
    exit 0
fi

has_headers() {
    "$1" -c 'import os, sys, sysconfig
sys.exit(0 if sys.version_info >= (3, 9) and os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")) else 1)' 2>/dev/null
}
py=""
for c in python3.11 python3 /usr/bin/python3; do
    p=$(command -v "$c" 2>/dev/null) || continue
    if has_headers "$p"; then py=$("$p" -c 'import sys; print(sys.executable)'); break; fi
done
[ -n "$py" ] || { echo "venv: no python3 with its C headers (install python3-dev: scripts/deps.sh)" >&2; exit 1; }

say "making $venv with $py ($("$py" -V 2>&1)) from $reqname"
rm -rf "$venv"
"$py" -m venv "$venv" || { echo "venv: '$py -m venv' failed (Debian: apt-get install python3-venv)" >&2; exit 1; }
# pip's messages go to stderr, less its notes on package sources it skips; a
# failure names the package and says why
set +o pipefail
nodeps=()
[ "${DP_VENV_NO_DEPS:-0}" = 1 ] && nodeps=(--no-deps)
"$venv/bin/python" -m pip install -q --disable-pip-version-check "${nodeps[@]}" -r "$req" 2>&1 |
    { grep -v '^WARNING: Location .* is ignored' >&2 || true; }
rc=${PIPESTATUS[0]}
set -o pipefail
if [ "$rc" -ne 0 ]; then
    echo "venv: installing $reqname failed (see above); run scripts/venv.sh again once the package index answers" >&2
    exit 1
fi
echo "$want" >"$stamp"
say "ready: $("$venv/bin/python" -c 'import torch, transfer_queue, ray; print("torch", torch.__version__, "transferqueue", transfer_queue.__version__ if hasattr(transfer_queue, "__version__") else "?", "ray", ray.__version__)' 2>/dev/null || echo installed)"
echo "$venv/bin/python"
