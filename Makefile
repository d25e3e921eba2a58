# Every target sets up what it needs in .venv, so a fresh machine with only Python and pip works.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SCALE ?= default
PYTEST := TRITON_INTERPRET=1 $(BIN)/python -m pytest

.PHONY: hybrid-causes-full decomposition-full divergence engine-traces-full routing-full tiers-full setup test test-thorough mutants bench calibrate side-channel-timing upstream whole-traces-full hybrid-traces reproduce lint clean

$(STAMP): pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	# torch first and exactly: an unpinned torch would pull a multi-GB CUDA build.
	# No wheel cache: installed, the packages take 2.7 GB (triton 1.0, torch 0.75), and a CI
	# machine has run out of disk mid-install; a second copy of the wheels is the part we control.
	$(BIN)/pip install -q --no-cache-dir torch==2.13.0
	$(BIN)/pip install -q --no-cache-dir -c constraints.txt -e '.[test,paper,dev,ray,events]'
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
	$(BIN)/python -m prefixcache.experiments.bench.replay --whole
	$(BIN)/python -m prefixcache.experiments.bench.hashing
	$(BIN)/python -m prefixcache.experiments.bench.eviction
	$(BIN)/python -m pytest -q -p no:cacheprovider --benchmark-only tests/bench

side-channel-timing: $(STAMP)
	$(BIN)/python -m prefixcache.experiments.analysis.side_channel_timing

# The engine clock's constants, measured: times model-mode steps (GPU if present, else CPU) and
# rewrites prefixcache/cost_model_measured.json and results/bench/cost_model.csv (commit both;
# every engine study's cells rerun under the new clock). Run it on a quiet machine.
calibrate: $(STAMP)
	$(BIN)/python -m prefixcache.experiments.bench.cost_model

# The kernel on a GPU, once, start to finish in about 8 minutes (never in test, reproduce or CI):
# writes results/kernel_bench/ (commit it; fig_kernel reads it). GPU_PY is a python whose torch
# sees CUDA: .venv's if it has one, else python3 (a GPU image's own torch); the package is
# installed into it, offline and without dependencies, if it cannot import it.
GPU_PY ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,python3)
.PHONY: gpu-bench
gpu-bench:
	@$(GPU_PY) -c "import sys, torch; sys.exit(not torch.cuda.is_available())" 2>/dev/null || \
		{ echo "make gpu-bench: no CUDA device visible to $(GPU_PY)'s torch; run it on a GPU machine (GPU_PY=python3 for another python)" >&2; exit 1; }
	@$(GPU_PY) -c "import prefixcache.kernels.paged_attention" 2>/dev/null || \
		$(GPU_PY) -m pip install -q --no-deps --no-build-isolation --no-index -e .
	PYTHONUNBUFFERED=1 $(GPU_PY) -m prefixcache.experiments.bench.kernel --out results/kernel_bench $(GPU_BENCH_ARGS)

# Our backends against vLLM's and SGLang's own code (a separate venv; not part of CI).
upstream: $(STAMP)
	test -x .venv-upstream/bin/python || bash experiments/upstream/setup_venv.sh
	.venv-upstream/bin/python -m prefixcache.experiments.upstream.vs_upstream
	# Seeded random streams (100 per family, seeds 0 and 1) through both upstreams and ours, op by op.
	.venv-upstream/bin/python -m prefixcache.experiments.upstream.random_streams_vllm
	.venv-upstream/bin/python -m prefixcache.experiments.upstream.random_streams_sglang

# The divergence study's default-scale cells (float16 logits differ with the CPU's math paths):
# writes the committed results/divergence_measured/ that reproduce reads (about 2 minutes).
divergence: $(STAMP)
	$(BIN)/python -c "from prefixcache.experiments.figures import study_divergence as s; s.record_measurement()"

# Both whole Mooncake traces through both backends at every capacity (about an hour on 2 cores):
# writes the committed results/whole_traces_full/ that reproduce reads.
whole-traces-full: $(STAMP)
	$(BIN)/python -m prefixcache.experiments.figures.study_whole_traces --scale full --out results

# The whole Mooncake traces through the engine under the GPU roofline clock (120 cells, about an
# hour on 2 cores): writes the committed results/engine_traces_full/ that reproduce reads (its
# default scale reruns 8 of those cells and checks them against it).
engine-traces-full: $(STAMP)
	$(BIN)/python -m prefixcache.experiments.figures.study_engine_traces --scale full --out results

# The routing study's full grid (whole traces, 4/8/16 replicas x 1M/3M tokens, loads 0.5/0.8/1.0,
# every router: 984 cells of about a minute on 2 cores), as Ray tasks: results/routing_full/,
# committed and resumed from its table; MAX_CELLS=N runs only the next N missing cells, so the
# grid can span sessions.
routing-full: $(STAMP)
	$(BIN)/python -m prefixcache.experiments.figures.study_routing --scale full --out results \
		--executor ray --jobs $(or $(JOBS),2) $(if $(MAX_CELLS),--max-cells $(MAX_CELLS),)

# The decomposition study's full grid, whole traces included (about 40 minutes on 2 cores):
# results/decomposition_full/, committed.
decomposition-full: $(STAMP)
	$(BIN)/python -m prefixcache.experiments.figures.study_decomposition --scale full --out results

# The tier study's full grid (whole traces, 112 cells: about 3.5 hours on one core; the 1M-device
# half took 106 minutes) as Ray tasks:
# writes the committed results/tiers_full/. Resumable (a rerun skips finished cells);
# TIERS_FULL_ARGS picks a part, e.g. --traces mooncake-conversation --gpus 1000000.
TIERS_FULL_JOBS ?= 1
tiers-full: $(STAMP)
	$(BIN)/python -m prefixcache.experiments.figures.study_tiers --scale full --out results --executor ray --jobs $(TIERS_FULL_JOBS) $(TIERS_FULL_ARGS)

# The hybrid study's whole-trace cells (12, about half an hour on 2 cores): results/hybrid_traces/.
hybrid-traces: $(STAMP)
	$(BIN)/python -c "from pathlib import Path; from prefixcache.experiments.figures import study_hybrid as s; s.run_traces(Path('results'), False, 2)"

# The hybrid gaps explained on both whole traces (60 trace cells beside the workloads' 270,
# about half an hour on one core): results/hybrid_causes_full/, committed. Resumable (a rerun
# skips finished cells).
hybrid-causes-full: $(STAMP)
	$(BIN)/python -m prefixcache.experiments.figures.study_hybrid_causes --scale full --out results --jobs $(or $(JOBS),2)

reproduce: $(STAMP)
	$(BIN)/python -m prefixcache reproduce --scale $(SCALE) $(if $(FORCE),--force,)

lint: $(STAMP)
	$(BIN)/ruff check prefixcache backends kernels experiments tests
	$(BIN)/mypy prefixcache backends

clean:
	rm -rf $(VENV) .hypothesis
	# results/bench/, whole_traces_full/ and kernel_bench/ are committed (their own targets write them)
	find results -mindepth 1 -maxdepth 1 ! -name bench ! -name whole_traces_full ! -name kernel_bench \
		-exec rm -rf {} + 2>/dev/null || true
