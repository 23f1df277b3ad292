# Set-up and everyday commands. `make demo` and `make test` create .venv when it is missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: demo test test-fast bench bench-gpu coverage zoo-check clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip -q
	# torch first, pinned: any other torch would pull gigabytes of CUDA libraries.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	touch $@

.venv: $(VENV)/.installed

demo: .venv
	$(PY) examples/mnist_mlp.py

# Everything (CI runs this), with the 25 slowest tests listed at the end.
test: .venv
	$(PY) -m pytest -q tests --durations=25

# The inner loop: everything but the tests listed in tests/slow_tests.txt (about 2 minutes on
# 2 cores).
test-fast: .venv
	$(PY) -m pytest -q tests -m "not slow"

BENCH_ROUNDS ?= 3
bench: .venv
	mkdir -p artifacts
	$(PY) benchmarks/bench_engine.py --rounds $(BENCH_ROUNDS) --precision fp32,bf16 --depth-sweep --interference --json artifacts/bench_engine.json

# The GPU benchmark (benchmarks/bench_gpu.py) runs from the source tree with the Python it
# finds (a GPU machine's own torch and JAX; no venv, nothing installed): GPU_PYTHON=... to pick.
GPU_PYTHON ?= $(if $(wildcard $(PY)),$(PY),python3)
bench-gpu:
	mkdir -p artifacts
	PYTHONPATH=.:compat $(GPU_PYTHON) benchmarks/bench_gpu.py --json artifacts/bench_gpu.json

coverage: .venv
	$(PY) tools/op_coverage.py

# The unchanged Cerebras Model Zoo on this project (tests/zoo/README.md). Fetches nothing:
# MODELZOO_SRC is a zoo Release_2.10.0 checkout's src/, ZOO_PYTHON a venv with the zoo's deps.
ZOO_PYTHON ?= $(PY)
zoo-check: .venv
	@test -n "$(MODELZOO_SRC)" || { echo "Set MODELZOO_SRC=/path/to/modelzoo/src (see tests/zoo/README.md)"; exit 2; }
	$(ZOO_PYTHON) tools/zoo_scan.py $(MODELZOO_SRC)
	MODELZOO_SRC=$(MODELZOO_SRC) ZOO_PYTHON=$(ZOO_PYTHON) $(PY) -m pytest -q tests/zoo

clean:
	rm -rf artifacts cerebras_logs .pytest_cache
