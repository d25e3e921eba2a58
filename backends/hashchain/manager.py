"""``KVCacheManager``: the scheduler-facing facade (vLLM ``kv_cache_manager.py``).

One full-attention group, so vLLM's coordinator and single-type manager are folded in here:
``req_to_blocks`` and ``num_cached_block`` are the single-type manager's per-request state.
"""

from __future__ import annotations

from operator import attrgetter

from prefixcache.backends.hashchain.block import KVCacheBlock
from prefixcache.backends.hashchain.block_pool import BlockPool
from prefixcache.backends.hashchain.hashing import BlockHasher, HashFn

from prefixcache.request import Request

KV_CACHE_GROUP_ID = 0
_ref_cnt = attrgetter("ref_cnt")
FREE_ORDERS = ("reverse", "forward")


class KVCacheManager:
    """``free_order`` is our ablation switch; vLLM always frees a request's blocks reversed."""

    def __init__(
        self,
        num_gpu_blocks: int,
        block_size: int,
        hash_fn: HashFn,
        *,
        enable_caching: bool = True,
        free_order: str = "reverse",
        unhashed_first: bool = True,
    ) -> None:
        if free_order not in FREE_ORDERS:
            raise ValueError(f"free_order must be one of {FREE_ORDERS}, got {free_order!r}")
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.free_order = free_order
        self.block_pool = BlockPool(num_gpu_blocks, enable_caching, unhashed_first)
        self.hasher = BlockHasher(block_size, hash_fn)
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        # Leading blocks of each request already registered in the hash map (hits included).
        self.num_cached_block: dict[str, int] = {}

    # ---------------------------------------------------------------- read path
    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """The longest cached prefix of ``request`` in whole blocks, and its length in tokens.

        Pure: touches nothing, counts nothing. Capped at num_tokens - 1 so the last token is
        always recomputed (its logits are needed); a prompt of exactly k blocks hits k - 1.
        """
        if not self.enable_caching:
            return [], 0
        max_num_blocks = (request.num_tokens - 1) // self.block_size
        keys = self.hasher.block_keys(request, KV_CACHE_GROUP_ID)
        hash_map = self.block_pool.cached_block_hash_to_block
        # Left to right, stop at the first miss (chained hashes: every later block misses
        # too); get_cached_block per block, with the group-0 keys built once per request.
        # A waiting request is looked up every step it waits (and again when admitted): if
        # no block has left the map since its last lookup, that result still holds and the
        # walk resumes where it stopped. Exact, and the same blocks vLLM's walk returns.
        memo: tuple[int, list[KVCacheBlock]] | None = request.memo.get(self)  # type: ignore[assignment]
        if memo is not None and memo[0] == hash_map.num_removals:
            known = memo[1]
            if len(known) >= max_num_blocks:
                return known[:max_num_blocks], max_num_blocks * self.block_size
            computed = known + hash_map.longest_prefix(keys, max_num_blocks, len(known))
        else:
            computed = hash_map.longest_prefix(keys, max_num_blocks)
        request.memo[self] = (hash_map.num_removals, computed)
        return computed[:], len(computed) * self.block_size

    # ---------------------------------------------------------------- write path
    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: list[KVCacheBlock] | None = None,
    ) -> list[KVCacheBlock] | None:
        """Room for ``num_new_tokens`` after the request's computed tokens plus the new hit.

        Returns the newly allocated blocks, or None when the pool is short; then NOTHING has
        changed, not even the ref counts of the hit blocks. Full blocks are cached right away,
        before their KV is computed, so an identical prompt admitted in the same step hits.
        """
        if num_new_tokens <= 0:
            raise ValueError(f"num_new_tokens must be positive, got {num_new_tokens}")
        hit_blocks = new_computed_blocks or []
        request_id = request.request_id
        if hit_blocks and request_id in self.req_to_blocks:
            raise ValueError(f"new computed blocks for {request_id!r}, which already holds blocks")
        # [0, num_computed_tokens)                 KV exists (earlier steps or the new hit)
        # [num_computed_tokens, num_tokens_need)   to be computed now: needs slots
        num_computed_tokens = request.num_computed_tokens + num_new_computed_tokens
        num_tokens_need_slot = num_computed_tokens + num_new_tokens
        if request_id in self.req_to_blocks:
            # Running: no hit, so only new blocks (none at most decode steps) need room.
            return self.extend_running(request, num_tokens_need_slot)
        pool = self.block_pool
        num_new_blocks = max(-(-num_tokens_need_slot // self.block_size) - len(hit_blocks), 0)
        # A hit block nobody references sits in the free queue: touching it takes a free
        # slot. (Full-attention hits hold no null block.)
        num_evictable_hits = list(map(_ref_cnt, hit_blocks)).count(0)
        if num_new_blocks + num_evictable_hits > pool.free_block_queue.num_free_blocks:
            return None
        pool.touch(hit_blocks)
        self.num_cached_block[request_id] = len(hit_blocks)
        new_blocks = pool.get_new_blocks(num_new_blocks)
        self.req_to_blocks[request_id] = [*hit_blocks, *new_blocks]
        if self.enable_caching:
            self._cache_new_full_blocks(request, num_tokens_need_slot)
        return new_blocks

    def extend_running(self, request: Request, num_tokens_need_slot: int) -> list[KVCacheBlock] | None:
        """The running-request half of ``allocate_slots`` (no hit; every decode step): room for
        the first ``num_tokens_need_slot`` tokens; the new blocks, or None (nothing changed)
        when the pool is short."""
        held = self.req_to_blocks[request.request_id]
        num_new_blocks = -(-num_tokens_need_slot // self.block_size) - len(held)
        new_blocks: list[KVCacheBlock] = []
        if num_new_blocks > 0:
            if num_new_blocks > self.block_pool.free_block_queue.num_free_blocks:
                return None
            new_blocks = self.block_pool.get_new_blocks(num_new_blocks)
            held.extend(new_blocks)
        if self.enable_caching:
            self._cache_new_full_blocks(request, num_tokens_need_slot)
        return new_blocks

    def _cache_new_full_blocks(self, request: Request, num_tokens_need_slot: int) -> None:
        # Only blocks whose tokens all exist can be hashed (a lookahead slot has no token).
        self.cache_blocks(request, min(num_tokens_need_slot, request.num_tokens))

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Register the request's blocks that are full within its first ``num_tokens`` tokens."""
        request_id = request.request_id
        num_cached = self.num_cached_block[request_id]
        num_full = num_tokens // self.block_size
        if num_full <= num_cached:
            return
        self.block_pool.cache_full_blocks(
            self.hasher.block_hashes(request),
            self.req_to_blocks[request_id],
            num_cached,
            num_full,
            self.block_size,
            KV_CACHE_GROUP_ID,
        )
        self.num_cached_block[request_id] = num_full

    def free(self, request: Request) -> None:
        """Release the request's blocks, last block first (vLLM's order).

        Reversed, the partial tail is reused first and the chain's deepest block is evicted
        first, so the shared start of a prefix survives longest.
        """
        blocks = self.req_to_blocks.pop(request.request_id, [])
        self.num_cached_block.pop(request.request_id, None)
        self.block_pool.free_blocks(reversed(blocks) if self.free_order == "reverse" else blocks)

    # ---------------------------------------------------------------- queries
    def get_block_ids(self, request_id: str) -> list[int]:
        return [b.block_id for b in self.req_to_blocks[request_id]]

    def get_num_common_prefix_blocks(self, running_request_id: str) -> int:
        """Leading blocks of a running request that every running request references.

        The original (pre-0.33) meaning, which fed cascade attention; vLLM 0.33 removed cascade
        attention and returns 0 here. We keep the old count for our cascade experiments.
        """
        num_running = len(self.req_to_blocks)
        count = 0
        for block in self.req_to_blocks[running_request_id]:
            if block.ref_cnt != num_running:
                break
            count += 1
        return count

    def evict_blocks(self, block_ids: set[int]) -> int:
        return self.block_pool.evict_blocks(block_ids)

    def reset_prefix_cache(self) -> bool:
        return self.block_pool.reset_prefix_cache()
