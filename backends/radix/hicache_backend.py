"""HiCacheRadixPrefixCache: the radix backend with SGLang 0.5.23's HiCache host tier (L2 only).

In our hooks, as 0.5.23's scheduler drives ``UnifiedRadixCache`` with ``init_hicache``::

    lookup   match_prefix: device prefix, then the host-only tail (``host_hit_length``);
             ``Match.host_tokens`` is that tail, or 0 below ``load_back_threshold`` (10)
    allocate first: ``PrefillAdder.add_one_req`` -> ``init_load_back`` -> ``load_back``: all
             the tail or nothing; device eviction first when short (``evict_for_alloc``);
             then the extend's pages as the plain backend takes them
    commit / release   checkpoint as the plain backend; the insert may start write-through
             copies (hicache_tree.py), acknowledged in ``advance_transfers`` (``writing_check``
             at the next scheduler step; the write lock is held until then)

A load needs the whole tail's device pages and the extend's at once; if even evicting every
unpinned device node cannot give both, ``allocate`` refuses and changes nothing (SGLang's
budget check refuses such a request up front).

With ``host_tier.storage`` the L3 tier (hicache_storage.py) adds: a write-through ack writes the
node on to L3; a lookup of a request not live starts its prefetch (the enqueue; ``enqueue``
starts it without the admission poll) and polls it (``Match.pending`` while the policy holds
it); ``advance_transfers`` moves prefetched pages and storage acks along. What the engine asks
of the tier (those two, its usage and metrics) is the cache's ``host_tier`` (hicache_tier.py).

``kv_events=True``: the tree records SGLang 0.5.23's events on both media (hicache_tree.py):
device (GPU) stores and removals as the dense tree's, plus a revival's store and a demotion's
removal; host (CPU_PINNED) stores when a copy is published (a write-through ack, a write-back
copy, a prefetched node) and removals when a host copy goes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import numpy as np
from prefixcache.backends.radix.backend import RadixPrefixCache, TreeMatch
from prefixcache.backends.radix.hicache_pool import HostPool, host_pool_tokens
from prefixcache.backends.radix.hicache_storage import HiCacheStorage, storage_from_config
from prefixcache.backends.radix.hicache_tier import HiCacheTier
from prefixcache.backends.radix.hicache_tree import HiRadixCache
from prefixcache.backends.radix.key import request_key
from prefixcache.backends.radix.radix_cache import LockReceipt, ReqKV
from prefixcache.backends.radix.tree import TreeNode

from prefixcache.config import CacheConfig
from prefixcache.interface import Match
from prefixcache.pool import PageIds, PageTable
from prefixcache.request import Request
from prefixcache.tiers import HostTier, HostTierConfig

LOAD_BACK_THRESHOLD = 10  # init_hicache: self.load_back_threshold = 10
DEFAULT_WRITE_POLICY = "write_through"  # server_args.hicache_write_policy, 0.5.23
HASHCHAIN_ONLY_FIELDS = ("eviction_policy", "block_size", "store_threshold", "offload_prompt_only")


@dataclass(frozen=True, slots=True, eq=False)
class HiTreeMatch(TreeMatch):
    """TreeMatch plus the host part: ``best_node`` ends it, ``host_hit_length`` is its size;
    ``host_tokens`` is what admission loads (0 below the threshold)."""

    best_node: TreeNode | None = None
    host_hit_length: int = 0
    host_tokens: int = 0  # type: ignore[assignment]
    pending: bool = False  # type: ignore[assignment]  # L3: its prefetch holds admission


class HiCacheRadixPrefixCache(RadixPrefixCache):
    name = "radix"

    def __init__(
        self,
        config: CacheConfig,
        *,
        host_tier: HostTierConfig,
        eviction_policy: str = "lru",
        clock: Callable[[], float] = time.monotonic,
        need_sort: bool = False,
        disable: bool = False,
        is_eagle: bool = False,
        kv_events: bool = False,
    ) -> None:
        if not isinstance(host_tier, HostTierConfig):
            raise ValueError(f"host_tier must be a HostTierConfig, got {type(host_tier).__name__}")
        if config.is_hybrid:
            raise ValueError(
                "the radix host tier models full-attention layouts only, not "
                f"{config.model_layout.describe()}"
            )
        if disable:
            raise ValueError("HiCache needs the radix cache: disable=True with a host tier")
        if is_eagle:
            raise ValueError("the radix host tier does not model EAGLE bigram keys")
        host_tier.reject_fields("radix", HASHCHAIN_ONLY_FIELDS)
        self.write_policy = host_tier.write_policy or DEFAULT_WRITE_POLICY
        threshold = host_tier.load_back_threshold
        self.load_back_threshold = LOAD_BACK_THRESHOLD if threshold is None else threshold
        self.device_tokens = config.num_usable_pages * config.page_size
        self.host_size = host_pool_tokens(host_tier, self.device_tokens, config.page_size)
        super().__init__(
            config, eviction_policy=eviction_policy, clock=clock, need_sort=need_sort, kv_events=kv_events
        )
        # The L3 tier (hicache_storage.py), off unless host_tier.storage.
        self.storage: HiCacheStorage | None = storage_from_config(self.hitree, host_tier, self.host_size)
        self.hicache = HiCacheTier(
            host_tier, self.hitree, self.storage, self.page_size,
            check_request=self._check_request, is_live=self.is_live,
        )  # fmt: skip

    def _new_tree(self, eviction_policy: str, clock: Callable[[], float], disable: bool) -> HiRadixCache:
        return HiRadixCache(
            self.page_size,
            host_pool=HostPool(self.host_size, self.page_size),
            write_policy=self.write_policy,
            eviction_policy=eviction_policy,
            free_slots=self._free_slots,
            on_stored=self._count_stored,
            on_host_evicted=self._count_host_evicted,
            clock=clock,
            events=self.events,
        )

    def _count_stored(self, n: int) -> None:
        self.stats.stored_tokens += n

    def _count_host_evicted(self, n: int) -> None:
        self.stats.host_evicted_tokens += n

    @property
    def hitree(self) -> HiRadixCache:
        return cast(HiRadixCache, self.tree)

    # ------------------------------------------------------------------ hooks
    def _match(self, req: Request) -> HiTreeMatch:
        key = request_key(req)[: req.num_tokens - 1]
        m = self.hitree.match_with_host(key)
        pending = False
        if self.storage is not None and not self.is_live(req):  # enqueue + admission poll
            if self.storage.on_lookup(req, key, m.device.length + m.host_hit_length, m.best_node):
                m = self.hitree.match_with_host(key)
            pending = self.storage.is_pending(req)
        host = m.host_hit_length
        # load_back skips a tail under max(1, load_back_threshold) tokens: they are recomputed
        loads = host if host >= max(1, self.load_back_threshold) else 0
        d = m.device
        return HiTreeMatch(
            self,
            req,
            req.num_tokens,
            d.length,
            self.tree.version,
            d.indices,
            d.last_node,
            best_node=m.best_node,
            host_hit_length=host,
            host_tokens=loads,
            pending=pending,
        )

    def _revalidate(self, match: Match) -> TreeMatch:
        """The tree changed since: a device node may be host-only now, a host copy gone."""
        return self._match(match.request)

    def _admit(self, req: Request, num_new_tokens: int, match: Match) -> ReqKV | None:
        m = cast(HiTreeMatch, match)
        tree, p = self.hitree, self.page_size
        hit = m.tokens + m.host_tokens
        load = tree.evicted_path(m.best_node) if m.host_tokens and m.best_node is not None else []
        assert sum(len(n.key) for n in load) == m.host_tokens
        load_pages = m.host_tokens // p
        need = -(-(hit + num_new_tokens) // p) - hit // p
        tree.inc_lock_ref(m.last_node)  # first, so making room cannot evict our hit
        if load_pages + need > self.pool.num_free + tree.evictable_size() // p:
            tree.dec_lock_ref(m.last_node)
            return None
        last_node = m.last_node
        loaded: PageIds | None = np.empty(0, dtype=np.int64)
        if load:
            assert m.best_node is not None
            m.best_node.host_lock_ref += 1  # held to the ack: eviction may write back, evict host
            short = m.host_tokens - self.pool.num_free * p
            if short > 0:
                self.stats.evicted_tokens += tree.evict(short)
            loaded = self.pool.alloc(load_pages)
            assert loaded is not None
            slots, at = self._slots(loaded), 0
            for node in load:
                tree.revive(node, slots[at : at + len(node.key)])
                at += len(node.key)
            tree.inc_lock_ref(m.best_node)  # the request's lock
            tree.inc_lock_ref(m.best_node)  # the load's (ongoing_load_back), with the host pin
            tree.ongoing_loads.append(m.best_node)
            tree.dec_lock_ref(m.last_node)
            last_node = m.best_node
        assert self._can_take(need, admit=True), "the load and the extend were checked to fit together"
        # [0, tokens) device hit | [tokens, hit) loaded from host | [hit, ...) our own pages
        assert loaded is not None
        pages = PageTable(np.concatenate([self._pages_of(m.indices), loaded]))
        live = ReqKV(pages, hit, LockReceipt(last_node, None), req.num_tokens)
        self._take(live, need, num_new_tokens, decode=False)
        self.hicache.count_admission(req, m.tokens, m.host_tokens)
        return live

    def _in_place_now(self) -> bool:
        """Not while a copy is in flight: its ack (next step) changes the cache."""
        if self.hitree.ongoing_writes or self.hitree.ongoing_loads:
            return False
        if self.storage is not None and self.storage.in_flight():
            return False
        return super()._in_place_now()

    def _duplicates(self, mine: PageIds, tree_pages: PageIds) -> PageIds:
        """Pages the tree adopted (host-only nodes restored from this request's KV) are its
        own now, not duplicates."""
        return mine[mine != tree_pages]

    def _reset(self) -> None:
        self.hitree.host_pool = HostPool(self.host_size, self.page_size)
        super()._reset()
        self.hicache.reset()

    def _release(self, req: Request, state: ReqKV) -> None:
        super()._release(req, state)
        self.hicache.released(req)

    # ------------------------------------------------------------------ what it is given
    @property
    def host_tier(self) -> HostTier:
        """HiCache's host pool and L3 tier as the engine sees them (hicache_tier.py)."""
        return self.hicache

    # ------------------------------------------------------------------ accounting
    def check_invariants(self) -> None:
        """The device pages as the dense cache checks them (host-only nodes hold none), then
        the host tier's."""
        super().check_invariants()
        self.hicache.check_invariants()
