"""Several attention groups (hybrid models): vLLM ``kv_cache_coordinator.py``
(HybridKVCacheCoordinator) with the KVCacheManager facade folded in.

Capacity: one BlockPool shared by every group; a request holds one block list per group, each
block from the shared pool. (vLLM sizes one pool of ``num_blocks`` ids and gives each group its
own tensors of that many blocks, so a block id means the same slot in each group's tensor; here
a block id belongs to one group at a time, so a request of n blocks in two full-attention groups
takes 2n pages. We chose this because our pool is counted in pages: equal configs give every
backend the same memory.) The single-group default does not come here: ``KVCacheManager`` is
vLLM's UnitaryKVCacheCoordinator and stays byte-for-byte as before.
"""

from __future__ import annotations

from collections.abc import Sequence

from prefixcache.backends.hashchain.block import KVCacheBlock
from prefixcache.backends.hashchain.block_pool import BlockPool
from prefixcache.backends.hashchain.hashing import BlockHash, BlockHasher, HashFn
from prefixcache.backends.hashchain.manager import FREE_ORDERS
from prefixcache.backends.hashchain.single_type import (
    AttentionGroupSpec,
    SingleTypeKVCacheManager,
    make_single_type_manager,
)

from prefixcache.request import Request

HitBlocks = tuple[list[KVCacheBlock], ...]  # one list per group, index = group id


class HybridKVCacheManager:
    """The KVCacheManager interface over one single-type manager per attention group."""

    def __init__(
        self,
        num_gpu_blocks: int,
        block_size: int,
        hash_fn: HashFn,
        attention_groups: Sequence[AttentionGroupSpec],
        *,
        enable_caching: bool = True,
        free_order: str = "reverse",
        unhashed_first: bool = True,
    ) -> None:
        if not attention_groups:
            raise ValueError("attention_groups needs at least one group")
        if free_order not in FREE_ORDERS:
            raise ValueError(f"free_order must be one of {FREE_ORDERS}, got {free_order!r}")
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.free_order = free_order
        self.block_pool = BlockPool(num_gpu_blocks, enable_caching, unhashed_first)
        self.hasher = BlockHasher(block_size, hash_fn)
        self.managers: tuple[SingleTypeKVCacheManager, ...] = tuple(
            make_single_type_manager(spec, self.block_pool, block_size, i)
            for i, spec in enumerate(attention_groups)
        )
        # Groups of equal spec are looked up jointly (vLLM's SpecGroup); full attention first:
        # its left-to-right scan gives the tightest first bound.
        by_spec: dict[AttentionGroupSpec, list[int]] = {}
        for i, spec in enumerate(attention_groups):
            by_spec.setdefault(spec, []).append(i)
        self.attention_groups = sorted(by_spec.items(), key=lambda item: item[0].kind != "full")

    # ---------------------------------------------------------------- read path
    def find_longest_cache_hit(
        self, block_hashes: Sequence[BlockHash], max_length: int
    ) -> tuple[HitBlocks, int]:
        """The longest hit every group accepts, by a fixed point: start at ``max_length``, let
        each group shrink it, repeat until a whole pass shrinks nothing (monotone: it ends)."""
        hit_blocks: list[list[KVCacheBlock] | None] = [None] * len(self.managers)
        hit_length = max_length
        while True:
            curr = hit_length
            for spec, group_ids in self.attention_groups:
                first = hit_blocks[group_ids[0]]
                if spec.kind == "full" and first is not None:
                    # Downward closed: any prefix of a full-attention hit is a hit; trim later.
                    curr = min(curr, len(first) * self.block_size)
                    continue
                blocks, curr = self.managers[group_ids[0]].find_longest_cache_hit(
                    block_hashes, curr, group_ids
                )
                for group_id, group_blocks in zip(group_ids, blocks, strict=True):
                    hit_blocks[group_id] = group_blocks
            if curr >= hit_length:
                break
            hit_length = curr
        num_blocks = hit_length // self.block_size
        out = tuple(blocks[:num_blocks] if blocks is not None else [] for blocks in hit_blocks)
        return out, hit_length

    def get_computed_blocks(self, request: Request) -> tuple[HitBlocks, int]:
        """Pure, capped at num_tokens - 1 (the last token is always recomputed)."""
        if not self.enable_caching:
            return tuple([] for _ in self.managers), 0
        return self.find_longest_cache_hit(self.hasher.block_hashes(request), request.num_tokens - 1)

    # ---------------------------------------------------------------- write path
    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: HitBlocks | None = None,
    ) -> list[list[KVCacheBlock]] | None:
        """As KVCacheManager.allocate_slots, per group; None (nothing changed) if short."""
        if num_new_tokens <= 0:
            raise ValueError(f"num_new_tokens must be positive, got {num_new_tokens}")
        request_id = request.request_id
        hits = new_computed_blocks or tuple([] for _ in self.managers)
        running = request_id in self.managers[0].req_to_blocks
        if running and any(hits):
            raise ValueError(f"new computed blocks for {request_id!r}, which already holds blocks")
        # [0, num_computed_tokens)                 KV exists (earlier steps or the new hit)
        # [num_computed_tokens, num_tokens_need)   to be computed now: needs slots
        num_computed_tokens = request.num_computed_tokens + num_new_computed_tokens
        num_tokens_need_slot = num_computed_tokens + num_new_tokens
        needed = sum(
            m.get_num_blocks_to_allocate(request_id, num_tokens_need_slot, hit, num_computed_tokens)
            for m, hit in zip(self.managers, hits, strict=True)
        )
        # vLLM frees the blocks out of the window before this check; we count them instead,
        # so that a failed allocate changes nothing.
        freed = sum(m.num_blocks_freed_by_skip(request_id, num_computed_tokens) for m in self.managers)
        if needed > self.block_pool.get_num_free_blocks() + freed:
            return None

        for m in self.managers:
            m.remove_skipped_blocks(request_id, num_computed_tokens)
        if not running:
            # Touch every group's hit before any group allocates: an earlier group's new
            # blocks must not evict a later group's hit (vLLM issue #33775).
            for m, hit in zip(self.managers, hits, strict=True):
                m.add_computed_blocks(request_id, hit, num_computed_tokens)
        new_blocks = [m.allocate_new_blocks(request_id, num_tokens_need_slot) for m in self.managers]
        if self.enable_caching:
            self.cache_blocks(request, min(num_tokens_need_slot, request.num_tokens))
        return new_blocks

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        block_hashes = self.hasher.block_hashes(request)
        for m in self.managers:
            m.cache_blocks(block_hashes, request.request_id, num_tokens)

    def free(self, request: Request) -> None:
        """Each group frees its blocks, group 0 first, each last block first (vLLM's order)."""
        for m in self.managers:
            m.free(request.request_id, reverse=self.free_order == "reverse")

    # ---------------------------------------------------------------- queries
    @property
    def req_to_blocks(self) -> dict[str, list[KVCacheBlock]]:
        """Group 0's block lists (what ``page_table`` shows)."""
        return self.managers[0].req_to_blocks

    def get_block_ids(self, request_id: str, group_id: int = 0) -> list[int]:
        return [b.block_id for b in self.managers[group_id].req_to_blocks[request_id]]

    def get_num_common_prefix_blocks(self, running_request_id: str) -> int:
        """Group 0's count (sliding window: 0, its prefix blocks are nulls)."""
        return self.managers[0].get_num_common_prefix_blocks(running_request_id)

    def min_blocks_to_fit(self, num_tokens: int) -> int:
        """A lower bound on the pool blocks a request of ``num_tokens`` tokens ever holds at
        once: every block per full-attention group, one window per sliding-window group."""
        num_blocks = -(-num_tokens // self.block_size)
        total = 0
        for m in self.managers:
            window = m.spec.sliding_window
            total += num_blocks if window is None else min(num_blocks, -(-(window - 1) // self.block_size))
        return total

    def evict_blocks(self, block_ids: set[int]) -> int:
        return self.block_pool.evict_blocks(block_ids)

    def reset_prefix_cache(self) -> bool:
        return self.block_pool.reset_prefix_cache()
