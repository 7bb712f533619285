#!/usr/bin/env bash
# Install the Debian packages dataplane needs to build, test, fuzz and benchmark.
# (The Python packages come from the package index, pinned in
# python/requirements.txt, into .venv: scripts/venv.sh.)
#
# Idempotent: only packages that are missing are installed, so a second run is a
# no-op that says so. Needs root (or sudo) only when something is missing.
set -euo pipefail

PKGS=(
    build-essential cmake pkg-config        # toolchain
    clang libclang-rt-14-dev clang-format   # fuzzing (libFuzzer), sanitizers, format check
    libucx-dev ucx-utils                    # data path (UCX) and ucx_perftest
    libzmq3-dev                             # control plane
    libmsgpack-dev                          # msgpack-c: the reference the codec is tested against
    libnuma-dev                             # NUMA placement of slabs
    libcjson-dev                            # cluster files (cluster.json), registry records
    libcurl4-openssl-dev                    # the etcd registry (its v3 HTTP/JSON gateway)
    etcd-server etcd-client                 # the registry tests start a real etcd
    slurm-wlm munge                         # the Slurm launch test (a one-node cluster)
    python3-yaml                            # checks the Kubernetes manifests parse
    libmicrohttpd-dev                       # the units' /metrics and /healthz (HTTP)
    prometheus                              # the metrics tests: the real server
    tmux curl                               # `dataplane top` in a terminal; bench/metrics.sh
    redis-server redis-tools                # benchmark comparison
    iproute2 iptables                       # multi-host fault tests (network namespaces)
    iperf3                                  # the link limit in bench/hosts.sh
    valgrind                                # instruction counts in bench/pervalue.sh
    debootstrap                             # the clean Debian root the wheel is tested in
    python3-dev python3-venv                    # Debian's interpreter for .venv where no
                                                # other python3 with headers is on PATH
)

missing=()
for p in "${PKGS[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$p")
    fi
done

if [ ${#missing[@]} -eq 0 ]; then
    [ -n "${DP_DEPS_QUIET:-}" ] || echo "deps: all ${#PKGS[@]} packages already installed"
    exit 0
fi

echo "deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        SUDO="sudo -n"
    else
        echo "deps: missing packages: ${missing[*]}" >&2
        echo "deps: installing them needs root; run 'sudo scripts/deps.sh' once, or" >&2
        echo "      'sudo apt-get install ${missing[*]}'" >&2
        exit 1
    fi
fi

export DEBIAN_FRONTEND=noninteractive
# A fresh machine has no package lists yet; refresh them when they are missing or stale.
if [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -mmin -1440 2>/dev/null | head -n1)" ]; then
    $SUDO apt-get update -q
fi
if ! $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"; then
    echo "deps: apt-get install failed; retrying after 'apt-get update'" >&2
    $SUDO apt-get update -q
    $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
echo "deps: done"
