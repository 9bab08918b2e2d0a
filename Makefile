# The README's two commands: `make demo` and `make test`. Both set up a fresh
# Debian 12 machine themselves (packages, configure, build) and are idempotent.
SHELL := /bin/bash
BUILD ?= build
CMAKE_FLAGS ?=
JOBS ?= $(shell nproc)
# Let ccache share objects between clones in different folders (CI clones afresh).
export CCACHE_BASEDIR := $(CURDIR)
export CCACHE_NOHASHDIR := 1

.PHONY: all deps configure build demo test soak bench dist clean format format-check

all: build

deps:
	@scripts/setup.sh

$(BUILD)/build.ninja: | deps
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_CXX_COMPILER_LAUNCHER=ccache \
	  -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache $(CMAKE_FLAGS) >$(BUILD).configure.log 2>&1 \
	  || { cat $(BUILD).configure.log; exit 1; }

configure: $(BUILD)/build.ninja

build: deps configure
	@cmake --build $(BUILD) -j $(JOBS)

demo: build
	@scripts/demo.sh $(BUILD)

# The `torch` tests need PyTorch (Debian's python3-torch) and one dashboard test a
# real Prometheus (Debian's prometheus); only `make test` installs them.
test: export AGENTRT_SETUP_EXTRA := python3-torch prometheus
test: build
	@scripts/test.sh $(BUILD)

# The long soaks, 15 minutes of faults each: on this machine (tests/tools/soak_test.py;
# `make test` runs 30 s of it) and on a 6-node test cluster (tests/slurm/soak_cluster_test.py,
# as root; `make test` runs 60 s of it).
SOAK_SECONDS ?= 900
soak: build
	@AGENTRT_BIN_DIR=$(BUILD)/bin /usr/bin/python3 tests/tools/soak_test.py --seconds $(SOAK_SECONDS)
	@AGENTRT_BIN_DIR=$(BUILD)/bin AGENTRT_SOURCE_DIR=$(CURDIR) /usr/bin/python3 \
	  tests/slurm/soak_cluster_test.py --seconds $(SOAK_SECONDS); rc=$$?; \
	  [ $$rc -eq 0 ] || [ $$rc -eq 77 ]  # 77: skipped (not root), and it says so

bench: build
	@scripts/bench.sh $(BUILD)

# agentrt-<version>-linux-x86_64.tar.gz here: agentrt for any Linux with glibc
# (scripts/dist.sh says what goes in; the tarball's README what the host needs).
dist: build
	@scripts/dist.sh $(BUILD) .

# clang-format (Debian's clang-format, installed by scripts/setup.sh) over every C++ file.
FORMAT_FILES = git ls-files '*.h' '*.cc' '*.cu'

format: deps
	@$(FORMAT_FILES) | xargs clang-format -i

# Fails, naming the files, when any C++ file is not formatted (CI runs it).
format-check: deps
	@unformatted=$$($(FORMAT_FILES) | xargs -I{} sh -c 'clang-format --dry-run -Werror "{}" >/dev/null 2>&1 || echo "{}"'); \
	if [ -n "$$unformatted" ]; then \
	  echo "format-check: not formatted (run make format):"; echo "$$unformatted" | sed 's/^/  /'; exit 1; \
	fi

clean:
	rm -rf $(BUILD) $(BUILD).configure.log
