# The front door. `make run` and `make test` install what is missing, configure,
# build and run. Everything else is CMake (see CMakeLists.txt).
#
#   make run                       the default RL example on the built-in tiny model
#   make test                      every test suite (ctest)
#   make build                     configure + build only
#   make test RL_SANITIZE=address,undefined   sanitizer build in build-san/
#   make bench                     the benchmarks in bench/
#   make fuzz                      every fuzz target for FUZZ_SECONDS (600) each, clang
#                                  build in build-fuzz/ (docs/reliability.md, "Fuzzing")
#   make format                    clang-format every C/C++ file

BUILD ?= build
RL_SANITIZE ?=
CMAKE_ARGS ?=
JOBS ?= $(shell nproc 2>/dev/null || echo 2)

ifneq ($(RL_SANITIZE),)
BUILD := build-san
CMAKE_ARGS += -DRL_SANITIZE=$(RL_SANITIZE) -DCMAKE_BUILD_TYPE=Debug
endif

# ccache: CMakeLists.txt compiles through it when installed (install-deps.sh
# installs it before the first configure). Its hashes do not depend on the
# checkout's folder (relative paths; debug info not hashed by folder), so a
# second clone on the same machine reuses the first one's objects.
export CCACHE_BASEDIR := $(CURDIR)
export CCACHE_NOHASHDIR := 1

.PHONY: all deps test-deps configure build test run bench fuzz format clean

all: build

deps:
	@bash scripts/install-deps.sh

$(BUILD)/build.ninja: | deps
	cmake -S . -B $(BUILD) -G Ninja $(CMAKE_ARGS)

configure: deps
	cmake -S . -B $(BUILD) -G Ninja $(CMAKE_ARGS)

build: deps $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

# What only the tests need besides the build (a headless browser).
test-deps: deps
	@bash scripts/install-deps.sh --tests

test: test-deps build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# Only what the example runs (rlhost and the shipped plugins), not the tests
# and benchmarks.
run: deps $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS) --target rl_run_targets
	bash scripts/run-example.sh $(BUILD)

bench: build
	bash scripts/run-bench.sh $(BUILD)

# The fuzz targets of fuzz/ need no libtorch and not the main build.
FUZZ_SECONDS ?= 600
fuzz: deps
	bash scripts/run-fuzz.sh build-fuzz $(FUZZ_SECONDS)

format:
	git ls-files '*.c' '*.h' '*.cpp' '*.hpp' '*.inc' | xargs clang-format -i

clean:
	rm -rf $(BUILD) build-san build-fuzz
