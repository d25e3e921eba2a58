"""``MambaManager`` in vLLM 0.33's "align" mode (``single_type_kv_cache_manager.py``), the only
mode in which vLLM caches Mamba states (prefix caching switches it on; "none" caches nothing).

A Mamba layer keeps one recurrent state per request, not KV per token. Block i of a request's
table holds the state after token (i + 1) * block_size; only the block of the latest state is
live, the others are the null block. So:

  * a hit is the rightmost cached state within the limit: ``[null] * i + [block i]``;
  * a step that crosses a block boundary allocates one block (the new state); the states
    before the last computed token are freed at the next allocate (the latest one is the
    copy source of the new one until then);
  * freed states keep their hash until the block is reused: they stay hits.

Scope (ours): no speculative blocks, no prefill checkpoint blocks, no partial (sub-block) hits,
and no per-step guard (vLLM defers a request whose hit was cached in the same scheduler step;
our contract has no steps). The scheduler must end prefill chunks on block boundaries for a
state to be cached (vLLM's align mode does).
"""

from __future__ import annotations

from collections.abc import Sequence

from prefixcache.backends.hashchain.block import KVCacheBlock
from prefixcache.backends.hashchain.block_pool import BlockPool
from prefixcache.backends.hashchain.hashing import RequestHashes
from prefixcache.backends.hashchain.single_type_kv_cache_manager import (
    AttentionGroupSpec,
    SingleTypeKVCacheManager,
)


class MambaManager(SingleTypeKVCacheManager):
    __slots__ = ("num_retired_blocks",)

    def __init__(
        self, spec: AttentionGroupSpec, block_pool: BlockPool, block_size: int, group_id: int
    ) -> None:
        super().__init__(spec, block_pool, block_size, group_id)
        # Leading blocks already retired (nulled) by remove_skipped_blocks.
        self.num_retired_blocks: dict[str, int] = {}

    # ---------------------------------------------------------------- lookup
    def find_longest_cache_hit(
        self,
        hashes: RequestHashes,
        max_length: int,
        group_ids: Sequence[int],
        drop_eagle_block: bool = False,
    ) -> tuple[list[list[KVCacheBlock]], int]:
        # drop_eagle_block is ignored, as in vLLM 0.33 (draft models have no Mamba layers);
        # our coordinator refuses EAGLE beside a Mamba group anyway.
        keys = [hashes.keys(g) for g in group_ids]
        max_num_blocks = min(max_length // self.block_size, hashes.num_blocks)
        get_cached_block = self.block_pool.get_cached_block
        for i in range(max_num_blocks - 1, -1, -1):  # the latest state first
            cached = get_cached_block([group_keys[i] for group_keys in keys])
            if cached is not None:
                return [[self.null_block] * i + [block] for block in cached], (i + 1) * self.block_size
        return [[] for _ in group_ids], 0

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        # Only the state after the last computed token is read.
        return num_computed_tokens - 1

    # ---------------------------------------------------------------- allocation
    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock],
        num_computed_tokens: int,
    ) -> int:
        """At most one new block per step (the new state), plus hit blocks to touch."""
        num_required = -(-num_tokens // self.block_size)
        held = self.req_to_blocks.get(request_id, [])
        num_new = num_required - len(new_computed_blocks) - len(held)
        if num_new > 0:  # vLLM's physical_block_cap: one state block per step
            num_new = 1
        evictable = sum(1 for b in new_computed_blocks if b.ref_cnt == 0 and not b.is_null)
        return num_new + evictable

    def allocate_new_blocks(self, request_id: str, num_tokens: int) -> list[KVCacheBlock]:
        blocks = self.req_to_blocks[request_id]
        num_required = -(-num_tokens // self.block_size)
        if num_required <= len(blocks):
            return []
        # [len, num_required - 1) nulls: states inside this step are never written
        blocks.extend([self.null_block] * (num_required - 1 - len(blocks)))
        new_blocks = self.block_pool.get_new_blocks(num_required - len(blocks))
        blocks.extend(new_blocks)
        return new_blocks

    def _retired(self, request_id: str, num_computed_tokens: int) -> tuple[list[int], int]:
        """(indices of the states before the last computed token not yet freed, highest
        first; the new count of retired leading blocks).

        vLLM 0.33 also frees "the state allocated two steps back" (``last_state_block_idx``);
        without speculative blocks that state always lies in this range, so that second free
        never finds a block (ours: not kept)."""
        blocks = self.req_to_blocks.get(request_id, [])
        first = self.num_retired_blocks.get(request_id, 0)
        num_skipped = self.get_num_skipped_tokens(num_computed_tokens)
        last = min(max(num_skipped, 0) // self.block_size, len(blocks))
        if last <= first:
            return [], first
        # Unlike a window, nulls sit between states: skip them, do not stop.
        return [i for i in range(last - 1, first - 1, -1) if not blocks[i].is_null], last

    def num_blocks_freed_by_skip(self, request_id: str, num_computed_tokens: int) -> int:
        blocks = self.req_to_blocks.get(request_id, [])
        retire, _ = self._retired(request_id, num_computed_tokens)
        return sum(1 for i in retire if blocks[i].ref_cnt == 1)

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        """vLLM 0.33: free the states before the last computed token, highest first (they keep
        their hash until reused), and null their slots."""
        retire, last = self._retired(request_id, num_computed_tokens)
        if request_id in self.req_to_blocks:
            self.num_retired_blocks[request_id] = last
        if not retire:
            return
        blocks = self.req_to_blocks[request_id]
        freed = [blocks[i] for i in retire]
        for i in retire:
            blocks[i] = self.null_block
        self.block_pool.free_blocks(freed)

    def reachable_block_mask(
        self, start_block: int, end_block: int, retention_interval: int | None, boundaries: Sequence[int]
    ) -> list[bool] | None:
        """vLLM 0.33 ``MambaManager.reachable_block_mask``: a hit at b needs only the state
        block ending on b. None dense; 0 the boundary states; k > 0 also one per k tokens."""
        if retention_interval is None:
            return None
        mask = [False] * (end_block - start_block)
        if retention_interval > 0:
            per_segment = retention_interval // self.block_size
            if per_segment <= 1:
                return None
            first = (start_block + per_segment) // per_segment * per_segment - 1
            for i in range(first - start_block, len(mask), per_segment):
                mask[i] = True
        for boundary in boundaries:
            block = boundary // self.block_size - 1
            if start_block <= block < end_block:
                mask[block - start_block] = True
        return mask

    def pop_blocks_for_free(self, request_id: str) -> list[KVCacheBlock]:
        self.num_retired_blocks.pop(request_id, None)
        return super().pop_blocks_for_free(request_id)
