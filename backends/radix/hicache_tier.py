"""HiCache as a host tier (``prefixcache.tiers.HostTier``): what the engine asks of SGLang
0.5.23's host pool and L3 storage under the tree, as ``HiCacheRadixPrefixCache.host_tier``.

Given the tree (hicache_tree.py: the host copies, the copies in flight), the L3 tier
(hicache_storage.py, or None) and what it reads of the cache (its request checks), not the cache.
"""

from __future__ import annotations

from collections.abc import Callable

from prefixcache.backends.radix.hicache_storage import HiCacheStorage
from prefixcache.backends.radix.hicache_tree import HiRadixCache
from prefixcache.backends.radix.key import request_key

from prefixcache.interface import PageUsage, ensure
from prefixcache.request import Request
from prefixcache.tiers import HostTier, HostTierConfig


class HiCacheTier(HostTier):
    load_overlapped = True  # layer-by-layer in the same forward

    def __init__(
        self,
        config: HostTierConfig,
        tree: HiRadixCache,
        storage: HiCacheStorage | None,
        page_size: int,
        *,
        check_request: Callable[[Request], None],
        is_live: Callable[[Request], bool],
    ) -> None:
        super().__init__(config)
        self.tree = tree
        self.storage = storage
        self.page_size = page_size
        self.check_request = check_request
        self.is_live = is_live
        self.cached_tokens_device = self.cached_tokens_host = 0

    def count_admission(self, req: Request, device_tokens: int, host_tokens: int) -> None:
        """An admission hit ``device_tokens`` on the device and loaded ``host_tokens``."""
        self.cached_tokens_device += device_tokens
        self.cached_tokens_host += host_tokens
        self.admitted(req, host_tokens)

    def reset(self) -> None:
        self.cached_tokens_device = self.cached_tokens_host = 0
        if self.storage is not None:
            self.storage.reset()

    # ------------------------------------------------------------------ what the engine asks
    def transfers_in_flight(self) -> bool:
        return self.storage is not None and self.storage.in_flight()

    def enqueue(self, req: Request) -> None:
        """The scheduler's enqueue (``_prefetch_kvcache``): start ``req``'s L3 prefetch without
        an admission poll (``lookup`` of a request not yet enqueued does both). No-op without
        the L3 tier or for a live request."""
        self.check_request(req)
        if self.storage is None or self.is_live(req):
            return
        key = request_key(req)[: req.num_tokens - 1]
        m = self.tree.match_with_host(key)
        self.storage.on_lookup(req, key, m.device.length + m.host_hit_length, m.best_node, poll=False)

    def advance_transfers(self) -> None:
        """``check_hicache_events``: writes ack (``writing_check``), then loads
        (``loading_check``); every copy started before this step has finished."""
        if self.storage is not None:
            self.storage.ack_backups()  # last step's L3 writes
        self.tree.ack_writes()  # with storage: each acked node goes on to L3
        self.tree.ack_loads()
        if self.storage is not None:
            self.storage.advance()  # prefetch: pages arrive, then last step's hit queries drain

    def usage(self) -> PageUsage:
        """free: host pool; in use: copies in flight (a write-through not yet acked, a load's
        pinned anchor); evictable: every other host copy the tree holds."""
        tree, p = self.tree, self.page_size
        writing = (n for _, nodes in tree.ongoing_writes.values() for n in nodes if n.write_ack is not None)
        busy = {n.id: n for n in writing}
        busy.update((n.id, n) for n in tree.ongoing_loads)  # O(copies in flight), not O(tree)
        buffers = 0
        if self.storage is not None:  # L3: pinned anchors and writes, prefetch buffers
            busy.update((n.id, n) for n in self.storage.busy_nodes())
            buffers = len(self.storage.buffer_pages())
        in_use = sum(len(n.host_value) for n in busy.values() if n.host_value is not None) // p + buffers
        free = tree.host_pool.num_free_pages
        return PageUsage(free, tree.host_pool.num_pages - free - in_use, in_use)

    def num_pages(self) -> int:
        return self.tree.host_pool.num_pages

    def metrics(self) -> dict[str, int]:
        """SGLang's ``sglang:cached_tokens`` by ``cache_source`` (device / host), summed over
        admissions."""
        metrics = {
            "cached_tokens_device": self.cached_tokens_device,
            "cached_tokens_host": self.cached_tokens_host,
        }
        if self.storage is not None:  # StorageMetricsCollector's prefetched / backuped tokens
            metrics["prefetched_tokens"] = self.storage.prefetched_tokens
            metrics["backuped_tokens"] = self.storage.backuped_tokens
        return metrics

    # ------------------------------------------------------------------ accounting
    def check_invariants(self) -> None:
        """The host pool: every host page free, held by one node, or a prefetch buffer."""
        self.check_usage()
        tree, p = self.tree, self.page_size
        host_pages = [page for n in tree._host_nodes() for page in (n.host_value[::p] // p).tolist()]
        host_set = set(host_pages)
        in_flight = [n for n in tree._host_nodes() if n.write_ack is not None or n.host_lock_ref]
        busy = sum(len(n.host_value) for n in in_flight if n.host_value is not None)
        buffers = self.storage.buffer_pages() if self.storage is not None else []
        ensure(
            self.usage().in_use == busy // p + len(buffers),
            "host pages in flight drifted from the tree's",
        )
        ensure(len(host_set) == len(host_pages), "a host page is held by two tree nodes")
        host_free = tree.host_pool.free_page_ids()
        ensure(
            len(set(host_free)) == len(host_free) and not set(host_free) & host_set,
            "a free host page is held",
        )
        ensure(
            len(set(buffers)) == len(buffers) and not set(buffers) & (host_set | set(host_free)),
            "a prefetch buffer page is also free or in the tree",
        )
        ensure(
            len(host_free) + len(host_set) + len(buffers) == tree.host_pool.num_pages,
            f"host pages free {len(host_free)} + tree {len(host_set)} + prefetch {len(buffers)} "
            f"!= {tree.host_pool.num_pages}",
        )
