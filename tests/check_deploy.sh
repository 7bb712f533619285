#!/bin/sh
# The launch files in deploy/, checked as far as this machine can:
#   systemd: `systemd-analyze verify` of an instance of the unit file (with
#            ExecStart pointed at the built binary);
#   k8s:     the manifests parse (python3-yaml), the unit StatefulSet's
#            --units equals its replicas, and every `dataplane unit` option
#            it passes exists;
#   slurm:   the sbatch script parses (bash -n) and names only existing options.
# Usage: check_deploy.sh BUILD_DIR SOURCE_DIR PYTHON
set -eu
build=$1 src=$2 py=${3:-/usr/bin/python3}
cli=$build/dataplane
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "check_deploy: $*" >&2; exit 1; }
"$cli" unit --help > "$tmp/unit.help"

# Every --option in "$@" must be one `dataplane unit --help` lists.
check_opts() {
    for o in "$@"; do
        name=${o%%=*}
        grep -q -- "^  $name " "$tmp/unit.help" || fail "$where: 'dataplane unit' has no option $name"
    done
}

# systemd
unit=$src/deploy/systemd/dataplane-unit@.service
where=$unit
if command -v systemd-analyze >/dev/null 2>&1; then
    sed "s|/usr/local/bin/dataplane|$(readlink -f "$cli")|" "$unit" > "$tmp/dataplane-unit@.service"
    out=$(systemd-analyze verify "$tmp/dataplane-unit@3.service" 2>&1) || fail "systemd-analyze verify: $out"
    [ -z "$out" ] || fail "systemd-analyze verify says: $out"
    echo "systemd: $unit verifies"
else
    echo "systemd: SKIPPED (no systemd-analyze)"
fi
check_opts $(sed -n '/^ExecStart=/,/^[^ ]/p' "$unit" | grep -o -- '--[a-z-]*' | sort -u)

# Kubernetes
yaml=$src/deploy/k8s/dataplane.yaml
where=$yaml
opts=$("$py" - "$yaml" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
kinds = sorted(d["kind"] for d in docs)
assert kinds == ["Job", "Service", "Service", "StatefulSet", "StatefulSet"], kinds
sts = [d for d in docs if d["kind"] == "StatefulSet" and d["metadata"]["name"] == "dataplane"][0]
cmd = sts["spec"]["template"]["spec"]["containers"][0]["command"]
assert cmd[1] == "unit", cmd
units = [c for c in cmd if c.startswith("--units=")]
assert units and int(units[0].split("=")[1]) == sts["spec"]["replicas"], (units, sts["spec"]["replicas"])
assert "--unit-id=auto" in cmd, cmd
print(" ".join(c.split("=")[0] for c in cmd[2:]))
PY
) || fail "the Kubernetes manifests do not check out"
check_opts $opts
echo "k8s: $yaml parses; replicas = --units; options exist"

# Slurm
sb=$src/deploy/slurm/dataplane.sbatch
where=$sb
if [ -f "$sb" ]; then
    bash -n "$sb" || fail "bash -n $sb"
    check_opts $(grep -o -- 'dataplane\(\$[A-Za-z_{}]*\)\? unit .*' "$sb" | grep -o -- '--[a-z-]*' | sort -u)
    echo "slurm: $sb parses; options exist"
fi
echo "check_deploy: ok"
