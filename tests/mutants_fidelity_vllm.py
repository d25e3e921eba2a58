"""Mutants of issue 33's vLLM-fidelity fixes in the hashchain host tier (same shape as
tests/mutants.py): each undoes one fix; the suites in SUITES must fail under it (checked by
hand, in a copy of the repo). Case 4 (partial-tail KV events) has no mutant yet: it is not
modelled (its test is a strict xfail)."""

from __future__ import annotations

SUITES = [
    "tests/test_hashchain_fidelity_cases.py",
    "tests/test_hashchain_offload.py",
    "tests/test_engine_tiers.py",
]

T = "backends/hashchain/offload/tier.py"
C = "backends/hashchain/offload/connector.py"
# name -> (file, original text, mutated text); the original text occurs exactly once
MUTANTS: dict[str, tuple[str, str, str]] = {
    "fidelity: an async host load's admission reserves the whole prompt (not the loaded blocks)": (
        T,
        "            num_slots = match.external_tokens  # a full-prompt hit: its last token too, as vLLM\n",
        "            num_slots = req.num_tokens - match.tokens\n",
    ),
    "fidelity: the engine admits an async host load with its whole first chunk (case 1)": (
        "prefixcache/engine.py",
        "            if not self._allocate(req, 0 if loads_later else n, match):",
        "            if not self._allocate(req, n, match):",
    ),
    "fidelity: the replay harness admits an async host load with its whole first chunk (case 1)": (
        "experiments/upstream/offload_cases.py",
        "        if external and m.host_tokens:",
        "        if False:",
    ),
    "fidelity: each finished request's recency is committed right after its own final store": (
        C,
        "            self._build_store_job(status, end, finished=True)\n"
        "        # Only once every store of the step is made (vLLM build_connector_meta): a recency\n"
        "        # commit (ARC's T2 promotion) must not reorder the next finished request's evictions.\n"
        "        for rid in finished:\n"
        "            status = self._req_status[rid]\n"
        "            status.finished_signaled = True\n",
        "            self._build_store_job(status, end, finished=True)\n"
        "            status.finished_signaled = True\n",
    ),
    "fidelity: a finished load caches its blocks and the reserved ones in one BlockStored": (
        T,
        "        self.manager.cache_blocks(req, num_loaded_tokens)\n        reserved =",
        "        self.manager.cache_blocks(req, max(num_loaded_tokens, min(self.cache.reserved_tokens(req), "
        "req.num_tokens)))\n        reserved =",
    ),
}
