"""``HashChainCache``: vLLM v1's automatic prefix caching behind the PrefixCache contract.

The adapter only translates: lookup -> get_computed_blocks, allocate -> allocate_slots,
release -> free, reset -> reset_prefix_cache. vLLM caches full blocks when it allocates them,
so ``commit`` publishes nothing.
"""

from __future__ import annotations

from prefixcache.backends.hashchain.hashing import get_hash_fn
from prefixcache.backends.hashchain.manager import KVCacheManager

from prefixcache.config import CacheConfig
from prefixcache.interface import PageUsage, PrefixCache, ensure
from prefixcache.request import Request


class HashChainCache(PrefixCache):
    """Options (keywords of ``make_cache``; defaults = vLLM):

    hash_fn:        "sha256" | "sha256_cbor" | "xxhash" | "xxhash_cbor" | "builtin" (UNSAFE,
                    for cost comparisons only)
    free_order:     "reverse" (vLLM) | "forward": order in which a request's blocks are freed
    unhashed_first: True (vLLM): freed blocks without a hash go to the head of the free queue
    """

    name = "hashchain"

    def __init__(
        self,
        config: CacheConfig,
        *,
        hash_fn: str = "sha256",
        free_order: str = "reverse",
        unhashed_first: bool = True,
    ) -> None:
        super().__init__(config)
        if not isinstance(unhashed_first, bool):
            raise ValueError(f"unhashed_first must be a bool, got {unhashed_first!r}")
        self.hash_fn_name = hash_fn
        self.manager = KVCacheManager(
            config.num_pages,
            config.page_size,
            get_hash_fn(hash_fn),
            free_order=free_order,
            unhashed_first=unhashed_first,
        )
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
        new_blocks = self.manager.allocate_slots(req, num_new_tokens, hit, blocks)
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
        ensure(
            held * self.page_size >= req.num_computed_tokens,
            f"{req.request_id!r} committed {req.num_computed_tokens} tokens into {held} blocks",
        )

    def _release(self, req: Request) -> None:
        self.manager.free(req)

    def _page_table(self, req: Request) -> list[int]:
        return self.manager.get_block_ids(req.request_id)

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
        manager = self.manager
        live = {r.request_id for r in self.live_requests}
        ensure(
            set(manager.req_to_blocks) == live,
            f"manager holds {sorted(manager.req_to_blocks)}, live {sorted(live)}",
        )
        ensure(set(manager.num_cached_block) == live, "num_cached_block and live requests disagree")
        holders = [0] * self.block_pool.num_gpu_blocks
        for rid, blocks in manager.req_to_blocks.items():
            ids = [b.block_id for b in blocks]
            ensure(len(set(ids)) == len(ids), f"{rid!r} holds a block twice")
            ensure(0 not in ids, f"{rid!r} holds the null block")
            ensure(manager.num_cached_block[rid] <= len(blocks), f"{rid!r} cached more blocks than it holds")
            for b in blocks:
                ensure(b.ref_cnt >= 1, f"{rid!r} holds block {b.block_id} with ref_cnt {b.ref_cnt}")
                holders[b.block_id] += 1
        for b in self.block_pool.blocks[1:]:
            ensure(
                b.ref_cnt == holders[b.block_id],
                f"block {b.block_id}: ref_cnt {b.ref_cnt}, held by {holders[b.block_id]}",
            )
        ensure(self.stats.evicted_tokens >= 0, "negative evicted_tokens")

    def _sync_evictions(self) -> None:
        evicted = self.block_pool.num_evicted_blocks
        self.stats.evicted_tokens += (evicted - self._evicted_seen) * self.page_size
        self._evicted_seen = evicted
