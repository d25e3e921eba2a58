#!/usr/bin/env bash
# Builds .venv-upstream: vLLM 0.33.0 and SGLang 0.5.23 importable on CPU, for
# experiments/upstream/vs_upstream.py (not needed by the tests: they replay recorded fixtures).
# Everything goes in with --no-deps: vllm's and sglang's declared deps pull a multi-GB CUDA torch.
# requirements-upstream.txt pins the packages their import chains actually need (found one
# ImportError at a time). torchvision is NOT installed (PyPI's wheels are CUDA builds that do
# not load next to the CPU torch): experiments/upstream/shim.py stubs it.
set -euo pipefail
cd "$(dirname "$0")/../.."
V=.venv-upstream
python3 -m venv "$V"
"$V/bin/pip" install -q torch==2.13.0
"$V/bin/pip" install -q --no-deps vllm==0.33.0 sglang==0.5.23
"$V/bin/pip" install -q --no-deps -r experiments/upstream/requirements-upstream.txt
"$V/bin/pip" install -q --no-deps -e .
"$V/bin/python" -c "import torch, sys; sys.exit('a CUDA torch crept in' if torch.version.cuda else 0)"
