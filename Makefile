# populi: `make test` and `make demo` are the contract (see README.md).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test fuzz demo bench lint typecheck sysdeps engine clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test,sim]'
	touch $(STAMP)

# A real inference engine for tests/mesh/test_real_engine.py: llama.cpp through
# llama-cpp-python's OpenAI-compatible server. PyPI has only its sdist, so pip compiles
# llama.cpp (cmake + gcc, CPU only): the cheapest build we found is below (no native
# tuning, so the cached wheel runs on any AVX2 CPU; no multimodal library, BLAS, OpenMP);
# about 8 minutes at -j2 on a busy 2-core machine (docs/testing.md). pip caches the
# built wheel, so a second install takes seconds; the stamp makes this a no-op after.
LLAMA_CPP_PYTHON := llama-cpp-python[server]==0.3.16
ENGINE_STAMP := $(VENV)/.engine
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF -DGGML_BLAS=OFF -DGGML_OPENMP=OFF \
	-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
	-DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF

$(ENGINE_STAMP): Makefile | $(STAMP)
	@echo "engine: installing $(LLAMA_CPP_PYTHON) (the first time compiles llama.cpp: minutes)"
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" CMAKE_BUILD_PARALLEL_LEVEL=$${CMAKE_BUILD_PARALLEL_LEVEL:-2} \
		nice -n 10 $(BIN)/python -m pip install --quiet '$(LLAMA_CPP_PYTHON)'
	$(BIN)/python -c 'import llama_cpp.server'
	touch $(ENGINE_STAMP)

engine: $(ENGINE_STAMP)

# Packages the network tests need (WireGuard, namespaces, firewall, a C compiler for the
# fake NVML, Chromium for the dashboard test). Installed only when running as root on
# Debian/Ubuntu; elsewhere the tests that need them skip with a reason.
sysdeps:
	@bash scripts/install-sysdeps.sh

# The packages mypy checks (strict, see pyproject.toml).
TYPED := swim overlay populi_p2p simulations

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy $(wildcard $(TYPED))

# sysdeps first: the engine build needs g++ and cmake.
test: $(STAMP) sysdeps $(ENGINE_STAMP) lint
	$(BIN)/python -m pytest

# Random exploration, kept out of `make test` (which is derandomized, see
# tests/conftest.py and docs/testing.md): every Hypothesis test with random examples and
# 10x as many of them. A counterexample found here becomes an @example on the test.
FUZZ_TESTS ?= $(shell grep -rl --include='*.py' -e '@given' tests)
fuzz: $(STAMP)
	HYPOTHESIS_PROFILE=fuzz $(BIN)/python -m pytest -q $(FUZZ_TESTS)

# A real 5-node mesh on loopback (separate processes, a kill -9 seen by all, a streamed
# chat completion surviving its serving node's kill -9, a task surviving its owner's),
# then the simulator's view of a 200-member cluster with a crash and a slow member.
demo: $(STAMP)
	@$(BIN)/python -c 'import openai' 2>/dev/null || $(BIN)/python -m pip install --quiet -e '.[demo]'
	$(BIN)/python -m populi_p2p.demo
	$(BIN)/python -m simulations.demo

bench: $(STAMP)
	@for b in benchmarks/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
