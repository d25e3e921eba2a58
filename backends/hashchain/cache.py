"""``HashChainCache``: vLLM v1's automatic prefix caching behind the PrefixCache contract.

The adapter only translates: lookup -> get_computed_blocks, allocate -> allocate_slots,
release -> free, reset -> reset_prefix_cache. vLLM caches full blocks when it allocates them,
so ``commit`` publishes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

from prefixcache.backends.hashchain.block import KVCacheBlock
from prefixcache.backends.hashchain.coordinator import HybridKVCacheManager
from prefixcache.backends.hashchain.hashing import get_hash_fn
from prefixcache.backends.hashchain.manager import KVCacheManager
from prefixcache.backends.hashchain.single_type import AttentionGroupSpec

from prefixcache.config import CacheConfig
from prefixcache.interface import PageUsage, PrefixCache, ensure
from prefixcache.request import Request


class HashChainCache(PrefixCache):
    """Options (keywords of ``make_cache``; defaults = vLLM):

    hash_fn:        "sha256" | "sha256_cbor" | "xxhash" | "xxhash_cbor" | "builtin" (UNSAFE,
                    for cost comparisons only)
    free_order:     "reverse" (vLLM) | "forward": order in which a request's blocks are freed
    unhashed_first: True (vLLM): freed blocks without a hash go to the head of the free queue
    attention_groups: KV-cache groups of a hybrid model, e.g. [("full",), ("sliding_window", 128)];
                    default one full-attention group. Several groups share one block pool
                    (coordinator.py); ``page_table`` shows group 0, ``page_tables`` every group.
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
    ) -> None:
        super().__init__(config)
        if not isinstance(unhashed_first, bool):
            raise ValueError(f"unhashed_first must be a bool, got {unhashed_first!r}")
        self.hash_fn_name = hash_fn
        groups = [("full",)] if attention_groups is None else list(attention_groups)
        if not groups:
            raise ValueError("attention_groups needs at least one group, e.g. [('full',)]")
        specs = [AttentionGroupSpec.parse(g) for g in groups]
        self.attention_groups = specs
        self.manager: KVCacheManager | HybridKVCacheManager
        if specs == [AttentionGroupSpec("full")]:
            # vLLM's UnitaryKVCacheCoordinator: the one-group path, unchanged.
            self.manager = KVCacheManager(
                config.num_pages,
                config.page_size,
                get_hash_fn(hash_fn),
                free_order=free_order,
                unhashed_first=unhashed_first,
            )
        else:
            self.manager = HybridKVCacheManager(
                config.num_pages,
                config.page_size,
                get_hash_fn(hash_fn),
                specs,
                free_order=free_order,
                unhashed_first=unhashed_first,
            )
            # Bound per instance so the one-group path keeps the plain check (once per step).
            self._check_fits = self._check_fits_all_groups  # type: ignore[method-assign]
        self.block_pool = self.manager.block_pool
        self._evicted_seen = 0  # block_pool.num_evicted_blocks already in stats.evicted_tokens

    # ---------------------------------------------------------------- hooks
    def _lookup(self, req: Request) -> int:
        return self.manager.get_computed_blocks(req)[1]

    def _admit(self, req: Request, num_new_tokens: int) -> bool:
        blocks, hit = self.manager.get_computed_blocks(req)
        # "Never fits in the pool" first: it is about the request, whatever the hit adds.
        self._check_fits(req, min(hit + num_new_tokens, req.num_tokens))
        self._check_fits(req, hit + num_new_tokens)
        # A waiting request has computed nothing (vLLM's invariant); put back whatever the
        # caller left there if we fail, so that a failed allocate changes nothing.
        prior = req.num_computed_tokens
        req.num_computed_tokens = 0
        new_blocks = self.manager.allocate_slots(req, num_new_tokens, hit, blocks)  # type: ignore[arg-type]
        self._sync_evictions()
        if new_blocks is None:
            req.num_computed_tokens = prior
            return False
        self._admitted(req, hit)
        return True

    def _extend(self, req: Request, total_tokens: int) -> bool:
        num_new_tokens = total_tokens - req.num_computed_tokens
        if num_new_tokens <= 0:
            return True
        ok = self.manager.allocate_slots(req, num_new_tokens) is not None
        self._sync_evictions()
        return ok

    def _commit(self, req: Request) -> None:
        # Nothing to publish: full blocks were cached at allocation (vLLM). Only check.
        held = len(self.manager.req_to_blocks[req.request_id])
        if held * self.page_size < req.num_computed_tokens:  # the message only on failure
            ensure(False, f"{req.request_id!r} committed {req.num_computed_tokens} tokens into {held} blocks")

    def _release(self, req: Request) -> None:
        self.manager.free(req)

    def _page_table(self, req: Request) -> list[int]:
        return self.manager.get_block_ids(req.request_id)

    def page_tables(self, req: Request) -> list[list[int]]:
        """One page table per attention group (null block 0 where a window skipped a block)."""
        self._live(req, "page_tables")
        return [[b.block_id for b in group[req.request_id]] for group, _, _ in self._groups()]

    def _check_fits_all_groups(self, req: Request, total_tokens: int) -> None:
        """``_check_fits`` of a hybrid cache: every group's blocks come from the one pool."""
        super()._check_fits(req, total_tokens)
        manager = self.manager
        if isinstance(manager, HybridKVCacheManager):
            need = manager.min_blocks_to_fit(total_tokens)
            if need > self.config.num_usable_pages:
                raise ValueError(
                    f"request {req.request_id!r} needs {total_tokens} tokens: at least {need} pages "
                    f"over {len(manager.managers)} attention groups, but the cache has "
                    f"{self.config.num_usable_pages}"
                )

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
        self._live(req, "get_num_common_prefix_blocks")
        return self.manager.get_num_common_prefix_blocks(req.request_id)

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
        for group_id, (req_to_blocks, num_cached_block, windowed) in enumerate(self._groups()):
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
                        key is None or int.from_bytes(key[-4:], "big") == group_id,
                        f"block {b.block_id} in group {group_id} is cached under another group's key",
                    )
                    holders[b.block_id] += 1
        for b in self.block_pool.blocks[1:]:
            ensure(
                b.ref_cnt == holders[b.block_id],
                f"block {b.block_id}: ref_cnt {b.ref_cnt}, held by {holders[b.block_id]}",
            )
        ensure(self.stats.evicted_tokens >= 0, "negative evicted_tokens")

    def _groups(self) -> list[tuple[dict[str, list[KVCacheBlock]], dict[str, int], bool]]:
        """(req_to_blocks, num_cached_block, is sliding window) of each attention group."""
        manager = self.manager
        if isinstance(manager, HybridKVCacheManager):
            return [
                (m.req_to_blocks, m.num_cached_block, m.spec.kind == "sliding_window")
                for m in manager.managers
            ]
        return [(manager.req_to_blocks, manager.num_cached_block, False)]

    def _sync_evictions(self) -> None:
        evicted = self.block_pool.num_evicted_blocks
        self.stats.evicted_tokens += (evicted - self._evicted_seen) * self.page_size
        self._evicted_seen = evicted
