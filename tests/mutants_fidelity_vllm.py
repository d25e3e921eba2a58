"""Mutants of issue 33's vLLM-fidelity fixes in the hashchain host tier (same shape as
tests/mutants.py): each undoes one fix; the suites in SUITES must fail under it (checked by
hand, in a copy of the repo). Case 4's (partial-tail keys at a prefix_match_unit below the block
size) undo it in backends/hashchain/."""

from __future__ import annotations

SUITES = [
    "tests/test_hashchain_fidelity_cases.py",
    "tests/test_hashchain_offload.py",
    "tests/test_engine_tiers.py",
    "tests/test_engine_admission_gate.py",
    "tests/test_stateful_offload_hashchain.py",  # catches cases 1-3 on its own as well
]

T = "backends/hashchain/offload/tier.py"
C = "backends/hashchain/offload/connector.py"
P = "backends/hashchain/block_pool.py"
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
    "fidelity: no partial-tail key at a prefix_match_unit below the block size (case 4)": (
        "backends/hashchain/single_type_kv_cache_manager.py",
        "        if hashes.units_per_block > 1:  # vLLM: on every call",
        "        if False:  # vLLM: on every call",
    ),
    "fidelity: an evicted block's partial-tail key leaves the map without its BlockRemoved (case 4)": (
        P,
        "        keys = self._keys_of(block)  # vLLM 0.33: BlockRemoved for its hash, then its further"
        " keys\n",
        "        keys = [key]\n",
    ),
    "fidelity: a reused block's partial-tail key leaves the map without its BlockRemoved (case 4)": (
        P,
        "self.kv_events.emit_block_removed_events([key for b in blocks for key in self._keys_of(b)])",
        "self.kv_events.emit_block_removed_events("
        "[b.block_hash for b in blocks if b.block_hash is not None])",
    ),
    "fidelity: a partial tail evicted in use is not keyed again (cache_blocks gated, case 4)": (
        "backends/hashchain/kv_cache_manager.py",
        "            self.hasher.units_per_block > 1\n            or self.coordinator",
        "            False\n            or self.coordinator",
    ),
    "fidelity: scheduler_reserve_full_isl admits a request whose whole sequence does not fit": (
        "prefixcache/engine.py",
        "            if self.scheduler_reserve_full_isl and not self.cache.whole_sequence_fits(req, match):",
        "            if False:",
    ),
    "fidelity: the whole-sequence gate counts no free hit block (vLLM touches them out of the queue)": (
        "backends/hashchain/single_type_kv_cache_manager.py",
        "        return num_new + sum(1 for b in kept if b.ref_cnt == 0 and not b.is_null)",
        "        return num_new",
    ),
    "fidelity: a finished load caches its blocks and the reserved ones in one BlockStored": (
        T,
        "        self.manager.cache_blocks(req, num_loaded_tokens)\n        reserved =",
        "        self.manager.cache_blocks(req, max(num_loaded_tokens, min(self.cache.reserved_tokens(req), "
        "req.num_tokens)))\n        reserved =",
    ),
    "fidelity: a finished load caches nothing (the loaded blocks wait for the computed ones)": (
        T,
        "        self.manager.cache_blocks(req, num_loaded_tokens)\n        reserved =",
        "        reserved =",
    ),
    "fidelity: a host load is never pending (its acknowledgement not observable)": (
        T,
        "        return self.is_live(req) and self.connector.load_in_flight(req.request_id)\n",
        "        return False\n",
    ),
}
