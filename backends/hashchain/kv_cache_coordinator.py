"""The coordinator: one single-type manager per KV-cache group over one BlockPool (vLLM
``kv_cache_coordinator.py``).

``UnitaryKVCacheCoordinator`` serves one group (every plain model), ``HybridKVCacheCoordinator``
several (full attention beside sliding-window and Mamba groups). Both share every write-path
step below; they differ only in how the hit that all groups accept is found.

Capacity: one BlockPool shared by every group; a request holds one block list per group, each
block from the shared pool, and a block id belongs to one group at a time (vLLM: the groups'
j-th layers share one tensor of ``num_blocks`` pages, so an id is one page in each of a group's
layers). A layout sizes the pool as vLLM does, budget // (block_size x layers per group)
(kv_cache_planning.py); the explicit ``attention_groups=`` form takes ``config.num_pages``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import NamedTuple

from prefixcache.backends.hashchain.block import KVCacheBlock
from prefixcache.backends.hashchain.block_pool import BlockPool
from prefixcache.backends.hashchain.hashing import RequestHashes
from prefixcache.backends.hashchain.mamba_manager import MambaManager
from prefixcache.backends.hashchain.single_type_kv_cache_manager import (
    AttentionGroupSpec,
    FullAttentionManager,
    SingleTypeKVCacheManager,
    SlidingWindowManager,
)

from prefixcache.request import Request

KVCacheBlocks = tuple[list[KVCacheBlock], ...]  # one block list per group, index = group id


def make_single_type_manager(
    spec: AttentionGroupSpec, block_pool: BlockPool, block_size: int, group_id: int
) -> SingleTypeKVCacheManager:
    if spec.kind == "full":
        return FullAttentionManager(spec, block_pool, block_size, group_id)
    if spec.kind == "mamba":
        return MambaManager(spec, block_pool, block_size, group_id)
    return SlidingWindowManager(spec, block_pool, block_size, group_id)


class CacheHit(NamedTuple):
    """``find_longest_cache_hit``'s answer in vLLM 0.33: the hit blocks of every group, the
    hit length, and ``num_uncached_common_prefix_tokens`` (how much longer some group's own
    hit was: a shared prefix a sparse-retention group has not hashed yet; 0 unless hybrid)."""

    blocks: KVCacheBlocks
    length: int
    num_uncached_common_prefix_tokens: int


def check_retention_interval(
    retention_interval: int | None, attention_groups: Sequence[AttentionGroupSpec], block_size: int
) -> None:
    """vLLM 0.33 ``_validate_prefix_cache_retention_interval``."""
    if retention_interval is None:
        return
    if isinstance(retention_interval, bool) or not isinstance(retention_interval, int):
        raise ValueError(
            f"prefix_cache_retention_interval must be None or an int, got {retention_interval!r}"
        )
    if not any(spec.kind in ("sliding_window", "mamba") for spec in attention_groups):
        if retention_interval == 0:
            return
        raise ValueError(
            "prefix_cache_retention_interval is set but there is no sliding-window or Mamba group, "
            "so it has no effect; set it to 0 or None"
        )
    if retention_interval < 0 or retention_interval % block_size != 0:
        raise ValueError(
            f"prefix_cache_retention_interval ({retention_interval}) must be non-negative and a "
            f"multiple of the block size ({block_size})"
        )


def replay_boundaries(num_prompt_tokens: int, block_size: int, use_eagle: bool) -> list[int]:
    """vLLM 0.33 ``replay_boundaries``: where a later request replaying this prompt resumes.
    Without EAGLE a resend of the prompt resumes at prompt - 1 (the last token is recomputed).
    With EAGLE the hit drops a block, so a resend ((prompt - 1) floored) and a longer sibling
    (prompt floored) both resume one block lower."""
    if not use_eagle:
        return [num_prompt_tokens - 1]
    resend = (num_prompt_tokens - 1) // block_size * block_size
    extension = num_prompt_tokens // block_size * block_size
    return sorted({max(resend - block_size, 0), max(extension - block_size, 0)})


def check_use_eagle(use_eagle: bool, attention_groups: Sequence[AttentionGroupSpec]) -> None:
    if not isinstance(use_eagle, bool):
        raise ValueError(f"use_eagle must be a bool, got {use_eagle!r}")
    if use_eagle and any(spec.kind == "mamba" for spec in attention_groups):
        # vLLM 0.33 moves Mamba checkpoints with EAGLE (drop_eagle_checkpoint_block, prefill
        # checkpoint blocks); ours has neither.
        raise ValueError("use_eagle beside a Mamba group is not supported (vLLM's EAGLE Mamba checkpoints)")


class KVCacheCoordinator(ABC):
    def __init__(
        self,
        attention_groups: Sequence[AttentionGroupSpec],
        block_pool: BlockPool,
        block_size: int,
        retention_interval: int | None = None,
        use_eagle: bool = False,
    ) -> None:
        check_retention_interval(retention_interval, attention_groups, block_size)
        check_use_eagle(use_eagle, attention_groups)
        self.block_pool = block_pool
        self.block_size = block_size
        # None: every full block hashed (dense); 0: vLLM's engine default (sparse windows).
        self.retention_interval = retention_interval
        self.single_type_managers: tuple[SingleTypeKVCacheManager, ...] = tuple(
            make_single_type_manager(spec, block_pool, block_size, i)
            for i, spec in enumerate(attention_groups)
        )
        # vLLM 0.33 ``use_eagle`` (KVCacheManager(use_eagle=True)): with no draft layers of its
        # own in the KV-cache config, every group is an EAGLE group (``eagle_group_ids``).
        self.use_eagle = use_eagle
        for manager in self.single_type_managers:
            manager.use_eagle = use_eagle
        self._empty: KVCacheBlocks = tuple([] for _ in self.single_type_managers)

    @abstractmethod
    def find_cache_hit(self, hashes: RequestHashes, max_length: int) -> CacheHit:
        """The hit every group accepts (<= max_length tokens), as vLLM 0.33 returns it."""

    def find_longest_cache_hit(self, hashes: RequestHashes, max_length: int) -> tuple[KVCacheBlocks, int]:
        """The hit blocks of every group and the hit length in tokens (<= max_length)."""
        blocks, length, _ = self.find_cache_hit(hashes, max_length)
        return blocks, length

    def revalidate_cache_hit(
        self, hashes: RequestHashes, hit_blocks: KVCacheBlocks, max_length: int
    ) -> CacheHit:
        """``find_cache_hit`` again after the index changed, given an earlier hit.
        Hybrid: looked up afresh (the fixed point may land anywhere)."""
        return self.find_cache_hit(hashes, max_length)

    def empty_blocks(self) -> KVCacheBlocks:
        """No hit (vLLM's ``empty_kv_cache_blocks``; read, never written)."""
        return self._empty

    # ---------------------------------------------------------------- write path
    def get_num_blocks_to_allocate(
        self, request_id: str, num_tokens: int, new_computed_blocks: KVCacheBlocks, num_computed_tokens: int
    ) -> int:
        """Free blocks all groups take for ``num_tokens`` slots, less those that leaving the
        window frees first (vLLM frees them before its check; we count them, so that a failed
        allocate changes nothing)."""
        needed = 0
        for manager, hit in zip(self.single_type_managers, new_computed_blocks, strict=True):
            needed += manager.get_num_blocks_to_allocate(request_id, num_tokens, hit, num_computed_tokens)
            needed -= manager.num_blocks_freed_by_skip(request_id, num_computed_tokens)
        return needed

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        for manager in self.single_type_managers:
            manager.remove_skipped_blocks(request_id, num_computed_tokens)

    def save_new_computed_blocks(
        self, request_id: str, new_computed_blocks: KVCacheBlocks, num_computed_tokens: int
    ) -> None:
        """Touch every group's hit before any group allocates: an earlier group's new blocks
        must not evict a later group's hit (vLLM issue #33775)."""
        for manager, hit in zip(self.single_type_managers, new_computed_blocks, strict=True):
            manager.add_computed_blocks(request_id, hit, num_computed_tokens)

    def allocate_new_blocks(self, request_id: str, num_tokens: int) -> KVCacheBlocks:
        return tuple(m.allocate_new_blocks(request_id, num_tokens) for m in self.single_type_managers)

    def num_blocks_to_cache(self, request_id: str, num_tokens: int) -> int:
        """Blocks full within ``num_tokens`` that some group has not cached yet (0: nothing to
        hash; most decode steps)."""
        num_full = num_tokens // self.block_size
        return max(num_full - m.num_cached_block[request_id] for m in self.single_type_managers)

    def cache_blocks(
        self, request: Request, hashes: RequestHashes, num_tokens: int, shared_prefix_boundary: int = 0
    ) -> None:
        # vLLM 0.33: a resend of the prompt resumes at its replay boundaries; a sibling sharing
        # a prefix at the junction found at its admission (EAGLE: also one block below it, the
        # hit of a sibling diverging right after the junction, which has no block to peek at).
        boundaries = replay_boundaries(request.num_prompt_tokens, self.block_size, self.use_eagle)
        if shared_prefix_boundary:
            boundaries.append(shared_prefix_boundary)
            if self.use_eagle:
                boundaries.append(shared_prefix_boundary - self.block_size)
        for manager in self.single_type_managers:
            manager.cache_blocks(request, hashes, num_tokens, self.retention_interval, boundaries)

    def free(self, request_id: str, reverse: bool) -> None:
        """Each group frees its blocks, group 0 first, each last block first when ``reverse``."""
        for manager in self.single_type_managers:
            manager.free(request_id, reverse)

    # ---------------------------------------------------------------- queries
    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        return tuple(m.req_to_blocks[request_id] for m in self.single_type_managers)

    def is_running(self, request_id: str) -> bool:
        return request_id in self.single_type_managers[0].req_to_blocks

    def extends_in_place(self, request_id: str, num_tokens_need_slot: int, num_tokens: int) -> bool:
        """Whether a running request's allocation for ``num_tokens_need_slot`` slots (of which
        ``num_tokens`` have tokens) changes nothing: every group already holds the blocks, no
        block became full and none left a window. Most decode steps; measured against the
        general path in tests/bench."""
        return False

    def decode_steps_in_place(self, request_id: str, num_computed_tokens: int) -> int:
        """How many one-token steps from ``num_computed_tokens`` on ``extends_in_place`` allows
        in a row (Hybrid: none, windows move)."""
        return 0

    def min_blocks_to_fit(self, num_tokens: int) -> int:
        """A lower bound on the pool blocks a request of ``num_tokens`` tokens ever holds at
        once: every block per full-attention group, one window per sliding-window group."""
        num_blocks = -(-num_tokens // self.block_size)
        total = 0
        for manager in self.single_type_managers:
            window = manager.spec.sliding_window
            if manager.spec.kind == "mamba":
                total += min(num_blocks, 1)  # one live state
            else:
                total += (
                    num_blocks if window is None else min(num_blocks, -(-(window - 1) // self.block_size))
                )
        return total


class UnitaryKVCacheCoordinator(KVCacheCoordinator):
    """One KV-cache group: its manager's hit is the hit."""

    def find_cache_hit(self, hashes: RequestHashes, max_length: int) -> CacheHit:
        # vLLM 0.33: EAGLE drops the last block of a hit within max_length (no margin here,
        # unlike the hybrid coordinator): a prompt of n tokens hits floor((n - 1) / B) - 1 blocks.
        blocks, length = self.single_type_managers[0].find_longest_cache_hit(
            hashes, max_length, [0], self.use_eagle
        )
        return CacheHit(tuple(blocks), length, 0)

    def min_blocks_to_fit(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)  # one full-attention group holds every block

    def extends_in_place(self, request_id: str, num_tokens_need_slot: int, num_tokens: int) -> bool:
        # One full-attention group: nothing leaves a window, so holding the blocks and having
        # cached every full one is all it takes. (Hybrid: always the general path.)
        manager = self.single_type_managers[0]
        size = self.block_size
        return (
            -(-num_tokens_need_slot // size) <= len(manager.req_to_blocks[request_id])
            and num_tokens // size <= manager.num_cached_block[request_id]
        )

    def decode_steps_in_place(self, request_id: str, num_computed_tokens: int) -> int:
        # extends_in_place(c + k, c + k) for every k up to the answer: the held blocks have
        # the slots and no block fills (a full block is cached at once, which a lookup sees).
        manager = self.single_type_managers[0]
        size = self.block_size
        held_slots = len(manager.req_to_blocks[request_id]) * size
        before_next_full = (manager.num_cached_block[request_id] + 1) * size - 1
        return max(0, min(held_slots, before_next_full) - num_computed_tokens)

    def revalidate_cache_hit(
        self, hashes: RequestHashes, hit_blocks: KVCacheBlocks, max_length: int
    ) -> CacheHit:
        """The earlier hit's leading blocks that a lookup would still return (each still the
        first block under its key), then the walk resumed from there: exactly a fresh lookup,
        probing the map once per block and hashing nothing."""
        keys = hashes.keys(0)
        get_one_block = self.block_pool.cached_block_hash_to_block.get_one_block
        valid = 0
        for block, key in zip(hit_blocks[0], keys, strict=False):
            if get_one_block(key) is not block:
                break
            valid += 1
        limit = max_length // self.block_size
        blocks = hit_blocks[0][:valid] + self.block_pool.cached_block_hash_to_block.longest_prefix(
            keys, limit, valid
        )
        if self.use_eagle and blocks:
            # The earlier hit lacks its dropped block, which the walk above found again.
            blocks.pop()
        return CacheHit((blocks,), len(blocks) * self.block_size, 0)


class HybridKVCacheCoordinator(KVCacheCoordinator):
    """Several groups: the longest hit every group accepts, found by a fixed point."""

    def __init__(
        self,
        attention_groups: Sequence[AttentionGroupSpec],
        block_pool: BlockPool,
        block_size: int,
        retention_interval: int | None = None,
        use_eagle: bool = False,
    ) -> None:
        super().__init__(attention_groups, block_pool, block_size, retention_interval, use_eagle)
        # Groups of equal spec are looked up jointly (vLLM's SpecGroup); full attention first:
        # its left-to-right scan gives the tightest first bound.
        by_spec: dict[AttentionGroupSpec, list[int]] = {}
        for i, spec in enumerate(attention_groups):
            by_spec.setdefault(spec, []).append(i)
        self.attention_groups = sorted(by_spec.items(), key=lambda item: item[0].kind != "full")
        # vLLM 0.33: one full spec + one other needs one pass (the other cannot shrink below
        # what full attention accepts, full attention accepts any shorter length).
        self.is_simple_hybrid = len(self.attention_groups) == 2 and self.attention_groups[0][0].kind == "full"

    def find_cache_hit(self, hashes: RequestHashes, max_length: int) -> CacheHit:
        """Start at ``max_length``, let each group shrink it, repeat until a whole pass shrinks
        nothing (monotone: it ends).

        EAGLE (vLLM 0.33, issue #32802): a group looks up one block past the candidate length
        (capped at the request's full blocks) and drops its last block, landing back on the
        candidate; it does so once per candidate length, and any group shrinking the length
        without a drop makes every group drop again at the new one."""
        hit_blocks: list[list[KVCacheBlock] | None] = [None] * len(self.single_type_managers)
        hit_length = max_length
        longest = 0  # the longest hit one group reported (vLLM's longest_hit_length)
        eagle_verified: set[int] = set()  # spec groups whose drop holds at the current length
        max_eagle_length = hashes.num_blocks * self.block_size
        while True:
            curr = hit_length
            for idx, (spec, group_ids) in enumerate(self.attention_groups):
                first = hit_blocks[group_ids[0]]
                if spec.kind == "full" and first is not None:
                    # Downward closed: any prefix of a full-attention hit is a hit; trim later.
                    curr = min(curr, len(first) * self.block_size)
                    continue
                drop = self.use_eagle and idx not in eagle_verified
                limit = min(curr + self.block_size, max_eagle_length) if drop else curr
                blocks, found = self.single_type_managers[group_ids[0]].find_longest_cache_hit(
                    hashes, limit, group_ids, drop
                )
                if drop:
                    eagle_verified.add(idx)
                elif found < curr:
                    eagle_verified.clear()
                curr = found
                for group_id, group_blocks in zip(group_ids, blocks, strict=True):
                    hit_blocks[group_id] = group_blocks
                longest = max(longest, curr)
            if curr >= hit_length:
                break
            hit_length = curr
            if self.is_simple_hybrid:
                break
        num_blocks = hit_length // self.block_size
        blocks = tuple(b[:num_blocks] if b is not None else [] for b in hit_blocks)
        return CacheHit(blocks, hit_length, longest - hit_length)


def make_kv_cache_coordinator(
    attention_groups: Sequence[AttentionGroupSpec],
    block_pool: BlockPool,
    block_size: int,
    retention_interval: int | None = None,
    use_eagle: bool = False,
) -> KVCacheCoordinator:
    if not attention_groups:
        raise ValueError("attention_groups needs at least one group, e.g. [('full',)]")
    if all(spec.kind == "mamba" for spec in attention_groups):
        raise ValueError("attention_groups needs an attention group (full or sliding_window) beside Mamba")
    if len(attention_groups) == 1:
        return UnitaryKVCacheCoordinator(
            attention_groups, block_pool, block_size, retention_interval, use_eagle
        )
    return HybridKVCacheCoordinator(attention_groups, block_pool, block_size, retention_interval, use_eagle)
