"""Upstream-fidelity harness: the same scripted request sequences replayed through vLLM's
``vllm.v1.core`` and SGLang's ``RadixCache`` (in ``.venv-upstream``) and through our backends.

``scenarios`` and ``ours`` need nothing but prefixcache (CI replays recorded fixtures with
them); ``vllm_driver`` and ``sglang_driver`` import the upstream packages and are only used by
``experiments/upstream/vs_upstream.py``.
"""
