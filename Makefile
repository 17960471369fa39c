# populi: `make test` and `make demo` are the contract (see README.md).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: all test fuzz demo bench lint typecheck sysdeps engine clean compiled test-compiled

# `make`: the virtual environment and the engine (llama.cpp's llama-server, below), so
# that a fresh machine can run `populi-node up --gguf MODEL.gguf` with nothing else.
.DEFAULT_GOAL := all

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test,sim]'
	touch $(STAMP)

# A real inference engine for the real-engine tests and the demo: llama.cpp's own
# `llama-server` (it continues a partial answer, so a failed-over stream at temperature
# 0 is the uninterrupted text), CPU only, built from the llama.cpp that llama-cpp-python's
# PyPI sdist vendors (CI reaches PyPI, not GitHub). scripts/build-llama-server.sh says
# how; about 4 to 10 minutes at -j2 under nice on a busy 2-core machine
# (docs/testing.md). The binary is cached in ~/.cache/populi, so a rebuild (or a fresh
# clone) is a copy; nodes find it beside .venv/bin/python (`populi-node up --gguf`).
LLAMA_SERVER := $(BIN)/llama-server

$(LLAMA_SERVER): scripts/build-llama-server.sh | $(STAMP)
	PY=$(BIN)/python bash scripts/build-llama-server.sh $@

engine: $(LLAMA_SERVER)

all: $(STAMP) $(LLAMA_SERVER)

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

# sysdeps first: the engine build needs g++ and cmake. The test files run on
# TEST_WORKERS workers (pytest-xdist), each file whole on one worker, so that its
# module-scoped meshes stay one; most of the suite's time is real daemons waiting out
# protocol windows, which overlap well (docs/testing.md). Then the swim and simulator
# tests again on the optional compiled build (`compiled`, below), so the same tests
# cover both.
TEST_WORKERS ?= 2
test: $(STAMP) sysdeps $(LLAMA_SERVER) lint
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile
	$(MAKE) test-compiled

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

# Optional: swim/'s per-packet modules and the simulator's engine compiled by mypyc into
# build/mypyc (simulations/compiled.py; needs a C compiler), for long simulations
# (`populi-sim --compiled run ...`, about 1.3x faster, the same digests). The daemon runs
# the interpreted sources; `make test-compiled` runs the swim and simulator tests again on
# the build (tests/simulations/test_compiled.py compares its digests with the sources').
compiled: $(STAMP)
	$(BIN)/python -m simulations.compiled

test-compiled: compiled
	POPULI_MYPYC_BUILD=build/mypyc $(BIN)/python -m pytest -q tests/swim tests/simulations

bench: $(STAMP) $(LLAMA_SERVER)
	@for b in benchmarks/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
