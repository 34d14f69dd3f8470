# vtc developer targets. Everything runs in a local virtualenv (.venv) so a
# fresh machine needs only python3 (with venv), cargo and this checkout.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
SIM_ARGS ?= all --out results

.PHONY: run test dev lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

## run: build and install vtc, then run every simulation experiment (the main job)
run: $(BIN)/python
	$(BIN)/pip install -q .
	$(BIN)/python -m vtc.sim $(SIM_ARGS)

## dev: editable install with the test and benchmark tools
dev: $(BIN)/python
	$(BIN)/pip install -q -e '.[test]'

## test: every test: the Rust core's cargo tests, then pytest, then the linters
test: dev
	cargo test --release -p vtc-core
	$(BIN)/python -m pytest -q
	$(BIN)/ruff check .
	cargo clippy -p vtc-core -p vtc-python --all-targets -- -D warnings

## lint: ruff and clippy only
lint: dev
	$(BIN)/ruff check .
	cargo clippy -p vtc-core -p vtc-python --all-targets -- -D warnings

## bench: benchmarks (pytest-benchmark and cargo bench); results in bench/results
bench: dev
	$(BIN)/python -m pytest bench -q --benchmark-only --benchmark-json=bench/results/pytest.json
	cargo bench -p vtc-core

clean:
	rm -rf $(VENV) target results
