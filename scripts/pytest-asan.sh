#!/usr/bin/env bash
# The Python package's tests with its C extension and the client library
# under AddressSanitizer + UndefinedBehaviorSanitizer. The interpreter is not
# instrumented, so the sanitizer runtimes are preloaded and leak checking is
# off (the interpreter's own allocations would be reported); every memory
# error and undefined behaviour in the extension or the library fails the run.
#
#   scripts/pytest-asan.sh ASAN_BUILD_DIR [UNIT_BUILD_DIR]
#
# ASAN_BUILD_DIR: a build with SANITIZE=address,undefined (its libdataplane.so);
# UNIT_BUILD_DIR (default build): whose dataplane binary runs the units.
# PYTHON (default: the project's .venv, else /usr/bin/python3): the interpreter.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
asan=$(cd "${1:?usage: pytest-asan.sh ASAN_BUILD_DIR [UNIT_BUILD_DIR]}" && pwd)
units=$(cd "${2:-build}" && pwd)
py=${PYTHON:-$root/.venv/bin/python}
[ -x "$py" ] || py=/usr/bin/python3
py=$(cd "$(dirname "$py")" && pwd)/$(basename "$py")  # the tests run from tests/python
[ -x "$py" ] || { echo "pytest-asan: no $py" >&2; exit 2; }
[ -e "$asan/libdataplane.so" ] || { echo "pytest-asan: no $asan/libdataplane.so" >&2; exit 2; }
[ -x "$units/dataplane" ] || { echo "pytest-asan: no $units/dataplane" >&2; exit 2; }
out="$asan/python-asan"
rm -rf "$out"
mkdir -p "$out/dataplane"
cp "$root"/python/dataplane/*.py "$out/dataplane/"
suffix=$("$py" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
inc=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
# shellcheck disable=SC2046
gcc -shared -fPIC -O1 -g -std=c11 -D_GNU_SOURCE -fvisibility=hidden \
    -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer \
    -Wall -Wextra -Wno-missing-field-initializers -Werror \
    -I"$inc" -I"$root/include" -I"$asan/include" "$root"/python/src/*.c \
    -L"$asan" -ldataplane -Wl,-rpath,"$asan" -o "$out/dataplane/_core$suffix"
preload="$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libubsan.so)"
cd "$root/tests/python"
LD_PRELOAD="$preload" ASAN_OPTIONS="detect_leaks=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}" \
    UBSAN_OPTIONS="print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}" \
    PYTHONPATH="$out" DP_CLI="$units/dataplane" DP_BUILD="$units" \
    "$py" -m pytest -q -p no:cacheprovider -x .
