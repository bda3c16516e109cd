# Thin front over scripts/ and CMake. `make demo` and `make test` both set up first.
.PHONY: setup build test compat test-asan test-tsan fuzz demo bench clean format wheel install package gpu-kit gpu-kit-check

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

# The torch version matrix (docs/compat.md, scripts/compat.sh): per version a venv from PyPI
# (.venv-torch-<version>, made once; the pinned one is .venv), the Python checks under launch,
# and the worker library built against that LibTorch in build-torch-<version>. Not in CI.
TORCH ?= 2.6.0 2.8.0 2.9.1 2.11.0 2.15.0
compat: setup
	@bash scripts/compat.sh $(TORCH)

# The rendezvous and launcher suites under ASan + UBSan (build-asan) or TSan (build-tsan), built
# without LibTorch. `make test` runs the ASan one too.
test-asan: setup
	@bash scripts/test_sanitized.sh asan

test-tsan: setup
	@bash scripts/test_sanitized.sh tsan

# libFuzzer targets (build-fuzz, clang + ASan + UBSan), FUZZ_SECONDS each (default 60).
fuzz: setup
	@bash scripts/fuzz.sh

# Only what the demo runs (launch, its gRPC plugin for --standalone, the example): a new user's
# first run does not wait for the test suite to build.
DEMO_TARGETS := launch ddpl_launch_grpc ddp_resnet
demo: setup
	@bash scripts/build.sh $(BUILD_DIR) $(JOBS) $(DEMO_TARGETS)
	@bash scripts/demo.sh $(BUILD_DIR)

wheel: setup
	@bash scripts/wheel.sh

# launch, rdzv-server, the gRPC plugin, and the worker library as a CMake package
# (find_package(ddplaunch)): docs/worker.md. `make install PREFIX=~/.local`.
PREFIX ?= /usr/local
install: build
	cmake --install $(BUILD_DIR) --prefix $(PREFIX)

# dist/ddplaunch_<version>_<arch>.deb: launch, rdzv-server and the plugin under /usr.
package: build
	@bash scripts/package.sh $(BUILD_DIR)

# gpu-kit/: what a bare GPU host lacks to build the GPU checks (tests/gpu/run_gpu_checks.sh,
# docs/gpu.md); gpu-kit-check builds from it here with the system's own packages hidden.
gpu-kit:
	@bash scripts/gpu_kit.sh

gpu-kit-check: setup
	@bash scripts/gpu_kit_check.sh

bench: build
	@bash bench/run_all.sh $(BUILD_DIR)

format:
	@git ls-files '*.cc' '*.h' | xargs clang-format -i

clean:
	rm -rf $(BUILD_DIR)
