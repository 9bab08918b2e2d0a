# The README's two commands: `make demo` and `make test`. Both set up a fresh
# Debian 12 machine themselves (packages, configure, build) and are idempotent.
SHELL := /bin/bash
BUILD ?= build
CMAKE_FLAGS ?=
JOBS ?= $(shell nproc)
# Let ccache share objects between clones in different folders (CI clones afresh).
export CCACHE_BASEDIR := $(CURDIR)
export CCACHE_NOHASHDIR := 1

.PHONY: all deps configure build demo test bench clean format

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

# The `torch` tests need PyTorch (Debian's python3-torch); only `make test` installs it.
test: export AGENTRT_SETUP_EXTRA := python3-torch
test: build
	@scripts/test.sh $(BUILD)

bench: build
	@scripts/bench.sh $(BUILD)

format:
	@git ls-files '*.h' '*.cc' '*.cu' | xargs clang-format -i

clean:
	rm -rf $(BUILD) $(BUILD).configure.log
