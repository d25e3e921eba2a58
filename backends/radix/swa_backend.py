"""SWARadixPrefixCache: the radix backend over a hybrid full + sliding-window layout, as SGLang
0.5.23 runs such a model (``UnifiedRadixCache`` with FULL + SWA over ``SWATokenToKVPoolAllocator``).

Request flow, in our hooks (SGLang's names)::

    lookup   match_prefix(all tokens but the last): the window rule (components/swa.py)
    allocate first: inc_lock_ref(last node), evict_for_alloc for each pool's shortfall, take the
             same pages from both pools. Decode steps past the first: maybe_evict_swa, i.e.
             free_swa_out_of_window_slots once ``swa_eviction_interval`` tokens slid out.
    commit   after an extend (not a decode step): checkpoint: free the out-of-window SWA of
             the request's own pages, insert (prev_prefix_len = protected, swa_evicted_seqlen),
             re-point the page table at the tree's pages, move the lock
    release  checkpoint as a finished request (no window freeing), free the row's unshared part
             (full only below the SWA frontier), unlock, free the over-allocated room

Free groups (SGLang's scheduler, page size > 1: the frees of one group go back as one block):
a ``commit_batch`` opens one that the ``release`` calls after it join (process_batch_result);
allocation and eviction end it first. A release with no group open (a preemption: SGLang's
retract) and eviction free call by call.

``usage()`` is the full pool (a PageUsage over its usable pages: every token of a request needs
a full page); ``swa_usage()`` the SWA pool, the same three ways. Both pools have their own page 0;
``page_table`` holds full-pool ids, ``page_tables`` full ids and SWA ids (0 where freed).
``stats.evicted_tokens`` counts full KV dropped (an SWA-only tombstoning drops no token).
Options: ``swa_full_tokens_ratio`` (SGLang's --swa-full-tokens-ratio, 0.8),
``swa_eviction_interval`` (SGLANG_SWA_EVICTION_INTERVAL, 128) and ``is_eagle`` (bigram keys: a
checkpoint of c tokens inserts the KV of c - 1, and the out-of-window frontier and the SWA branch
point are measured in bigrams as SGLang measures them). SGLang's early release of the
prefill's SWA lock (SGLANG_OPT_RELEASE_PREFILL_SWA) is off by default there and not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import numpy as np
from prefixcache.backends.radix.adapter import RadixAdapter, TreeMatch
from prefixcache.backends.radix.components.swa import SWAComponent, swa_tree
from prefixcache.backends.radix.key import request_key
from prefixcache.backends.radix.radix_cache import InsertParams, LockReceipt
from prefixcache.backends.radix.swa_pool import (
    DEFAULT_SWA_FULL_TOKENS_RATIO,
    SWAPagePool,
    swa_pool_sizes,
    swa_window,
)

from prefixcache.config import CacheConfig
from prefixcache.interface import KVGroup, LiveRequest, Match, PageUsage, ensure
from prefixcache.invariants import check_usage
from prefixcache.pool import PageIds, PageTable
from prefixcache.request import Request

DEFAULT_SWA_EVICTION_INTERVAL = 128  # SGLANG_SWA_EVICTION_INTERVAL


@dataclass(slots=True)
class _SWALive:
    pages: PageTable  # full-pool pages: [0, protected) the tree's, then the request's own
    protected: int  # cache_protected_len
    receipt: LockReceipt
    prefill_end: int  # tokens at admission: steps from there on are decode steps
    # swa_branching_seqlen: where the full-KV hit ran past the SWA-valid hit (page-aligned);
    # the first checkpoint inserts only up to here, reviving the tombstones it crosses
    branching: int | None = None
    swa_evicted: int = 0  # swa_evicted_seqlen: SWA of [0, this) freed by the request (page-aligned)
    decoding: bool = False


class SWARadixPrefixCache(RadixAdapter[_SWALive]):
    swa: SWAComponent  # the tree's SWA component

    def __init__(
        self,
        config: CacheConfig,
        *,
        swa_full_tokens_ratio: float = DEFAULT_SWA_FULL_TOKENS_RATIO,
        swa_eviction_interval: int = DEFAULT_SWA_EVICTION_INTERVAL,
        eviction_policy: str = "lru",
        need_sort: bool = False,
        disable: bool = False,
        is_eagle: bool = False,
        kv_events: bool = False,
    ) -> None:
        """kv_events: SGLang's ``enable_kv_cache_events`` on its unified tree: BlockStored for
        each new leaf, BlockRemoved for each deleted node (a tombstone emits nothing),
        AllBlocksCleared at every reset (radix_cache.py); not with ``is_eagle``."""
        if eviction_policy != "lru" or need_sort or disable:
            raise ValueError(
                "the hybrid SWA radix cache supports eviction_policy='lru', need_sort=False and "
                f"disable=False only (got {eviction_policy!r}, {need_sort}, {disable})"
            )
        if config.model_layout.count("mamba"):
            raise ValueError("radix: Mamba layouts are not supported yet (SWA + full only)")
        if (
            isinstance(swa_eviction_interval, bool)
            or not isinstance(swa_eviction_interval, int)
            or swa_eviction_interval < 1
        ):
            raise ValueError(f"swa_eviction_interval must be a positive int, got {swa_eviction_interval!r}")
        super().__init__(config)
        self.window = swa_window(config)
        self.swa_eviction_interval = swa_eviction_interval
        self.is_eagle = is_eagle
        self.sizes = swa_pool_sizes(config, swa_full_tokens_ratio)
        self.events = self._event_recorder(kv_events, is_eagle)  # one stream across resets
        self._new_pools()

    def _new_pools(self) -> None:
        p = self.page_size
        self.pool = SWAPagePool(self.sizes.full_tokens // p + 1, self.sizes.swa_tokens // p + 1, page_size=p)
        self.swa = SWAComponent(self.window, self.pool)
        self.tree = swa_tree(p, self.swa, is_eagle=self.is_eagle, events=self.events)

    # ------------------------------------------------------------------ layout
    def kv_groups(self) -> tuple[KVGroup, ...]:
        layers = self.config.model_layout.layers
        full = tuple(i for i, layer in enumerate(layers) if layer.kind == "full")
        swa = tuple(i for i, layer in enumerate(layers) if layer.kind == "sliding_window")
        p = self.page_size
        return (
            KVGroup("full", None, "full", p, self.pool.full.num_pages, full),
            KVGroup("sliding_window", self.window, "swa", p, self.pool.swa.num_pages, swa),
        )

    def page_tables(self, req: Request) -> list[list[int]]:
        pages = self._live_record(req, "page_tables").state.pages.array()
        return [pages.tolist(), self.pool.full_to_swa[pages].tolist()]

    def _check_fits(self, req: Request, total_tokens: int) -> None:
        """ValueError if the request's tokens can never fit the full pool, or this allocation's
        new pages (a live request's increment; a new request's whole reservation, hit included)
        the SWA pool. A request may outgrow the SWA pool: its old SWA pages are freed as it goes."""
        if total_tokens > req.num_tokens:
            super()._check_fits(req, total_tokens)
        p = self.page_size
        need = -(-total_tokens // p)
        live = self._live.get(req.request_id)
        new = need - len(live.state.pages) if live is not None and live.request is req else need
        full, swa = self.pool.full.num_pages - 1, self.pool.swa.num_pages - 1
        if need > full or new > swa:
            raise ValueError(
                f"request {req.request_id!r} needs {total_tokens} tokens ({need} full pages, {new} new "
                f"SWA pages) but the full pool holds {full} and the SWA pool {swa} usable pages of {p}"
            )

    # ------------------------------------------------------------------ helpers
    def _take(self, num_pages: int, demand: int) -> PageIds | None:
        """``evict_to_free_tokens(demand)`` then take ``num_pages`` (maybe 0: SGLang evicts for
        its demand even when the tokens fit in the last page) from both pools; None, evicting
        nothing, if even evicting every unlocked entry would not make room."""
        p = self.page_size
        tree, pool = self.tree, self.pool
        if not self._can_take(num_pages):
            return None
        full_short = max(0, demand - pool.full.num_free * p)
        swa_short = max(0, demand - pool.swa.num_free * p)
        if full_short or swa_short:
            freed, _ = tree.evict_for_alloc(full_short, swa_short)
            self.stats.evicted_tokens += freed
        pages = pool.alloc(num_pages)
        assert pages is not None, "eviction made less room than its evictable sizes promised"
        return pages

    def _can_take(self, num_pages: int, swa_bonus: int = 0) -> bool:
        """Whether evicting every unlocked entry would give ``num_pages`` in both pools."""
        p = self.page_size
        pool, tree = self.pool, self.tree
        return (
            num_pages <= pool.full.num_free + tree.evictable_size() // p
            and num_pages <= pool.swa.num_free + swa_bonus + self.swa.evictable // p
        )

    def _out_of_window(self, live: _SWALive, pre_len: int) -> tuple[int, int] | None:
        """``free_swa_out_of_window_slots``' range: the request's own tokens [lo, hi) more than
        ceil(max(window, page)) tokens behind ``pre_len`` (page-aligned; lo >= the tree-owned
        prefix), or None when it returns early."""
        p = self.page_size
        if pre_len - self.window < live.swa_evicted + 1:
            return None
        evicted = max(live.swa_evicted, live.protected)  # swa_dead_lo: the tree's prefix is not ours
        threshold = pre_len - -(-max(self.window, p) // p) * p
        return evicted, max(evicted, threshold) // p * p

    def _free_out_of_window(self, live: _SWALive, pre_len: int) -> None:
        span = self._out_of_window(live, pre_len)
        if span is None:
            return
        lo, hi = span
        if hi > lo:
            self.pool.free_swa(live.pages[lo // self.page_size : hi // self.page_size])
        live.swa_evicted = max(lo, hi)

    # ------------------------------------------------------------------ hooks
    def _admit(self, req: Request, num_new_tokens: int, match: Match) -> _SWALive | None:
        self.pool.end_group()  # the scheduler allocates after the last batch's group closed
        m = cast(TreeMatch, match)
        total = m.tokens + num_new_tokens
        receipt = self.tree.lock(m.last_node)  # first, so making room cannot evict the hit
        need = -(-total // self.page_size) - m.tokens // self.page_size
        new_pages = self._take(need, self._demand(num_new_tokens, decode=False)[0])
        if new_pages is None:
            self.tree.unlock(receipt)
            return None
        pages = PageTable(np.concatenate([self._pages_of(m.indices), new_pages]))
        p = self.page_size
        branching = m.full_hit // p * p
        return _SWALive(pages, m.tokens, receipt, req.num_tokens, branching if branching > m.tokens else None)

    def _extend(self, req: Request, state: _SWALive, total_tokens: int) -> bool:
        self.pool.end_group()
        live = state
        decoding = req.num_computed_tokens >= live.prefill_end
        n = total_tokens - self.reserved_tokens(req)
        decode = decoding and n == 1
        # maybe_evict_swa (prepare_for_decode, before the allocation): from the second decode
        # step on, once an interval of tokens slid out of the window
        pre_len = req.num_computed_tokens
        interval = self.swa_eviction_interval
        slide = decode and pre_len > live.prefill_end and pre_len - self.window >= live.swa_evicted + interval
        need = max(0, -(-total_tokens // self.page_size) - len(live.pages))
        span = self._out_of_window(live, pre_len) if slide else None
        released = (span[1] - span[0]) // self.page_size if span is not None else 0
        if not self._can_take(need, swa_bonus=released):
            return False  # ours: SGLang would slide the window and then fail (retract)
        if slide:
            self._free_out_of_window(live, pre_len)
        new_pages = self._take(need, self._demand(n, decode)[0])
        if new_pages is None:
            return False
        live.pages.extend(new_pages)
        live.decoding = decoding
        return True

    def _checkpoint(self, req: Request, live: _SWALive, finished: bool = False) -> None:
        """``checkpoint_into_tree(req, up_to=num_computed_tokens)``."""
        p = self.page_size
        computed = req.num_computed_tokens
        eagle = int(self.is_eagle)  # an EAGLE key of N bigrams spans N + 1 raw tokens
        branching = -1 if live.branching is None else live.branching
        branch = live.protected < branching and branching + eagle <= computed
        cache_len = branching + eagle if branch else computed  # prepare_for_caching_req
        key = request_key(req)[:cache_len].maybe_to_bigram_view(self.is_eagle)[0]
        if not finished:
            self._free_out_of_window(live, len(key) - 1)  # measured on the key, as SGLang
        key = key.page_aligned(p)
        aligned = len(key)
        if aligned == 0:
            return
        own = self._slots(live.pages[: aligned // p])
        params = InsertParams(live.protected, live.swa_evicted)
        node = self.tree.insert_ending_at(key, own, params=params).node
        path = self.tree.path_indices(node)
        assert len(path) == aligned, f"insert ended at {len(path)} of {aligned} tokens"
        live.pages[live.protected // p : aligned // p] = self._pages_of(path[live.protected :])
        self.tree.unlock(live.receipt)
        live.receipt = self.tree.lock(node)
        live.protected = aligned
        if branch:  # cleanup_after_caching_req: the branch is in; free what slid out since
            live.branching = None
            if not finished:
                self._free_out_of_window(live, computed - eagle - 1)

    def _commit_batch(self, records: list[LiveRequest[_SWALive]]) -> None:
        """SGLang's process_batch_result_* opens one free group for the batch's checkpoints
        and the releases of the requests that finish in it; ours stays open across the
        ``release`` calls that follow, until the next call that allocates or evicts. A middle
        prefill chunk is checkpointed outside any group (stash_chunked_request); ours does it
        first (SGLang: when the next batch is scheduled, after the group)."""
        self.pool.end_group()
        grouped = []
        for live in records:
            state, req = live.state, live.request
            if not state.decoding and req.num_computed_tokens < state.prefill_end:
                self._commit(req, state)
            else:
                grouped.append(live)
        self.pool.group_begin()
        for live in grouped:
            self._commit(live.request, live.state)

    def _release(self, req: Request, state: _SWALive) -> None:
        live = state
        p = self.page_size
        computed = req.num_computed_tokens
        if computed:
            self._checkpoint(req, live, finished=True)
        written = -(-computed // p)
        lo = live.protected // p
        dead_hi = max(live.swa_evicted, live.protected) // p
        own = live.pages[lo:written]
        self.pool.free_full_only(own[: max(0, dead_hi - lo)])
        self.pool.free(own[max(0, dead_hi - lo) :])
        self.tree.unlock(live.receipt)
        self.pool.free(live.pages[written:])

    def _evict(self, num_tokens: int) -> int:
        self.pool.end_group()
        return super()._evict(num_tokens)

    def evict_swa(self, num_tokens: int) -> int:
        """Drop unlocked SWA KV of at least ``num_tokens`` tokens (SGLang's
        ``evict(EvictParams(swa_num_tokens=n))``); returns the SWA tokens freed."""
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 0:
            raise ValueError(f"num_tokens must be an int >= 0, got {num_tokens!r}")
        self.pool.end_group()
        return self.tree.evict_for_alloc(0, num_tokens)[1]

    def _reset(self) -> None:
        version = self.tree.version
        self._new_pools()
        self.tree.version += version  # never repeats across a reset: old matches must revalidate

    # ------------------------------------------------------------------ accounting
    def usage(self) -> PageUsage:
        """The full pool's pages (the one every request's tokens all need)."""
        free = self.pool.full.num_free
        evictable = self.tree.evictable_size() // self.page_size
        return PageUsage(free, evictable, self.pool.full.num_pages - 1 - free - evictable)

    def num_usable_pages(self) -> int:
        """The full pool's, which ``usage`` reports (``swa_usage`` the other's)."""
        return self.pool.full.num_pages - 1

    def memory_in_use(self) -> int:
        """Pinned pages of both pools, each a page in every layer that pool serves."""
        layout = self.config.model_layout
        p = self.page_size
        return (self.usage().in_use * p * layout.count("full")
                + self.swa_usage().in_use * p * layout.count("sliding_window"))

    def swa_usage(self) -> PageUsage:
        """The sliding-window pool's pages, the same three ways."""
        free = self.pool.swa.num_free
        evictable = self.swa.evictable // self.page_size
        return PageUsage(free, evictable, self.pool.swa.num_pages - 1 - free - evictable)

    def check_invariants(self) -> None:
        check_usage("full", self.usage(), self.pool.full.num_pages - 1)
        check_usage("swa", self.swa_usage(), self.pool.swa.num_pages - 1)
        try:
            self.pool.check()
            self.tree.check()
        except AssertionError as e:
            ensure(False, f"swa radix: {e}")
        p = self.page_size
        tree_full: set[int] = set()
        tree_swa: set[int] = set()
        for node in self.tree.iter_nodes():
            assert node.value is not None
            pages = self._pages_of(node.value).tolist()
            ensure(not tree_full & set(pages), f"{node}: a full page held by two nodes")
            tree_full.update(pages)
            if node.swa is not None:
                tree_swa.update(self.pool.full_to_swa[self._pages_of(node.value)].tolist())
        for rid, record in self._live.items():
            ensure(record.request.num_computed_tokens <= record.reserved, f"{rid!r} computed > reserved")
            ensure(len(record.state.pages) * p >= record.reserved, f"{rid!r} page table short of reserved")
        free_full = set(self.pool.full.free_page_ids().tolist())
        self._check_request_pages(tree_full, free_full, self.pool.full.num_pages - 1)
        mapped = self.pool.full_to_swa[self.pool.full_to_swa > 0]
        free_swa = self.pool.swa.num_free
        ensure(
            free_swa + len(mapped) == self.pool.swa.num_pages - 1,
            f"swa pages free {free_swa} + mapped {len(mapped)} != {self.pool.swa.num_pages - 1} usable",
        )
        ensure(tree_swa <= set(mapped.tolist()), "a tree SWA page is not mapped")
