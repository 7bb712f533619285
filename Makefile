# dataplane: the one-word entry points. The real build is CMake (CMakeLists.txt).
#
#   make test          install what is missing, build, run every test
#   make run           the main job on this machine
#   make install       library, headers, pkg-config, the tool and the Python package
#   make wheel         the source distribution and the self-contained wheel (dist/)
#   make wheel-check   ... and test the wheel in a clean Debian root (root needed)
#   make asan          the tests under AddressSanitizer + UndefinedBehaviorSanitizer
#   make tsan          the threaded tests under ThreadSanitizer
#   make fuzz          build the libFuzzer targets and run each for FUZZ_SECONDS
#   make bench         build and run the benchmarks
#   make format        reformat the sources; make format-check only checks
#
# Variables: BUILD (build directory), SANITIZE (e.g. address,undefined),
# WERROR (ON/OFF), JOBS, FUZZ_SECONDS, CTEST_ARGS, BENCH (e.g. BENCH="ctl xfer"),
# VENV (the project's virtual environment, .venv: scripts/venv.sh makes it from
# python/requirements.txt), PYTHON (the interpreter the Python package is built
# for and tested with: VENV's; another one skips the virtual environment).

BUILD        ?= build
SANITIZE     ?=
WERROR       ?= ON
JOBS         ?= $(shell nproc 2>/dev/null || echo 2)
FUZZ_SECONDS ?= 20
CTEST_ARGS   ?=
BUILD_TYPE   ?= RelWithDebInfo
VENV         ?= $(CURDIR)/.venv
PYTHON       ?= $(VENV)/bin/python

# Keep the build's output to what it does, not which directories it enters.
MAKEFLAGS += --no-print-directory

SOURCES = $(shell git ls-files '*.c' '*.h' 2>/dev/null || find src include tests bench fuzz -name '*.[ch]')

.PHONY: all deps venv configure build test run install asan tsan fuzz bench format format-check clean \
        wheel wheel-check

all: build

deps:
	@DP_DEPS_QUIET=1 scripts/deps.sh

# The virtual environment is made (or checked current) only when PYTHON is its.
venv: deps
	@if [ "$(PYTHON)" = "$(VENV)/bin/python" ]; then DP_DEPS_QUIET=1 scripts/venv.sh $(VENV) >/dev/null; fi

configure: deps venv
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DDP_WERROR=$(WERROR) \
	    -DDP_SANITIZER=$(SANITIZE) -DPython3_EXECUTABLE=$(PYTHON) >/dev/null

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

test: build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS) $(CTEST_ARGS)

run: build
	@scripts/run.sh $(BUILD)

# Library, headers, pkg-config file, the dataplane tool and the Python package
# under PREFIX (default /usr/local; DESTDIR is honoured).
PREFIX ?= /usr/local
install: build
	@cmake --install $(BUILD) --prefix $(PREFIX)

# The source distribution and the self-contained wheel, in DIST (dist/):
# scripts/wheel.sh; wheel-check also installs the wheel in a clean Debian root
# and runs a cluster from it (tests/wheel/check_wheel.sh, needs root).
DIST ?= $(CURDIR)/dist
wheel: deps
	@scripts/wheel.sh $(DIST)

wheel-check: deps
	@tests/wheel/check_wheel.sh "$$(scripts/wheel.sh $(DIST) | tail -n1)"

asan:
	@$(MAKE) --no-print-directory test BUILD=build-asan SANITIZE=address,undefined
	@PYTHON=$(PYTHON) scripts/pytest-asan.sh build-asan $(BUILD)

tsan:
	@TSAN_OPTIONS="suppressions=$(CURDIR)/tests/tsan.supp $(TSAN_OPTIONS)" \
	    $(MAKE) --no-print-directory test BUILD=build-tsan SANITIZE=thread \
	    CTEST_ARGS="$(CTEST_ARGS)"

fuzz: deps
	@CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDP_FUZZ=ON \
	    -DDP_WERROR=$(WERROR) >/dev/null
	@cmake --build build-fuzz -j $(JOBS)
	@scripts/fuzz.sh build-fuzz $(FUZZ_SECONDS)

bench: build
	@scripts/bench.sh $(BUILD) $(BENCH)

format:
	@clang-format -i $(SOURCES)

format-check:
	@clang-format --dry-run --Werror $(SOURCES) && echo "format: clean"

clean:
	rm -rf build build-asan build-tsan build-fuzz
