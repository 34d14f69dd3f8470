# vtc developer targets. Everything runs in a local virtualenv (.venv) so a
# fresh machine needs only python3 (with venv), cargo and this checkout.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
SIM_ARGS ?= all --out results
# pip, in every recipe and script below: retry a failed connection and resume a cut
# download more often than its defaults (5) before an install fails; the engines'
# installs fetch ~3 GB of torch and CUDA wheels. (An older pip ignores the second.)
export PIP_RETRIES ?= 10
export PIP_RESUME_RETRIES ?= 20

.PHONY: run test test-core test-package dev lint bench clean test-vllm system-deps test-loaded

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

## run: build and install vtc, then run every simulation experiment (the main job)
run: $(BIN)/python
	$(BIN)/pip install -q '.[sim]'
	$(BIN)/python -m vtc.sim $(SIM_ARGS)

## dev: editable install with the test and benchmark tools
dev: $(BIN)/python
	$(BIN)/pip install -q -e '.[test]'

## system-deps: Debian packages the tests need (redis-server: tests/redis and the engines'
## replica tests)
system-deps:
	@command -v redis-server >/dev/null || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq redis-server; }

## test: every test (the README's second command): test-core, then the SGLang and
## vLLM integrations against the real engines, each in its own virtualenv
test: test-core test-package test-sglang test-vllm

## test-package: build the sdist, the abi3 wheel from it (Rust + maturin only), install the
## wheel on another CPython minor version without Rust on PATH and run it (tests/package)
test-package: dev
	$(BIN)/python -m pytest -q -o addopts=-ra tests/package

## test-core: the fast suite: the Rust core's cargo tests, pytest (with Redis), ruff (lint and
## format), rustfmt, clippy, and mypy's stubtest: python/vtc/_core.pyi against the built
## extension (no drift)
test-core: system-deps dev
	cargo test --release -p vtc-core
	$(BIN)/python -m pytest -q
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	cargo fmt --all --check
	$(BIN)/python -m mypy.stubtest vtc._core
	cargo clippy -p vtc-core -p vtc-python --all-targets -- -D warnings

## test-loaded: a test target (LOADED, default test) while busy loops keep every core
## busy: a test that waits for a fixed time instead of a condition fails here
LOADED ?= test
test-loaded:
	scripts/with-load.sh $(MAKE) $(LOADED)

## lint: ruff and clippy only
lint: dev
	$(BIN)/ruff check .
	cargo clippy -p vtc-core -p vtc-python --all-targets -- -D warnings

## bench: benchmarks (pytest-benchmark and cargo bench); results in bench/results
bench: dev
	$(BIN)/python -m pytest bench -q --benchmark-only --benchmark-json=bench/results/pytest.json \
		--ignore=bench/test_vllm_overhead.py --ignore=bench/test_vllm_callgrind.py
	cargo bench -p vtc-core

## test-vllm: the vLLM integration (tests/vllm) against a real CPU vLLM, in its own
## virtualenv .venv-vllm (vLLM's pins stay out of .venv); scripts/install-vllm.sh installs it
VLLM_VENV ?= .venv-vllm

$(VLLM_VENV)/bin/python:
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip

test-vllm: system-deps $(VLLM_VENV)/bin/python
	bash scripts/install-vllm.sh $(VLLM_VENV)/bin/python
	$(VLLM_VENV)/bin/pip install -q '.[test]'
	$(VLLM_VENV)/bin/python -m pytest -q tests/vllm/test_vllm_scheduler.py tests/vllm/test_vllm_locality.py tests/vllm/test_vllm_startup.py \
		tests/vllm/test_vllm_server_locality.py \
		tests/vllm/test_vllm_e2e.py tests/vllm/test_vllm_dp.py tests/vllm/test_vllm_priority_e2e.py \
		tests/vllm/test_vllm_replicas.py
	$(VLLM_VENV)/bin/python -m pytest -q bench/test_vllm_overhead.py bench/test_vllm_callgrind.py \
		--benchmark-disable

clean:
	rm -rf $(VENV) target results

## test-sglang: SGLang 0.5.23 (CPU) and vtc in their own virtualenv, then tests/sglang
SGLANG_VENV ?= .venv-sglang
.PHONY: test-sglang
test-sglang: system-deps
	test -x $(SGLANG_VENV)/bin/python || $(PYTHON) -m venv $(SGLANG_VENV)
	$(SGLANG_VENV)/bin/python -m pip install -q --upgrade pip
	scripts/install-sglang.sh $(SGLANG_VENV)
	$(SGLANG_VENV)/bin/python -m pytest -q -o addopts=-ra tests/sglang
