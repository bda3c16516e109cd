# Thin front over scripts/ and CMake. `make demo` and `make test` both set up first.
.PHONY: setup build test demo bench clean format wheel

BUILD_DIR ?= build
JOBS ?= $(shell nproc)
export CCACHE_BASEDIR := $(CURDIR)
export CCACHE_NOHASHDIR := true

setup:
	@bash scripts/setup.sh

build: setup
	@bash scripts/build.sh $(BUILD_DIR) $(JOBS)

test: build
	@bash scripts/test.sh $(BUILD_DIR)

demo: build
	@bash scripts/demo.sh $(BUILD_DIR)

wheel: setup
	@bash scripts/wheel.sh

bench: build
	@bash bench/run_all.sh $(BUILD_DIR)

format:
	@git ls-files '*.cc' '*.h' | xargs clang-format -i

clean:
	rm -rf $(BUILD_DIR)
