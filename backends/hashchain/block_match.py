"""``BlockMatch``: the hashchain backend's lookup result (its own module: the host tier reads it
without importing the backend)."""

from __future__ import annotations

from dataclasses import dataclass

from prefixcache.backends.hashchain.kv_cache_coordinator import KVCacheBlocks

from prefixcache.interface import Match


@dataclass(frozen=True, slots=True, eq=False)
class BlockMatch(Match):
    """``get_computed_blocks``' result, handed to ``allocate_slots`` as vLLM does."""

    blocks: KVCacheBlocks  # the hit blocks of each group
    shared_prefix_boundary: int = 0  # vLLM 0.33: a junction sparse retention must keep (0: none)
    # The host tier's part (offload/tier.py): loaded tokens after ``tokens``; vLLM's external
    # hit (may be one more: a full-prompt hit); the lookup was deferred (HIT_PENDING).
    host_tokens: int = 0
    external_tokens: int = 0
    pending: bool = False
