"""``HashChainCache``: vLLM v1's automatic prefix caching behind the PrefixCache contract.

The adapter only translates: lookup -> get_computed_blocks, allocate -> allocate_slots,
release -> free, reset -> reset_prefix_cache. vLLM caches full blocks when it allocates them,
so ``commit`` publishes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from prefixcache.backends.hashchain.hashing import get_hash_fn, group_id_suffix
from prefixcache.backends.hashchain.kv_cache_coordinator import KVCacheBlocks
from prefixcache.backends.hashchain.kv_cache_manager import KVCacheManager
from prefixcache.backends.hashchain.single_type_kv_cache_manager import AttentionGroupSpec

from prefixcache.config import CacheConfig
from prefixcache.interface import Match, PageUsage, PrefixCache, ensure
from prefixcache.request import Request


@dataclass(frozen=True, slots=True, eq=False)
class BlockMatch(Match):
    """``get_computed_blocks``' result, handed to ``allocate_slots`` as vLLM does."""

    blocks: KVCacheBlocks  # the hit blocks of each group


class HashChainCache(PrefixCache[KVCacheBlocks]):
    """Options (keywords of ``make_cache``; defaults = vLLM):

    hash_fn:        "sha256" | "sha256_cbor" | "xxhash" | "xxhash_cbor" | "builtin" (UNSAFE,
                    for cost comparisons only)
    free_order:     "reverse" (vLLM) | "forward": order in which a request's blocks are freed
    unhashed_first: True (vLLM): freed blocks without a hash go to the head of the free queue
    eviction_policy: "lru" (vLLM: the free queue's order) or any other name of
                    ``prefixcache.eviction_policies("hashchain")``: ranks the free cached leaf
                    blocks (ours, backends/hashchain/eviction.py)
    attention_groups: KV-cache groups of a hybrid model, e.g. [("full",), ("sliding_window", 128)];
                    default one full-attention group. Several groups share one block pool
                    (kv_cache_coordinator.py); ``page_table`` shows group 0, ``page_tables``
                    every group.

    A live request's state is its block list per group: the very lists the single-type
    managers keep in ``req_to_blocks`` (vLLM's owner of them), not copies.
    """

    name = "hashchain"

    def __init__(
        self,
        config: CacheConfig,
        *,
        hash_fn: str = "sha256",
        free_order: str = "reverse",
        unhashed_first: bool = True,
        attention_groups: Sequence[object] | None = None,
        eviction_policy: str = "lru",
    ) -> None:
        super().__init__(config)
        if not isinstance(unhashed_first, bool):
            raise ValueError(f"unhashed_first must be a bool, got {unhashed_first!r}")
        self.hash_fn_name = hash_fn
        groups = [("full",)] if attention_groups is None else list(attention_groups)
        if not groups:
            raise ValueError("attention_groups needs at least one group, e.g. [('full',)]")
        self.attention_groups = [AttentionGroupSpec.parse(g) for g in groups]
        self.manager = KVCacheManager(
            config.num_pages,
            config.page_size,
            get_hash_fn(hash_fn),
            self.attention_groups,
            free_order=free_order,
            unhashed_first=unhashed_first,
            eviction_policy=eviction_policy,
        )
        self.block_pool = self.manager.block_pool
        self._evicted_seen = 0  # block_pool.num_evicted_blocks already in stats.evicted_tokens

    # ---------------------------------------------------------------- hooks
    def _match(self, req: Request) -> BlockMatch:
        blocks, hit = self.manager.get_computed_blocks(req)
        return BlockMatch(self, req, req.num_tokens, hit, self._index_version(), blocks)

    def _index_version(self) -> int:
        return self.block_pool.cached_block_hash_to_block.version

    def _revalidate(self, match: Match) -> BlockMatch:
        """What still holds of the hit, and what was cached since: exactly a fresh lookup."""
        m = cast(BlockMatch, match)
        blocks, hit = self.manager.revalidate_computed_blocks(m.request, m.blocks)
        return BlockMatch(self, m.request, m.num_tokens, hit, self._index_version(), blocks)

    def _admit(self, req: Request, num_new_tokens: int, match: Match) -> KVCacheBlocks | None:
        m = cast(BlockMatch, match)
        # A waiting request has computed nothing (vLLM's invariant); put back whatever the
        # caller left there if we fail, so that a failed allocate changes nothing.
        prior = req.num_computed_tokens
        req.num_computed_tokens = 0
        new_blocks = self.manager.allocate_slots(req, num_new_tokens, m.tokens, m.blocks)
        self._sync_evictions()
        if new_blocks is None:
            req.num_computed_tokens = prior
            return None
        return self.manager.get_blocks(req.request_id)

    def _extend(self, req: Request, state: KVCacheBlocks, total_tokens: int) -> bool:
        num_new_tokens = total_tokens - req.num_computed_tokens
        if num_new_tokens <= 0:
            return True
        ok = self.manager.allocate_slots(req, num_new_tokens) is not None
        self._sync_evictions()
        return ok

    def _decode_steps_in_place(self, req: Request, state: KVCacheBlocks) -> int:
        return self.manager.coordinator.decode_steps_in_place(req.request_id, req.num_computed_tokens)

    def _commit(self, req: Request, state: KVCacheBlocks) -> None:
        # Nothing to publish: full blocks were cached at allocation (vLLM). Only check.
        held = len(state[0])
        if held * self.page_size < req.num_computed_tokens:  # the message only on failure
            ensure(False, f"{req.request_id!r} committed {req.num_computed_tokens} tokens into {held} blocks")

    def _release(self, req: Request, state: KVCacheBlocks) -> None:
        self.manager.free(req)

    def _page_table(self, req: Request, state: KVCacheBlocks) -> list[int]:
        return [b.block_id for b in state[0]]

    def page_tables(self, req: Request) -> list[list[int]]:
        """One page table per attention group (null block 0 where a window skipped a block)."""
        return [[b.block_id for b in blocks] for blocks in self._live_record(req, "page_tables").state]

    def _min_pages_to_fit(self, num_tokens: int) -> int:
        """Every group's blocks come from the one pool (a hybrid request takes more)."""
        return self.manager.coordinator.min_blocks_to_fit(num_tokens)

    def _layout_note(self) -> str:
        return f" over {len(self.attention_groups)} attention groups"

    def _evict(self, num_tokens: int) -> int:
        dropped = self.block_pool.evict_lru_blocks(-(-num_tokens // self.page_size))
        self._sync_evictions()
        return dropped * self.page_size

    def _reset(self) -> None:
        ensure(self.manager.reset_prefix_cache(), "reset_prefix_cache refused with no live request")
        self._evicted_seen = self.block_pool.num_evicted_blocks

    # ---------------------------------------------------------------- vLLM extras
    def evict_blocks(self, block_ids: set[int]) -> int:
        """Drop the cached hashes of these block ids (vLLM's KV-connector hook); returns tokens."""
        dropped = self.manager.evict_blocks(block_ids)
        self._sync_evictions()
        return dropped * self.page_size

    def get_num_common_prefix_blocks(self, req: Request) -> int:
        """Leading blocks of ``req`` (group 0) that every running request references."""
        self._live_record(req, "get_num_common_prefix_blocks")
        return self.manager.coordinator.single_type_managers[0].get_num_common_prefix_blocks(req.request_id)

    # ---------------------------------------------------------------- accounting
    def usage(self) -> PageUsage:
        pool = self.block_pool
        num_free = pool.get_num_free_blocks()
        return PageUsage(
            free=num_free - pool.num_cached_free_blocks,
            evictable=pool.num_cached_free_blocks,
            in_use=self.config.num_usable_pages - num_free,
        )

    def check_invariants(self) -> None:
        super().check_invariants()
        self.block_pool.check_invariants()
        live = {r.request_id for r in self.live_requests}
        holders = [0] * self.block_pool.num_gpu_blocks
        held_by: dict[str, set[int]] = {rid: set() for rid in live}
        for group_id, manager in enumerate(self.manager.coordinator.single_type_managers):
            req_to_blocks, num_cached_block = manager.req_to_blocks, manager.num_cached_block
            windowed = manager.spec.kind == "sliding_window"
            ensure(
                set(req_to_blocks) == live,
                f"group {group_id} holds {sorted(req_to_blocks)}, live {sorted(live)}",
            )
            ensure(
                set(num_cached_block) == live,
                f"group {group_id}: num_cached_block and live requests disagree",
            )
            for rid, blocks in req_to_blocks.items():
                ensure(num_cached_block[rid] <= len(blocks), f"{rid!r} cached more blocks than it holds")
                num_nulls = sum(1 for b in blocks if b.is_null)
                if windowed:
                    # Out-of-window blocks are nulled from the left: the nulls are a prefix.
                    ensure(
                        all(b.is_null for b in blocks[:num_nulls]), f"{rid!r}: a null block after a real one"
                    )
                else:
                    ensure(num_nulls == 0, f"{rid!r} holds the null block in full-attention group {group_id}")
                for b in blocks[num_nulls:]:
                    ensure(b is not self.block_pool.null_block, f"{rid!r} holds the null block")
                    ensure(b.block_id not in held_by[rid], f"{rid!r} holds block {b.block_id} twice")
                    held_by[rid].add(b.block_id)
                    ensure(b.ref_cnt >= 1, f"{rid!r} holds block {b.block_id} with ref_cnt {b.ref_cnt}")
                    key = b.block_hash
                    ensure(
                        key is None or key.endswith(group_id_suffix(group_id)),
                        f"block {b.block_id} in group {group_id} is cached under another group's key",
                    )
                    holders[b.block_id] += 1
        for rid, record in self._live.items():
            ensure(
                all(a is b for a, b in zip(record.state, self.manager.get_blocks(rid), strict=True)),
                f"{rid!r}: live record and managers hold different block lists",
            )
        for b in self.block_pool.blocks[1:]:
            ensure(
                b.ref_cnt == holders[b.block_id],
                f"block {b.block_id}: ref_cnt {b.ref_cnt}, held by {holders[b.block_id]}",
            )
        ensure(self.stats.evicted_tokens >= 0, "negative evicted_tokens")
        ensure(set(self.manager.seen_fraction) <= live, "lrp keeps state for a request that is not live")

    def _sync_evictions(self) -> None:
        evicted = self.block_pool.num_evicted_blocks
        self.stats.evicted_tokens += (evicted - self._evicted_seen) * self.page_size
        self._evicted_seen = evicted
        ranked = self.block_pool.ranked
        if ranked is not None:
            self.stats.orphaned_tokens = ranked.num_orphaned_blocks * self.page_size
