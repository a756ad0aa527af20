# The two commands of the README's Quick start:
#   make run    builds and starts the server on its embedded default (127.0.0.1:50051)
#   make test   builds and runs the whole test suite
#   make bench  builds the benchmarks in Release into build-bench/ and runs them all
#               (bench/run_all.sh; results in build-bench/bench-results/, see docs/BENCHMARKS.md)
#   make soak   a seeded random schedule of server, etcd and Sync faults over a fleet of C++,
#               Go, Node and Python workers for SOAK_MINUTES (default 10; SOAK_SEED=N repeats
#               a run), NOT part of `make test`
#               (bench/soak.py; results in $(BUILD_DIR)/soak-SEED/; docs/BENCHMARKS.md 9a)
#   make metastable  the metastable retry storm (issue 37): trigger sweep x strategies x fleet
#               sizes, ~70 min, NOT part of `make test` (bench/metastable.py; results in
#               $(BUILD_DIR)/metastable/, plots in docs/; docs/BENCHMARKS.md 13)
# Both install the Debian packages they need when missing.

BUILD_DIR ?= build
BUILD_TYPE ?= RelWithDebInfo
JOBS ?= $(shell nproc)
# Tests at once (the fleet runs that measure utilisation run alone: RUN_SERIAL). Most tests wait
# on real processes (servers, etcd, workers), so more than the cores fits a quiet machine
# (CTEST_JOBS=4 on 2 cores: 470 s instead of 550 s here); CI keeps one per core, since it builds
# the sanitizer tree beside the tests.
CTEST_JOBS ?= $(JOBS)
LISTEN ?= 127.0.0.1:50051
DATA_DIR ?= $(CURDIR)/data
CMAKE_FLAGS ?=
CTEST_FLAGS ?=

.PHONY: deps configure build run test bench soak metastable clean

deps:
	@scripts/install-deps.sh

# Configured on every build, so CMAKE_FLAGS given now (e.g. CI's -DRETRYBUDGET_WERROR=ON) reach
# an existing build directory too; cmake is quick when nothing changed.
configure: deps
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_FLAGS)

build: configure
	cmake --build $(BUILD_DIR) -j$(JOBS)

run: configure
	cmake --build $(BUILD_DIR) -j$(JOBS) --target retry-budget-server
	$(BUILD_DIR)/server/retry-budget-server --listen=$(LISTEN) --data_dir=$(DATA_DIR)

test: build
	cd $(BUILD_DIR) && ctest --output-on-failure --timeout 300 -j$(CTEST_JOBS) $(CTEST_FLAGS)

BENCH_DIR ?= build-bench

bench: deps
	cmake -S . -B $(BENCH_DIR) -DCMAKE_BUILD_TYPE=Release -DRETRYBUDGET_BUILD_TESTS=OFF $(CMAKE_FLAGS)
	cmake --build $(BENCH_DIR) -j$(JOBS) --target benchmarks
	bench/run_all.sh $(BENCH_DIR)

SOAK_MINUTES ?= 10
SOAK_SEED ?=
SOAK_FLAGS ?=

soak: configure
	cmake --build $(BUILD_DIR) -j$(JOBS) --target retry-budget-server retry-budget-fleet \
	    retrybudget_python_stubs retrybudget_go
	test -d client/js/node_modules || npm ci --prefix client/js
	bench/soak.py --build=$(BUILD_DIR) --minutes=$(SOAK_MINUTES) \
	    $(if $(SOAK_SEED),--seed=$(SOAK_SEED)) $(SOAK_FLAGS)

METASTABLE_FLAGS ?=

metastable: configure
	cmake --build $(BUILD_DIR) -j$(JOBS) --target retry-budget-server metastable_backend \
	    metastable_worker
	bench/metastable.py --build=$(BUILD_DIR) --out=$(BUILD_DIR)/metastable --plots=docs \
	    $(METASTABLE_FLAGS)

clean:
	rm -rf $(BUILD_DIR)
