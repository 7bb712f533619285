#!/usr/bin/env bash
# Runs TransferQueue's own e2e suites, unmodified, on dataplane's
# TransferQueue backend ("Dataplane"):
#
#   tests/tq_upstream/run.sh [TQ_SOURCE_DIR]
#
# The test files come from TQ_SOURCE_DIR (a TransferQueue source checkout)
# when given, else from the installed TransferQueue distribution: the copy of
# its tests/ that its wheel installs (checked against the wheel's RECORD
# hashes), else that wheel (or sdist) fetched with `pip download`. They are
# copied into a scratch tree, with conftest.py (beside this script) as that
# tree's rootdir conftest: it starts a dataplane cluster for the session and
# gives each suite a "Dataplane" config that attaches to it. Nothing of
# TransferQueue's is written into this repository.
#
# Environment:
#   DP_BUILD   build tree (default: <repo>/build): its dataplane tool and python/
#   PYTHON     interpreter with torch, ray and transferqueue
#              (default: <repo>/.venv/bin/python)
#   TQ_UPSTREAM_PIP=1         skip the installed copy: always pip download
#   TQ_UPSTREAM_CHECKPOINT=1  also run tests/e2e/test_checkpoint_e2e.py
#   PYTEST_ADDOPTS            more pytest options (e.g. "-x -k kv_put")
#
# Exit status: pytest's; 77 (skip) when no copy of the tests can be had.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
build=${DP_BUILD:-$repo/build}
python=${PYTHON:-$repo/.venv/bin/python}

suites=(tests/e2e/test_kv_interface_e2e.py tests/e2e/test_e2e_lifecycle_consistency.py)
if [[ ${TQ_UPSTREAM_CHECKPOINT:-0} == 1 ]]; then
    suites+=(tests/e2e/test_checkpoint_e2e.py)
fi

if [[ ! -x $build/dataplane || ! -d $build/python/dataplane ]]; then
    echo "tq_upstream: no built dataplane in $build (run make build, or set DP_BUILD)" >&2
    exit 2
fi
build=$(cd "$build" && pwd)  # absolute: the tests run in a scratch directory

work=$(mktemp -d "${TMPDIR:-/tmp}/tq-upstream.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/tree"

# copy_tests SRC_ROOT: the e2e files (and any conftest.py on their way) of a
# TransferQueue tree into the scratch tree.
copy_tests() {
    mkdir -p "$work/tree/tests/e2e"
    cp "$1"/tests/e2e/*.py "$work/tree/tests/e2e/"
    if [[ -f $1/tests/conftest.py ]]; then
        cp "$1/tests/conftest.py" "$work/tree/tests/"
    fi
}

if [[ $# -ge 1 ]]; then
    if [[ ! -f $1/tests/e2e/test_kv_interface_e2e.py ]]; then
        echo "tq_upstream: $1 is not a TransferQueue source tree (no tests/e2e)" >&2
        exit 2
    fi
    copy_tests "$1"
    source_desc="source tree $1"
else
    if ! version=$("$python" -c \
            'import importlib.metadata as m; print(m.version("transferqueue"))' 2>/dev/null); then
        echo "tq_upstream: SKIP: TransferQueue is not installed for $python"
        exit 77
    fi
    source_desc=
    if [[ ${TQ_UPSTREAM_PIP:-0} != 1 ]]; then
        # The wheel installs its tests/ into site-packages too; use them when
        # the distribution's RECORD lists them with matching hashes (another
        # package may have installed a tests/ of its own there).
        if "$python" - "$work/tree" <<'EOF'
import base64, hashlib, importlib.metadata as m, os, shutil, sys

dist = m.distribution("transferqueue")
copied = 0
for f in dist.files or ():
    name = str(f).replace(os.sep, "/")
    if not (name.startswith("tests/e2e/") and name.endswith(".py")) or not f.hash:
        continue
    path = f.locate()
    try:
        data = open(path, "rb").read()
    except OSError:
        sys.exit(1)
    digest = base64.urlsafe_b64encode(hashlib.new(f.hash.mode, data).digest())
    if digest.rstrip(b"=").decode() != f.hash.value:
        sys.exit(1)
    dest = os.path.join(sys.argv[1], name)
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    shutil.copyfile(path, dest)
    copied += 1
sys.exit(0 if copied else 1)
EOF
        then
            source_desc="installed transferqueue $version"
        else
            rm -rf "$work/tree/tests"
        fi
    fi
    if [[ -z $source_desc ]]; then
        # Fetch this version's distribution; --retries/--timeout bound the
        # wait when there is no network.
        if ! "$python" -m pip download --no-deps --quiet --disable-pip-version-check \
                --retries 1 --timeout 30 -d "$work/dl" "transferqueue==$version" \
                >"$work/pip.log" 2>&1; then
            echo "tq_upstream: SKIP: cannot fetch transferqueue==$version (no network?); pass a TransferQueue source dir"
            exit 77
        fi
        # Unpack its tests/e2e/*.py: a wheel holds them at tests/e2e/, an
        # sdist under <name>-<version>/tests/e2e/.
        if ! "$python" - "$work/dl" "$work/tree" <<'EOF'
import os, sys, tarfile, zipfile

dl, tree = sys.argv[1], sys.argv[2]
(name,) = os.listdir(dl)
path = os.path.join(dl, name)
if zipfile.is_zipfile(path):
    with zipfile.ZipFile(path) as z:
        files = {n: z.read(n) for n in z.namelist()}
else:
    with tarfile.open(path) as t:
        files = {m.name: t.extractfile(m).read() for m in t.getmembers() if m.isfile()}
copied = 0
for n, data in files.items():
    parts = n.split("/")
    # "tests/e2e/x.py", or "<top>/tests/e2e/x.py" in an sdist
    for skip in (0, 1):
        p = parts[skip:]
        if len(p) == 3 and p[:2] == ["tests", "e2e"] and p[2].endswith(".py"):
            dest = os.path.join(tree, *p)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with open(dest, "wb") as f:
                f.write(data)
            copied += 1
sys.exit(0 if copied else 1)
EOF
        then
            echo "tq_upstream: SKIP: transferqueue==$version's distribution carries no tests/e2e; pass a TransferQueue source dir"
            exit 77
        fi
        source_desc="transferqueue $version ($(ls "$work/dl"))"
    fi
fi

for s in "${suites[@]}"; do
    if [[ ! -f $work/tree/$s ]]; then
        echo "tq_upstream: $source_desc has no $s" >&2
        exit 2
    fi
done

# The scratch tree's root holds our conftest and an empty pytest.ini, so that
# it is pytest's rootdir (and the conftest applies) whatever lies above it.
cp "$here/conftest.py" "$work/tree/conftest.py"
printf '[pytest]\n' >"$work/tree/pytest.ini"

echo "tq_upstream: tests from $source_desc; build $build"

# tests/tq_site's sitecustomize registers the backend in every process Ray
# starts (workers, actors), as an installed dataplane's .pth file would.
export PYTHONPATH="$build/python:$repo/tests/tq_site${PYTHONPATH:+:$PYTHONPATH}"
export DP_CLI="$build/dataplane" DP_BUILD="$build"
export TQ_TEST_BACKEND=Dataplane
export RAY_DEDUP_LOGS=0 RAY_USAGE_STATS_ENABLED=0

set +e
(cd "$work/tree" && "$python" -m pytest -p no:cacheprovider -rfEs "${suites[@]}") \
    2>&1 | tee "$work/pytest.log"
rc=${PIPESTATUS[0]}
set -e

# pytest's summary line must be the last line: print it again if anything
# (a process pytest left behind) wrote after it
summary=$(grep -E '^=+ .* in [0-9.]+s.* =+$' "$work/pytest.log" | tail -n 1 || true)
if [[ -z $summary ]]; then
    echo "tq_upstream: pytest printed no summary (exit status $rc)"
elif [[ $(tail -n 1 "$work/pytest.log") != "$summary" ]]; then
    echo "$summary"
fi
exit "$rc"
