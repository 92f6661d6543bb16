# ramgrid: one entry point for people and CI. `make help` lists the targets.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
CARGO ?= cargo
MEMCACHED ?= memcached

.DEFAULT_GOAL := help

help: ## List the targets
	@grep -hE '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk -F':.*?## ' '{printf "  \033[36m%-12s\033[0m %s\n", $$1, $$2}'

setup: $(VENV)/.ok ## Install what the build and tests need (memcached, Rust components, Python venv)
	@command -v $(MEMCACHED) >/dev/null || { echo "installing memcached (apt)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq memcached) >/dev/null; }
	@command -v openssl >/dev/null || { echo "installing openssl (apt; the TLS tests make their CA with it)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssl) >/dev/null; }
	@command -v java >/dev/null || { echo "installing Java 17 (apt; the file-system cache's tests start HDFS)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jdk-headless) >/dev/null; }
	@command -v mvn >/dev/null || { echo "installing Maven (apt; it fetches Hadoop's MiniDFSCluster jars)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq maven) >/dev/null; }
	@command -v chromedriver >/dev/null || { echo "installing Chromium and its driver (apt; the dashboard's browser tests)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver) >/dev/null; }
	@rustup component add rustfmt clippy >/dev/null 2>&1 || true

$(VENV)/.ok: pyproject.toml Makefile
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q maturin pytest pytest-timeout pymemcache hypothesis numpy xxhash pyarrow "dask[distributed]" matplotlib wordfreq tqdm pandas ruff mypy atheris prometheus-client scipy scikit-learn fsspec requests polars duckdb selenium
	@touch $@

develop: setup ## Build the Python package's native module (release) into the venv
	VIRTUAL_ENV=$(abspath $(VENV)) PATH=$(abspath $(VENV))/bin:$$PATH $(VENV)/bin/maturin develop --release -q

build: ## Build release binaries (target/release/ramgrid-server, ramgrid-bench)
	$(CARGO) build --release -p ramgrid-server -p ramgrid-bench

demo: develop build ## Main job: the language-model experiment on an embedded local grid (out/lm: table, plots, JSON)
	$(VENV)/bin/ramgrid demo lm --out out/lm

hdfs-jars: setup ## Fetch Hadoop's MiniDFSCluster jars from Maven Central into scripts/hdfs/lib (needs Java 17, Maven)
	PYTHONPATH=python $(PY) -c 'from ramgrid.fs.minihdfs import ensure_jars; print(ensure_jars())'

hdfs-demo: develop build hdfs-jars ## File-system cache demo: a real MiniDFSCluster (WebHDFS) read through the grid
	$(PY) examples/hdfs_cache.py

compare: setup build ## Quick ramgrid vs memcached comparison under the same load generator
	$(PY) benchmarks/memcached_compare.py --quick

test: develop build hdfs-jars ## All default tests: Rust unit/property/conformance (ramgrid and real memcached), Python tests (HDFS ones on a MiniDFSCluster)
	$(CARGO) test --workspace
	bash scripts/conformance_memcached.sh
	$(PY) -m pytest python/tests

lint: setup ## rustfmt, clippy -D warnings, ruff (check and format)
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(VENV)/bin/ruff check python examples benchmarks tests
	$(VENV)/bin/ruff format --check python examples benchmarks tests
	$(MAKE) --no-print-directory typecheck

typecheck: setup ## mypy over python/ramgrid (pyproject.toml); stubtest of _native.pyi against the built module
	$(VENV)/bin/mypy
	@if $(PY) -c 'import ramgrid._native' 2>/dev/null; then \
	  $(PY) -m mypy.stubtest ramgrid._native --mypy-config-file pyproject.toml \
	    --allowlist python/ramgrid/_native.stubtest-allowlist; \
	else echo "typecheck: ramgrid._native is not built (make develop): stub not compared with it"; fi

bench: setup build ## Full benchmark vs memcached (1M keys, several rounds); records to benchmarks/results/
	$(PY) benchmarks/memcached_compare.py --out benchmarks/results/memcached_compare.md

SOAK_SECONDS ?= 600
soak: develop build ## Slow tier: mixed traffic for SOAK_SECONDS (600) on both protocols; RSS must stay flat
	RAMGRID_SOAK_SECONDS=$(SOAK_SECONDS) $(PY) -m pytest python/tests/integration/test_soak.py -m slow -s

CHAOS_SECONDS ?= 300
chaos: develop build ## Slow tier: servers killed and restarted, then added and removed, under jobs for CHAOS_SECONDS (300) each; exact reads, no acked write lost
	RAMGRID_CHAOS_SECONDS=$(CHAOS_SECONDS) $(PY) -m pytest python/tests/integration/test_chaos.py -m slow -s

JEPSEN_ARGS ?= --seconds 20 --clients 5 --nemesis pause,kill,restart --model register --out out/jepsen
jepsen: develop ## Slow tier: client processes under a nemesis, the history checked for linearizability by Porcupine (needs Go; docs/jepsen.md)
	$(PY) -m ramgrid.testing.jepsen $(JEPSEN_ARGS)

porcupine-test: ## The history checker's gofmt, vet and Go tests (tools/porcupine; needs Go)
	cd tools/porcupine && test -z "$$(gofmt -l .)" && go vet ./... && go test ./...

FUZZ_SECONDS ?= 30
# The coverage flags cargo-fuzz would pass, so the targets build on stable without cargo-fuzz or nightly.
FUZZ_RUSTFLAGS := -Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
  -Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
  -Cllvm-args=-sanitizer-coverage-trace-compares -Cdebug-assertions -Coverflow-checks

fuzz: develop ## Short libFuzzer run of every parser target (FUZZ_SECONDS each; stable toolchain; atheris for Python's)
	cd fuzz && RUSTFLAGS="$(FUZZ_RUSTFLAGS)" $(CARGO) build --release --target x86_64-unknown-linux-gnu --bins
	cd fuzz && for t in fuzz_targets/*.rs; do n=$$(basename $$t .rs); mkdir -p corpus/$$n; \
	  cp -n seeds/$$n/* corpus/$$n/ 2>/dev/null || true; \
	  ./target/x86_64-unknown-linux-gnu/release/$$n corpus/$$n -max_total_time=$(FUZZ_SECONDS) -max_len=4096 || exit 1; done
	mkdir -p fuzz/corpus/load_text && cp -n fuzz/seeds/load_text/* fuzz/corpus/load_text/ 2>/dev/null || true
	$(PY) fuzz/python/load_text.py fuzz/corpus/load_text -max_total_time=$(FUZZ_SECONDS) -max_len=512

clean: ## Remove build outputs and the venv
	$(CARGO) clean; rm -rf $(VENV)

.PHONY: help setup develop build demo compare test lint typecheck bench fuzz soak chaos jepsen porcupine-test clean
