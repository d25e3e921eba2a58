# Every target sets up what it needs in .venv, so a fresh machine with only Python and pip works.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SCALE ?= default
PYTEST := TRITON_INTERPRET=1 $(BIN)/python -m pytest

.PHONY: setup test test-thorough mutants bench upstream whole-traces-full reproduce lint clean

$(STAMP): pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	# torch first and exactly: an unpinned torch would pull a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -c constraints.txt -e '.[test,paper,dev]'
	touch $(STAMP)

setup: $(STAMP)

test: $(STAMP)
	HYPOTHESIS_PROFILE=ci $(PYTEST) -n 2 -m "not slow" --ignore=tests/bench tests

test-thorough: $(STAMP)
	HYPOTHESIS_PROFILE=thorough $(PYTEST) -n 2 --ignore=tests/bench tests

mutants: $(STAMP)
	$(BIN)/python -m tests.mutants

bench: $(STAMP)
	$(BIN)/python -m prefixcache.experiments.bench.ops
	$(BIN)/python -m prefixcache.experiments.bench.replay
	$(BIN)/python -m prefixcache.experiments.bench.hashing
	$(BIN)/python -m prefixcache.experiments.bench.eviction
	$(BIN)/python -m pytest -q -p no:cacheprovider --benchmark-only tests/bench

# Our backends against vLLM's and SGLang's own code (a separate venv; not part of CI).
upstream: $(STAMP)
	test -x .venv-upstream/bin/python || bash experiments/upstream/setup_venv.sh
	.venv-upstream/bin/python -m prefixcache.experiments.upstream.vs_upstream

# Both whole Mooncake traces through both backends at every capacity (about an hour on 2 cores):
# writes the committed results/whole_traces_full/ that reproduce reads.
whole-traces-full: $(STAMP)
	$(BIN)/python -m prefixcache.experiments.figures.study_whole_traces --scale full --out results

reproduce: $(STAMP)
	$(BIN)/python -m prefixcache reproduce --scale $(SCALE) $(if $(FORCE),--force,)

lint: $(STAMP)
	$(BIN)/ruff check prefixcache backends kernels experiments tests
	$(BIN)/mypy prefixcache backends

clean:
	rm -rf $(VENV) .hypothesis
	# results/bench/ and results/whole_traces_full/ are committed (their own targets write them)
	find results -mindepth 1 -maxdepth 1 ! -name bench ! -name whole_traces_full -exec rm -rf {} + 2>/dev/null || true
