"""``KVCacheManager``: the scheduler-facing facade (vLLM ``kv_cache_manager.py``).

KVCacheManager -> KVCacheCoordinator (Unitary for one group, Hybrid for several) ->
SingleTypeKVCacheManager (FullAttention / SlidingWindow) per group -> one BlockPool.
"""

from __future__ import annotations

from collections.abc import Sequence

from prefixcache.backends.hashchain.block_pool import BlockPool
from prefixcache.backends.hashchain.hashing import BlockHasher, HashFn
from prefixcache.backends.hashchain.kv_cache_coordinator import KVCacheBlocks, make_kv_cache_coordinator
from prefixcache.backends.hashchain.single_type_kv_cache_manager import AttentionGroupSpec

from prefixcache.request import Request

FREE_ORDERS = ("reverse", "forward")


def max_cache_hit_length(request: Request) -> int:
    """The last token is always recomputed (its logits are needed): a prompt of exactly k
    blocks hits k - 1."""
    return request.num_tokens - 1


class KVCacheManager:
    """``free_order`` is our ablation switch; vLLM always frees a request's blocks reversed."""

    def __init__(
        self,
        num_gpu_blocks: int,
        block_size: int,
        hash_fn: HashFn,
        attention_groups: Sequence[AttentionGroupSpec] = (AttentionGroupSpec("full"),),
        *,
        free_order: str = "reverse",
        unhashed_first: bool = True,
        eviction_policy: str = "lru",
    ) -> None:
        if free_order not in FREE_ORDERS:
            raise ValueError(f"free_order must be one of {FREE_ORDERS}, got {free_order!r}")
        self.block_size = block_size
        self.free_order = free_order
        self.block_pool = BlockPool(num_gpu_blocks, unhashed_first, eviction_policy, block_size)
        self.hasher = BlockHasher(block_size, hash_fn)
        self.coordinator = make_kv_cache_coordinator(attention_groups, self.block_pool, block_size)
        ranked = self.block_pool.ranked
        self.learner = ranked.learner if ranked is not None else None
        # lrp: each admitted request's hit fraction as the ghost saw it, until it is freed
        self.seen_fraction: dict[str, float] = {}

    # ---------------------------------------------------------------- read path
    def get_computed_blocks(self, request: Request) -> tuple[KVCacheBlocks, int]:
        """The longest cached prefix of ``request`` in whole blocks (per group), and its
        length in tokens.

        Pure: touches nothing, counts nothing. Capped (``max_cache_hit_length``).
        """
        return self.coordinator.find_longest_cache_hit(
            self.hasher.request_hashes(request), max_cache_hit_length(request)
        )

    def revalidate_computed_blocks(
        self, request: Request, hit_blocks: KVCacheBlocks
    ) -> tuple[KVCacheBlocks, int]:
        """``get_computed_blocks`` after the index changed, given the blocks it returned then."""
        hashes = self.hasher.request_hashes(request)
        return self.coordinator.revalidate_cache_hit(hashes, hit_blocks, max_cache_hit_length(request))

    # ---------------------------------------------------------------- write path
    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: KVCacheBlocks | None = None,
    ) -> KVCacheBlocks | None:
        """Room for ``num_new_tokens`` after the request's computed tokens plus the new hit.

        Returns the newly allocated blocks per group, or None when the pool is short; then
        NOTHING has changed, not even the ref counts of the hit blocks. Full blocks are cached
        right away, before their KV is computed, so an identical prompt admitted in the same
        step hits.
        """
        if num_new_tokens <= 0:
            raise ValueError(f"num_new_tokens must be positive, got {num_new_tokens}")
        coordinator = self.coordinator
        request_id = request.request_id
        running = coordinator.is_running(request_id)
        hits = new_computed_blocks if new_computed_blocks is not None else coordinator.empty_blocks()
        if running and any(hits):
            raise ValueError(f"new computed blocks for {request_id!r}, which already holds blocks")
        # [0, num_computed_tokens)                 KV exists (earlier steps or the new hit)
        # [num_computed_tokens, num_tokens_need)   to be computed now: needs slots
        num_computed_tokens = request.num_computed_tokens + num_new_computed_tokens
        num_tokens_need_slot = num_computed_tokens + num_new_tokens
        num_tokens = min(num_tokens_need_slot, request.num_tokens)  # slots whose token exists
        if running and coordinator.extends_in_place(request_id, num_tokens_need_slot, num_tokens):
            return hits  # no new block in any group
        needed = coordinator.get_num_blocks_to_allocate(
            request_id, num_tokens_need_slot, hits, num_computed_tokens
        )
        if needed > self.block_pool.get_num_free_blocks():
            return None
        coordinator.remove_skipped_blocks(request_id, num_computed_tokens)
        if not running and self.learner is not None:
            self._begin_learning(request, sum(1 for b in hits[0] if not b.is_null))
        if not running:
            coordinator.save_new_computed_blocks(request_id, hits, num_computed_tokens)
        new_blocks = coordinator.allocate_new_blocks(request_id, num_tokens_need_slot)
        # Only blocks whose tokens all exist can be hashed (a lookahead slot has no token).
        self.cache_blocks(request, num_tokens)
        return new_blocks

    def _begin_learning(self, request: Request, num_hit_blocks: int) -> None:
        """lrp: the request's lookup (group 0's keys within the hit cap) against the ghost."""
        assert self.learner is not None and self.block_pool.ranked is not None
        keys = self.hasher.request_hashes(request).keys(0)
        lookup = keys[: max_cache_hit_length(request) // self.block_size]
        now = self.block_pool.ranked.tick()
        self.seen_fraction[request.request_id] = self.learner.begin(lookup, num_hit_blocks, now)

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Register the request's blocks that are full within its first ``num_tokens`` tokens."""
        if self.coordinator.num_blocks_to_cache(request.request_id, num_tokens) > 0:
            self.coordinator.cache_blocks(
                self.hasher.request_hashes(request), request.request_id, num_tokens, request.num_prompt_tokens
            )

    def free(self, request: Request) -> None:
        """Release the request's blocks, last block first (vLLM's order).

        Reversed, the partial tail is reused first and the chain's deepest block is evicted
        first, so the shared start of a prefix survives longest.
        """
        if self.learner is not None:
            seen = self.seen_fraction.pop(request.request_id, 0.0)
            self.learner.classify(seen, request.num_prompt_tokens, request.num_output_tokens)
        self.coordinator.free(request.request_id, reverse=self.free_order == "reverse")

    # ---------------------------------------------------------------- queries
    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        return self.coordinator.get_blocks(request_id)

    def evict_blocks(self, block_ids: set[int]) -> int:
        return self.block_pool.evict_blocks(block_ids)

    def reset_prefix_cache(self) -> bool:
        return self.block_pool.reset_prefix_cache()
