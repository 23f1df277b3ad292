# Set-up and everyday commands. `make demo` and `make test` create .venv when it is missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: demo native lint test test-fast test-compat test-newest docs gpu-check bench bench-remat bench-gpu coverage zoo-check zoo-generations clean

# torch first: one already in the venv inside pyproject's range is kept; with none, this CPU
# build (lying on this machine's disk; a range would pull gigabytes of CUDA libraries).
DEFAULT_TORCH := 2.13.0

$(VENV)/.installed: pyproject.toml
	@echo "== setting up $(VENV) (once; a few minutes: torch and JAX are large downloads)"
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "== upgrading pip"
	$(PY) -m pip install --upgrade pip -q
	@echo "== torch: keeping one in the supported range, else installing $(DEFAULT_TORCH) (CPU)"
	$(PY) tools/ensure_torch.py $(DEFAULT_TORCH)
	@echo "== installing this project with JAX, optax and the test tools"
	$(PY) -m pip install -q -e '.[test]'
	@echo "== $(VENV) is ready"
	touch $@

.venv: $(VENV)/.installed native

# The engine's native helpers. The pool behind cpu_step_memory=pool (jax_backend/
# step_pool.py), plain C with no Python headers, so one build serves every venv. Without a C
# compiler the set-up goes on; that setting then says what is missing.
CC ?= cc
NATIVE_POOL := jax_backend/native/_step_pool.so
$(NATIVE_POOL): jax_backend/native/step_pool.c
	@command -v $(CC) > /dev/null || { echo "== no C compiler ($(CC)): cpu_step_memory=pool is unavailable"; exit 0; }; \
	echo "$(CC) -O2 -Wall -Wextra -Werror -shared -fPIC -o $@ $< -ldl -lpthread"; \
	$(CC) -O2 -Wall -Wextra -Werror -shared -fPIC -o $@ $< -ldl -lpthread

# And the JAX FFI custom calls in C++ (jax_backend/ffi_libraries.py): the layout copy behind
# cpu_half_dots=native, torch's convolution kernels behind cpu_convolutions=native, the fused
# optimizer update (cpu_optimizer) and the layer norm (cpu_layer_norm). Their
# ABI is the jaxlib (and torch) they are built against, so each venv builds its own
# (tools/build_native.py; up to date, it does nothing). Without a C++ compiler the set-up goes
# on and those settings fall back to torch's kernels through host callbacks.
native: $(NATIVE_POOL) $(VENV)/.installed
	$(PY) tools/build_native.py

demo: .venv
	$(PY) examples/mnist_mlp.py

# Ruff's formatter (a check: `ruff format .` rewrites), its linter with the rules in
# pyproject.toml ([tool.ruff]; import order among them) and mypy over jax_backend/
# ([tool.mypy]); CI runs all three before the tests.
lint: .venv
	$(PY) -m ruff format --check .
	$(PY) -m ruff check .
	$(PY) -m mypy

# The suites run in parallel processes (pytest-xdist): one per core, at most four (each test
# starts its own JAX; more workers than cores only interleave), a worker that runs dry taking
# tests queued for another (worksteal: the slowest tests take over a minute, and would leave
# one core idle at the end). Tests share nothing between them (tmp_path, the one reset fixture
# in tests/conftest.py), so any order and any split gives the same results.
PYTEST_WORKERS := -n auto --maxprocesses=4 --dist worksteal

# About a hundred tests start Python processes of their own (about 200 in all: a script run as
# a user runs it, an engine of the parity tool, a distributed worker). Importing torch and JAX
# takes three of a fresh process's four seconds here, so most of them are forked from a server
# that has imported both (tests/fork_server.py; CSTORCH_TEST_FORK_SERVER=0 starts every one
# afresh): `make test` took 16.8 minutes without it, 11.5 with it. Where
# PYTHONDONTWRITEBYTECODE is set (as on this machine), each process would also compile the
# project's modules from source again, half a second a process: they are compiled once, here,
# for the interpreter that runs the suite.
PRECOMPILE = -m compileall -q -j 0 cstorch jax_backend compat tests tools examples benchmarks

# Everything (CI runs this), with the 25 slowest tests listed at the end.
test: .venv
	$(PY) $(PRECOMPILE) > /dev/null
	$(PY) -m pytest -q tests $(PYTEST_WORKERS) --durations=25

# The inner loop: everything but the tests marked `slow` where they are written (about a minute
# on an idle 2-core machine; two to three on a busy one). The lane keeps itself: here an
# unmarked test that spends more than CSTORCH_TEST_BUDGET seconds of CPU (default 5) fails,
# telling you to mark it. CPU time, not wall time, and a budget five times the one-second rule
# for marking, so a busy or slower machine does not fail it; `make test` never checks.
test-fast: .venv
	$(PY) -m pytest -q tests -m "not slow"

# The user's guide (docs/guide, mkdocs.yml) into site/, warnings as errors, in its own venv
# (.venv-docs: MkDocs, Material, mkdocstrings; created when missing, with no torch or JAX:
# the API reference is read from the source, not imported).
DOCS_VENV := .venv-docs
$(DOCS_VENV)/.installed: pyproject.toml
	@echo "== setting up $(DOCS_VENV) (MkDocs, Material, mkdocstrings)"
	test -x $(DOCS_VENV)/bin/python || $(PYTHON) -m venv $(DOCS_VENV)
	$(DOCS_VENV)/bin/python -m pip install -q -r tools/docs_requirements.txt
	touch $@

docs: $(DOCS_VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(DOCS_VENV)/bin/mkdocs build --strict --quiet

# The other end of the supported range (README "Versions"), in its own venv: the oldest torch
# and JAX, and numpy 1.26, on Python 3.12 where one runs (else $(PYTHON)), on the tests marked
# `core` (CORE_TESTS): the engine (every test of tests/jax_backend), export, graph cache,
# parity, storage round trip, distributed basics, faults, the version checks. `core` is set at
# the module (`pytestmark`; tests/jax_backend/conftest.py for the engine); the tests there
# marked `heavy` (many seconds each: several processes, long runs, repeating on every stack
# what a cheaper neighbour checks) run in `make test` only, keeping each leg to a few minutes.
COMPAT_VENV := .venv-compat
COMPAT_PYTHON ?= $(or $(shell for p in python3.12 $(HOME)/.pyenv/versions/3.12*/bin/python3.12; \
	do $$p -c '' 2>/dev/null && { echo $$p; break; }; done),$(PYTHON))
COMPAT_PY := $(COMPAT_VENV)/bin/python
COMPAT_TORCH ?= 2.9.1
COMPAT_JAX ?= 0.7.0
COMPAT_NUMPY ?= 1.26.4
CORE_TESTS := tests -m "core and not heavy"
# The newest leg adds the core tests marked `newest` (the op-coverage gate: about 1.5 minutes).
NEWEST_CORE_TESTS := tests -m "core and (not heavy or newest)"

$(COMPAT_VENV)/.installed: pyproject.toml Makefile
	test -x $(COMPAT_PY) || $(COMPAT_PYTHON) -m venv $(COMPAT_VENV)
	$(COMPAT_PY) -m pip install --upgrade pip -q
	printf 'torch==$(COMPAT_TORCH)\njax==$(COMPAT_JAX)\njaxlib==$(COMPAT_JAX)\nnumpy==$(COMPAT_NUMPY)\n' \
		> $(COMPAT_VENV)/constraints.txt
	$(COMPAT_PY) -m pip install -q -c $(COMPAT_VENV)/constraints.txt torch==$(COMPAT_TORCH)
	$(COMPAT_PY) -m pip install -q -c $(COMPAT_VENV)/constraints.txt -e '.[test]'
	touch $@

test-compat: $(COMPAT_VENV)/.installed $(NATIVE_POOL)
	$(COMPAT_PY) tools/build_native.py
	$(COMPAT_PY) -c "import sys, torch, jax, numpy; print('compat stack: Python', \
		sys.version.split()[0], 'torch', torch.__version__, 'JAX', jax.__version__, \
		'numpy', numpy.__version__)"
	$(COMPAT_PY) $(PRECOMPILE) > /dev/null
	$(COMPAT_PY) -m pytest -q $(CORE_TESTS) $(PYTEST_WORKERS)

# The newest end of the supported range, in its own venv: Python 3.13 where one runs (else 3.12,
# else $(PYTHON)) with the newest torch, JAX and the rest that pyproject's ranges allow on the
# index (`pip install -U`: torch 2.15 comes as its CUDA build, ~4.6 GB, 3 to 12 minutes here).
# NEWEST_TORCH=2.14.1 (or NEWEST_JAX=...) pins a release instead. The venv's own constraints
# file takes the place of any in pip's configuration (a machine's cap on torch would hold the
# leg back), every other pip setting (index, certificate) is kept. It checks the JAX names, runs
# the demo, then the compat leg's tests (`core and not heavy`: the lowerings, the parity
# tool's and tests/test_versions.py among them) and the op-coverage gate (`newest`), with every deprecation warning attributed to
# the project's code an error (tests/conftest.py).
NEWEST_VENV := .venv-newest
NEWEST_PYTHON ?= $(or $(shell for p in python3.13 $(HOME)/.pyenv/versions/3.13*/bin/python3.13 \
	python3.12 $(HOME)/.pyenv/versions/3.12*/bin/python3.12; \
	do $$p -c '' 2>/dev/null && { echo $$p; break; }; done),$(PYTHON))
NEWEST_PY := $(NEWEST_VENV)/bin/python
NEWEST_TORCH ?=
NEWEST_JAX ?=

$(NEWEST_VENV)/.installed: pyproject.toml Makefile
	test -x $(NEWEST_PY) || $(NEWEST_PYTHON) -m venv $(NEWEST_VENV)
	$(NEWEST_PY) -m pip install --upgrade pip -q
	printf '# the newest leg: pins given to make, nothing else\n$(if $(NEWEST_TORCH),torch==$(NEWEST_TORCH)\n)$(if $(NEWEST_JAX),jax==$(NEWEST_JAX)\njaxlib==$(NEWEST_JAX)\n)' \
		> $(NEWEST_VENV)/constraints.txt
	PIP_CONSTRAINT=$(NEWEST_VENV)/constraints.txt $(NEWEST_PY) -m pip install -q -U -e '.[test]'
	touch $@

test-newest: $(NEWEST_VENV)/.installed $(NATIVE_POOL)
	$(NEWEST_PY) tools/build_native.py
	$(NEWEST_PY) -c "import sys, torch, jax, numpy; print('newest stack: Python', \
		sys.version.split()[0], 'torch', torch.__version__, 'JAX', jax.__version__, \
		'numpy', numpy.__version__)"
	$(NEWEST_PY) tools/jax_names.py
	$(NEWEST_PY) examples/mnist_mlp.py
	$(NEWEST_PY) $(PRECOMPILE) > /dev/null
	CSTORCH_TEST_DEPRECATIONS=error $(NEWEST_PY) -m pytest -q $(NEWEST_CORE_TESTS) $(PYTEST_WORKERS)

# Parity of the examples (eager vs JAX on the GPU, or on the CPU without one) and the GPU
# benchmark, as JSON in GPU_CHECK_OUT. Needs no venv: on a GPU machine it runs the source
# tree with that machine's python3 (GPU_CHECK_ARGS=--quick for a few-minute run on a CPU).
GPU_PYTHON ?= $(if $(wildcard $(PY)),$(PY),python3)
GPU_CHECK_OUT ?= artifacts/gpu_check
GPU_CHECK_ARGS ?=
gpu-check:
	$(GPU_PYTHON) tools/gpu_check.py --out $(GPU_CHECK_OUT) $(GPU_CHECK_ARGS)

BENCH_ROUNDS ?= 3
bench: .venv
	mkdir -p artifacts
	$(PY) benchmarks/bench_engine.py --rounds $(BENCH_ROUNDS) --precision fp32,bf16 --step-memory lean,xla,reuse --executor-runs --depth-sweep --interference --json artifacts/bench_engine.json

# Activation checkpointing's memory (issue 44): eager torch vs cstorch, each block plain or in
# torch.utils.checkpoint, each in its own process (about 10 minutes on 2 cores; not in `bench`).
bench-remat: .venv
	mkdir -p artifacts
	$(PY) benchmarks/bench_remat.py --step-memory lean,xla --json artifacts/bench_remat.json

# The GPU benchmark (benchmarks/bench_gpu.py) runs from the source tree with GPU_PYTHON (above:
# a GPU machine's own torch and JAX; no venv, nothing installed).
bench-gpu:
	mkdir -p artifacts
	PYTHONPATH=.:compat $(GPU_PYTHON) benchmarks/bench_gpu.py --json artifacts/bench_gpu.json

coverage: .venv
	$(PY) tools/op_coverage.py

# The unchanged Cerebras Model Zoo on this project (tests/zoo/README.md). Fetches nothing:
# MODELZOO_SRC is a zoo Release_2.10.0 checkout's src/, ZOO_PYTHON a venv with the zoo's deps,
# REFERENCE_PYTHON (optional) a venv with cerebras-pytorch 2.10 for the sweep's comparison.
ZOO_PYTHON ?= $(PY)
REFERENCE_PYTHON ?=
ZOO_SWEEP_JOBS ?= 2
zoo-check: .venv
	@test -n "$(MODELZOO_SRC)" || { echo "Set MODELZOO_SRC=/path/to/modelzoo/src (see tests/zoo/README.md)"; exit 2; }
	$(ZOO_PYTHON) tools/zoo_scan.py $(MODELZOO_SRC)
	MODELZOO_SRC=$(MODELZOO_SRC) ZOO_PYTHON=$(ZOO_PYTHON) $(PY) -m pytest -q tests/zoo
	$(PY) tools/zoo_sweep.py $(MODELZOO_SRC) --zoo-python $(ZOO_PYTHON) --jobs $(ZOO_SWEEP_JOBS) \
		$(if $(REFERENCE_PYTHON),--reference-python $(REFERENCE_PYTHON))

# Every release line of the real Model Zoo, run unchanged through its own run.py
# (tools/zoo_generations.py, tests/zoo/README.md). Fetches nothing: MODELZOO_SRC is a Model Zoo
# git clone (or bare git dir) holding the release tags; ZOO_PYTHON a venv with the zoo's deps;
# ZOO_LINES picks release lines (e.g. 2.3,2.2; 1.9,1.9-runner,1.8,1.8-runner,1.7,1.6 for the
# 1.x lines, tests/zoo/GENERATIONS_1x.md; default all).
ZOO_LINES ?=
zoo-generations: .venv
	@test -n "$(MODELZOO_SRC)" || { echo "Set MODELZOO_SRC=/path/to/a/modelzoo/git/clone (see tests/zoo/README.md)"; exit 2; }
	$(PY) tools/zoo_generations.py $(MODELZOO_SRC) --zoo-python $(ZOO_PYTHON) \
		$(if $(ZOO_LINES),--lines $(ZOO_LINES)) $(if $(ZOO_CSX_EVAL),--csx-eval)

clean:
	rm -rf artifacts cerebras_logs .pytest_cache site
