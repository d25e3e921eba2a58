"""Mutants of the hashchain host tier (vLLM 0.33's OffloadingConnector; same shape as
tests/mutants.py): each breaks one behaviour; the suites in SUITES must fail under it (checked
by hand, in a copy of the repo)."""

from __future__ import annotations

SUITES = [
    "tests/test_hashchain_offload.py",
    "tests/test_stateful_offload_hashchain.py",
]

C = "backends/hashchain/offload/connector.py"
# name -> (file, original text, mutated text); the original text occurs exactly once
MUTANTS: dict[str, tuple[str, str, str]] = {
    "offload: a chunk is stored before its tokens are computed (past the committed KV)": (
        C,
        "            num_offloadable // spec.tokens_per_chunk,\n",
        "            len(status.offload_keys),\n",
    ),
    "offload: a chunk keyed by its first block's hash (a chunk shared only in part hits)": (
        C,
        "return [hashes[i] + suffix for i in range(hpc - 1, len(hashes), hpc)]",
        "return [hashes[i] + suffix for i in range(0, len(hashes), hpc)]",
    ),
    "offload: lookup does not stop at the first missing chunk": (
        C,
        "            if result is LookupResult.MISS:\n                break",
        "            if result is LookupResult.MISS:\n                continue",
    ),
    "offload: a chunk still being stored (HIT_PENDING) counts as a ready hit": (
        C,
        "            pending |= result is LookupResult.HIT_PENDING",
        "            pending |= False",
    ),
    "offload: an external hit under one chunk is loaded": (
        C,
        "        if num_hit < tpc:\n            return 0",
        "        if num_hit < 1:\n            return 0",
    ),
    "offload: a store is acknowledged a step early (in the step that builds it)": (
        C,
        "        due = self._step + 1 + self.ack_delay",
        "        due = self._step + self.ack_delay",
    ),
    "offload: a load's chunks are offered for store again (request-level policy)": (
        C,
        "        status.next_stored_chunk_idx = end_chunk",
        "        status.next_stored_chunk_idx = 0",
    ),
    "offload: finished requests store their whole prompt, computed or not": (
        C,
        "            end = min(max(req.num_prompt_tokens, req.num_tokens - 1), status.computed_at_release)",
        "            end = max(req.num_prompt_tokens, req.num_tokens - 1)",
    ),
    "offload lru: a finished request's head is evicted first (recency head-first)": (
        "backends/hashchain/offload/lru_manager.py",
        "        self._renew(reversed(order_request_keys(keys, ctx)))",
        "        self._renew(order_request_keys(keys, ctx))",
    ),
    "offload lru: a running request's chunks rank head first": (
        "backends/hashchain/offload/lru_manager.py",
        "            rank = (request_rank, -position)",
        "            rank = (request_rank, position)",
    ),
    "offload arc: a reused chunk is not promoted to T2": (
        "backends/hashchain/offload/arc_manager.py",
        "            elif key in reused and key in self.t1:\n                self.t2[key] = self.t1.pop(key)",
        "            elif key in reused and key in self.t1:\n                self.t1.move_to_end(key)",
    ),
    "offload manager: a load does not pin its chunks": (
        "backends/hashchain/offload/cpu_manager.py",
        "            chunk.ref_cnt += 1\n            ids.append(chunk.chunk_id)",
        "            ids.append(chunk.chunk_id)",
    ),
    "offload manager: store_threshold ignored": (
        "backends/hashchain/offload/cpu_manager.py",
        "            to_store = [k for k in to_store if self.counts.get(k, 0) >= self.store_threshold]",
        "            to_store = list(to_store)",
    ),
    "offload tier: a full-prompt external hit loads every token (none left to compute)": (
        "backends/hashchain/offload/tier.py",
        "        host = min(external, req.num_tokens - 1 - match.tokens)",
        "        host = external",
    ),
    "offload tier: blocks being loaded are cached at once (another request hits them)": (
        "backends/hashchain/offload/tier.py",
        "            delay_cache_blocks=match.host_tokens > 0,",
        "            delay_cache_blocks=False,",
    ),
    "offload backend: a host change does not invalidate a match (stale host part trusted)": (
        "backends/hashchain/backend.py",
        "        return version if self.offload is None else version + self.offload.version",
        "        return version",
    ),
}
