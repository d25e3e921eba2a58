"""RadixPrefixCache: SGLang 0.5.23's radix cache for every mix, driven the way its scheduler
drives it. The tree (radix_cache.py) has FULL and at most one other component (components/: SWA
for sliding-window layers, MAMBA for Mamba layers), as 0.5.23's ``mem_cache/registry.py`` picks
them; this adapter is ``UnifiedRadixCache``'s request side and the scheduler's allocation over
the mix's pools: ``pool`` (a request's pages; SWA: its full and SWA pools, paged in step) and the
component's own (MAMBA: the state slots). HiCache's host tier is a subclass (hicache_backend.py).

SGLang's request flow, in our hooks::

    lookup   match_prefix(all tokens but the last, whole pages), cut where the component
             accepts (SWA: a window of live tokens; MAMBA: a state)       (no lock, no count)
    allocate first: lock the hit; the component's part of a new request (MAMBA: its own state
             slot, evicting one state if none is free, copied from the hit's); pages
             later: pages for an extend or a decode step (SWA first frees what slid out of the
             window: ``maybe_evict_swa``)
             Eviction demands are SGLang's (allocation.py): page size 1 ``alloc_token_slots``
             evicts for n tokens; a paged extend (``alloc_paged_token_slots_extend``) for
             n + page_size (it assumes each request needs a fresh page), a paged decode step
             for page_size; each evicts what is short of that after the free pages of each pool
             (``evict_for_alloc``), in whole leaves.
    commit   after an extend (not after a decode step): ``checkpoint_into_tree``
    release  release_kv_cache(checkpoint=True): checkpoint every token whose KV exists, free
             the row's unshared part, unlock, free the unused room (three frees, in SGLang's order)

FULL alone checkpoints as SGLang's RadixCache (``_checkpoint_full``): insert the computed whole
pages, split at the prompt boundary, re-point the page table at the tree's pages, free our
duplicates, move the lock; a component's checkpoint makes its inserts through ``_insert``.

Free groups (SWA, page size > 1: the frees of one group go back as one block): a
``commit_batch`` opens one that the ``release`` calls after it join (process_batch_result);
allocation and eviction end it first.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
from prefixcache.backends.radix.components.mamba import MambaComponent
from prefixcache.backends.radix.components.swa import SWAComponent
from prefixcache.backends.radix.events import RadixEventRecorder
from prefixcache.backends.radix.key import RadixKey, request_key
from prefixcache.backends.radix.radix_cache import (
    EMPTY_SLOTS,
    InsertParams,
    RadixCache,
    ReqKV,
    TreeComponent,
    TreeInsert,
)
from prefixcache.backends.radix.swa_pool import SWAPagePool
from prefixcache.backends.radix.tree import SlotArray, TreeNode, page_slots, slot_pages

from prefixcache.config import CacheConfig
from prefixcache.interface import KVGroup, LiveRequest, Match, PageUsage, PrefixCache, ensure
from prefixcache.kv_event_sink import KVEventSink
from prefixcache.pool import PageIds, PagePool, PageTable
from prefixcache.request import Request

EVICTION_GRANULARITIES = ("leaf", "page")
# The options of a layout's component (the others refuse them).
MIX_OPTIONS = {
    "swa": ("swa_full_tokens_ratio", "swa_eviction_interval"),
    "mamba": ("mamba_full_memory_ratio", "max_mamba_cache_size", "mamba_admission", "marconi_alpha",
              "marconi_d_model"),
}


@dataclass(frozen=True, slots=True, eq=False)
class TreeMatch(Match):
    """``match_prefix``'s result for one request (SGLang keeps it on the ``Req``)."""

    indices: SlotArray  # KV slots of the matched tokens, in token order
    last_node: TreeNode  # deepest node of the hit (the root for none)
    key: RadixKey | None = None  # request_key(request), which the admitted request keeps
    full_hit: int = 0  # full_kv_hit_length: tokens whose full KV matched, past a component's rule


class RadixPrefixCache(PrefixCache[ReqKV]):
    name = "radix"
    page_granular = False  # eviction_granularity="page"

    def __init__(
        self,
        config: CacheConfig,
        *,
        eviction_policy: str = "lru",
        disable: bool = False,
        clock: Callable[[], float] | None = None,
        need_sort: bool = False,
        is_eagle: bool = False,
        kv_events: bool = False,
        eviction_granularity: str = "leaf",
        swa_full_tokens_ratio: float | None = None,
        swa_eviction_interval: int | None = None,
        mamba_full_memory_ratio: float | None = None,
        max_mamba_cache_size: int | None = None,
        mamba_admission: str | None = None,
        marconi_alpha: float | None = None,
        marconi_d_model: int | None = None,
    ) -> None:
        """need_sort: SGLang's allocator mode (prefixcache/pool.py); SGLang sets it only under
        prefill/decode disaggregation, so the default False is what a plain SGLang server does.
        clock: the tree's (default: ``time.monotonic``; a counter with a component, as SGLang's).
        is_eagle: SGLang's ``CacheInitParams.is_eagle`` (EAGLE speculative decoding): the tree
        is keyed by bigrams (key.py), so a request of n tokens reuses at most n - 2 and a
        checkpoint of c computed tokens caches the KV of c - 1 (whole pages).
        kv_events: SGLang's ``enable_kv_cache_events``: the tree records BlockStored /
        BlockRemoved / AllBlocksCleared where SGLang 0.5.23's does (events.py; a tombstone emits
        nothing), drained by ``kv_events.take_events()`` (needs msgspec). Not with ``is_eagle``.
        eviction_granularity: "leaf" (SGLang: evict whole leaves for allocation.py's
        over-estimate of the demand) or "page" (ours, vLLM's granularity, an ablation switch of
        the decomposition study: evict the pages the allocation takes and no more, splitting a
        leaf to take them from its end). Not with kv_events.
        The layout's component takes its own options (components/swa.py: SGLang's
        --swa-full-tokens-ratio and SGLANG_SWA_EVICTION_INTERVAL; components/mamba.py:
        --mamba-full-memory-ratio, --max-mamba-cache-size and Marconi's admission and
        eviction); another layout refuses them."""
        if eviction_granularity not in EVICTION_GRANULARITIES:
            raise ValueError(f"eviction_granularity must be one of {EVICTION_GRANULARITIES}, "
                             f"got {eviction_granularity!r}")
        if kv_events and eviction_granularity != "leaf":
            raise ValueError("kv_events with eviction_granularity='page' (a split victim) is not modelled")
        self.page_granular = eviction_granularity == "page"
        super().__init__(config)
        self.need_sort = need_sort
        self.is_eagle = is_eagle
        self.events = self._event_recorder(kv_events, is_eagle)
        mix = dict(
            swa_full_tokens_ratio=swa_full_tokens_ratio, swa_eviction_interval=swa_eviction_interval,
            mamba_full_memory_ratio=mamba_full_memory_ratio, max_mamba_cache_size=max_mamba_cache_size,
            mamba_admission=mamba_admission, marconi_alpha=marconi_alpha, marconi_d_model=marconi_d_model,
        )
        given = {name: value for name, value in mix.items() if value is not None}
        self.component = component = self._new_component(eviction_policy, disable, given)
        self.pool = self._new_pools()
        # A decode step only takes its page (FULL, MAMBA; not an SWA step, which may slide its
        # window): then a batch's steps are taken in place or together where that is exact.
        self.plain_decode = component is None or not component.slides_window
        self.new_page_limit = None if component is None else component.new_page_limit()
        if clock is None:
            clock = time.monotonic if self.component is None else itertools.count().__next__
        self.tree = self._new_tree(eviction_policy, clock, disable)

    def _new_component(
        self, eviction_policy: str, disable: bool, given: dict[str, Any]
    ) -> TreeComponent | None:
        """The layout's component, as SGLang 0.5.23's registry picks it (MAMBA for Mamba layers,
        SWA for sliding-window ones, none for full attention), given its options; ValueError
        for an option it does not take."""
        layout = self.config.model_layout
        kind = "mamba" if layout.count("mamba") else "swa" if self.config.is_hybrid else "dense"
        stray = sorted(set(given) - set(MIX_OPTIONS.get(kind, ())))
        if stray:
            raise ValueError(f"{', '.join(stray)}: not an option of radix over {layout.describe()}")
        if kind == "dense":
            return None
        if self.need_sort or disable or self.page_granular:
            raise ValueError(
                f"radix over a {kind} layout supports need_sort=False, disable=False and "
                f"eviction_granularity='leaf' only (got {self.need_sort}, {disable}, "
                f"{'page' if self.page_granular else 'leaf'})"
            )
        if kind == "mamba":
            return MambaComponent.from_config(self.config, eviction_policy, self.is_eagle, **given)
        if eviction_policy != "lru":
            raise ValueError(f"radix over a swa layout evicts by LRU only, not {eviction_policy!r}")
        return SWAComponent.from_config(self.config, **given)

    def _new_pools(self) -> PagePool | SWAPagePool:
        """Empty pools (at construction and every reset): the component's, and the one a
        request's pages come from, which is returned."""
        if self.component is not None:
            return self.component.new_pools()
        return PagePool(self.config.num_pages, need_sort=self.need_sort, page_size=self.page_size)

    def _new_tree(self, eviction_policy: str, clock: Callable[[], float], disable: bool) -> RadixCache:
        component = self.component
        return RadixCache(
            self.page_size,
            disable=disable,
            is_eagle=self.is_eagle,
            eviction_policy="lru" if component is not None else eviction_policy,
            free_slots=self._free_slots,
            clock=clock,
            events=None if disable else self.events,  # SGLang: a disabled tree records nothing
            capacity=self.config.num_pages,
            learns=True,  # this adapter feeds lrp (learn_admission, learn_release)
            whole_leaves=not self.page_granular,
            component=component,
            order=None if component is None else component.eviction_order,
        )

    @property
    def kv_events(self) -> KVEventSink | None:
        """The tree's recorder (events.py), SGLang's ``take_events`` drains it; None when off."""
        return self.events

    def _event_recorder(self, kv_events: bool, is_eagle: bool) -> RadixEventRecorder | None:
        """SGLang's ``enable_kv_cache_events``: a recorder for the tree to report to (events.py;
        needs msgspec), or None. Not with ``is_eagle`` (bigram-keyed pages, not modelled)."""
        if not isinstance(kv_events, bool):
            raise ValueError(f"kv_events must be a bool, got {kv_events!r}")
        if kv_events and is_eagle:
            raise ValueError("kv_events with is_eagle (bigram-keyed pages) is not modelled")
        return RadixEventRecorder(self.page_size) if kv_events else None

    # ------------------------------------------------------------------ layout
    def kv_groups(self) -> tuple[KVGroup, ...]:
        if self.component is None:
            return super().kv_groups()
        layout = self.config.model_layout
        full = tuple(i for i, layer in enumerate(layout.layers) if layer.kind == "full")
        return (KVGroup("full", None, "full", self.page_size, self.pool.num_pages, full),
                self.component.kv_group(layout))

    def page_tables(self, req: Request) -> list[list[int]]:
        if self.component is None:
            return super().page_tables(req)
        live = self.request_kv(req)
        return [live.pages.tolist(), self.component.page_table_row(live)]

    def request_kv(self, req: Request) -> ReqKV:
        """The live request's KV record (its pages, lock and the component's part)."""
        return self._live_record(req, "request_kv").state

    def _check_fits(self, req: Request, total_tokens: int) -> None:
        super()._check_fits(req, total_tokens)
        limit, need = self.new_page_limit, -(-total_tokens // self.page_size)
        if limit is not None and need > limit:
            live = self._live.get(req.request_id)
            new = need - (len(live.state.pages) if live is not None and live.request is req else 0)
            if new > limit:
                raise ValueError(
                    f"request {req.request_id!r} needs {new} new pages at once but the pool of "
                    f"{type(self.component).__name__} holds {limit} usable pages"
                )

    # ------------------------------------------------------------------ pages
    def _slots(self, pages: PageIds) -> SlotArray:
        return page_slots(pages, self.page_size)

    def _pages_of(self, slots: SlotArray) -> PageIds:
        return slot_pages(slots, self.page_size)

    def _free_slots(self, runs: list[SlotArray]) -> None:
        """The tree's frees (evicted leaves, a hybrid tree's duplicate inserts): a free call each."""
        self.pool.free_each([self._pages_of(slots) for slots in runs])

    def _demand(self, num_tokens: int, decode: bool) -> tuple[int, int]:
        """(tokens to evict for, pages the need_sort merge test uses) for an allocation of
        ``num_tokens`` tokens for one request (SGLang's batch size 1):
        page 1: alloc_token_slots -> (n, n); paged decode: alloc_paged_token_slots_decode and
        alloc_decode -> (page_size, bs); paged extend: alloc_paged_token_slots_extend and
        alloc_extend -> (n + bs * page_size, n // page_size + bs + 1)."""
        p = self.page_size
        if p == 1:
            return num_tokens, num_tokens
        if decode:
            return p, 1
        return num_tokens + p, num_tokens // p + 2

    def _can_take(self, num_pages: int, admit: bool, bonus: int = 0) -> bool:
        """Whether evicting every unlocked entry would give ``num_pages`` pages (and, ``admit``,
        a new request's part of the component; ``bonus``: its pages the step frees first).
        SGLang would evict and then fail the allocation with an out-of-memory error."""
        if num_pages > self.pool.num_free + self.tree.evictable_size() // self.page_size:
            return False
        return self.component is None or self.component.can_take(num_pages, admit, bonus)

    def _take(self, live: ReqKV, num_pages: int, num_tokens: int, decode: bool) -> None:
        """SGLang's allocation of ``num_tokens`` tokens, ``num_pages`` new pages (maybe 0: a
        paged extend inside the last page still evicts for its demand and runs the merge test),
        which ``_can_take`` said fits: evict what each pool is short of the demand, take the
        pages onto the page table."""
        p = self.page_size
        demand, merge_if_over = self._demand(num_tokens, decode)
        short = (num_pages * p if self.page_granular else demand) - self.pool.num_free * p
        other = 0 if self.component is None else self.component.shortfall(demand)
        if short > 0 or other > 0:
            self.stats.evicted_tokens += self.tree.evict_for_alloc(max(0, short), other)[0]
        pages = self.pool.alloc(num_pages, merge_if_over=merge_if_over)
        assert pages is not None, "eviction made less room than its evictable sizes promised"
        live.pages.extend(pages)

    # ------------------------------------------------------------------ hooks
    def _index_version(self) -> int:
        return self.tree.version

    def _match(self, req: Request) -> TreeMatch:
        """``match_prefix`` of all its tokens but the last (the model computes that one)."""
        key = request_key(req)
        m = self.tree.match_prefix(key[: req.num_tokens - 1])
        return TreeMatch(
            self, req, req.num_tokens, m.length, self.tree.version, m.indices, m.last_node, key, m.full_hit
        )

    def _revalidate(self, match: Match) -> TreeMatch:
        """FULL alone: eviction takes leaves first, so the deepest node of the match that still
        holds its KV ends the part of the match that still holds; a reset leaves none. Added
        nodes do not extend it: SGLang admits with the match its scheduler took. With a
        component, a tombstone or a state gone can break the hit anywhere on its path: what
        still holds is what a fresh match finds (SGLang's scheduler re-matches every round)."""
        if self.component is not None:
            return self._match(match.request)
        m = cast(TreeMatch, match)
        node = m.last_node
        while node.evicted:
            assert node.parent is not None
            node = node.parent
        length, top = 0, node
        while top.parent is not None:
            length += len(top.key)
            top = top.parent
        if top is not self.tree.root_node:  # reset since: the whole old tree is gone
            node, length = self.tree.root_node, 0
        indices = m.indices[:length] if length else EMPTY_SLOTS
        return TreeMatch(self, m.request, m.num_tokens, length, self.tree.version, indices, node, m.key)

    def _admit(self, req: Request, num_new_tokens: int, match: Match) -> ReqKV | None:
        m = cast(TreeMatch, match)
        self.pool.end_group()  # the scheduler allocates after the last batch's group closed
        lock = self.tree.lock(m.last_node)  # first, so making room cannot evict our hit
        need = -(-(m.tokens + num_new_tokens) // self.page_size) - m.tokens // self.page_size
        if not self._can_take(need, admit=True):
            self.tree.unlock(lock)
            return None
        # [0, hit) tree pages (locked) | [hit, total) our own pages
        live = ReqKV(PageTable(self._pages_of(m.indices)), m.tokens, lock, req.num_tokens, key=m.key)
        if self.component is not None:
            self.stats.evicted_tokens += self.component.admit(req, live, m.full_hit)
        self._take(live, need, num_new_tokens, decode=False)
        if self.tree.learner is not None:
            key = request_key(req, m.key)[: req.num_tokens - 1]  # what _match looked up
            live.seen = self.tree.learn_admission(key, m.tokens, m.last_node)
        return live

    def _extend(self, req: Request, state: ReqKV, total_tokens: int) -> bool:
        live = state
        self.pool.end_group()
        decoding = req.num_computed_tokens >= live.prefill_end  # past what it was admitted with
        num_tokens = total_tokens - self.reserved_tokens(req)
        # SGLang's decode path allocates one token per request; more is an extend.
        decode = decoding and num_tokens == 1
        need = max(0, -(-total_tokens // self.page_size) - len(live.pages))
        component = self.component
        span = None if component is None else component.slide_span(req, live, decode)
        bonus = 0 if span is None else (span[1] - span[0]) // self.page_size
        if not self._can_take(need, admit=False, bonus=bonus):
            return False  # (SGLang would slide the window and then fail: retract)
        if component is not None and span is not None:
            component.free_span(live, span)
        self._take(live, need, num_tokens, decode)
        live.decoding = decoding
        return True

    def _commit(self, req: Request, state: ReqKV) -> None:
        """SGLang checkpoints after each extend (prefill chunk), not after a decode step:
        output tokens reach the tree at release."""
        if self.tree.disable or state.decoding or req.num_computed_tokens == 0:
            return
        self._checkpoint(req, state)

    def _commit_batch(self, records: list[LiveRequest[ReqKV]]) -> None:
        """As one ``_commit`` after another (a decoding request's does nothing). Where frees
        group (SWA), SGLang's process_batch_result_* opens one group for the batch's
        checkpoints and the releases of the requests that finish in it; ours stays open across
        the ``release`` calls that follow, until the next call that allocates or evicts. A
        middle prefill chunk is checkpointed outside any group (stash_chunked_request); ours
        does it first (SGLang: when the next batch is scheduled, after the group)."""
        if self.component is None or not self.component.free_groups:
            for live in records:
                if not live.state.decoding:
                    self._commit(live.request, live.state)
            return
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

    def _checkpoint(self, req: Request, live: ReqKV, finished: bool = False) -> None:
        """``checkpoint_into_tree(req, up_to=num_computed_tokens)``: the component's rules, or
        FULL's alone."""
        if self.component is None:
            self._checkpoint_full(req, live)
        else:
            self.stats.evicted_tokens += self.component.checkpoint(req, live, finished, self._insert)

    def _insert(self, live: ReqKV, key: RadixKey, params: InsertParams) -> TreeInsert:
        """A component's checkpoint insert of ``key`` (as stored: page-aligned, bigrams under
        EAGLE) with the request's slots: the page table re-pointed at the tree's pages past the
        protected prefix, the lock moved to where the key ends."""
        p, aligned = self.page_size, len(key)
        res = self.tree.insert_ending_at(key, self._slots(live.pages[: aligned // p]), params=params)
        path = self.tree.path_indices(res.node)
        assert len(path) == aligned, f"insert ended at {len(path)} of {aligned} tokens"
        live.pages[live.protected // p : aligned // p] = self._pages_of(path[live.protected :])
        live.lock = self.tree.relock(live.lock, res.node)
        live.protected = aligned
        return res

    def _checkpoint_full(self, req: Request, live: ReqKV) -> None:
        """SGLang's ``RadixCache.checkpoint(req, up_to=num_computed_tokens)`` (radix_cache.py).

        Insert the computed whole pages (``_insert_cache``; this stamps the path even when
        nothing is new), re-insert the prompt's whole pages with priority + 1 when output
        tokens follow them (``split_prompt``: the leaf splits at the prompt boundary, so
        eviction can drop the output without the prompt), free our duplicates of tree pages,
        re-match (stamping the path again), point the page table at the tree's pages and move
        the lock to the new last node."""
        p = self.page_size
        if live.key is None or len(live.key) < req.num_computed_tokens:
            live.key = request_key(req, live.key)
        raw = live.key[: req.num_computed_tokens]
        key = raw.maybe_to_bigram_view(self.is_eagle)[0].page_aligned(p)
        aligned = len(key)  # tokens (EAGLE: bigrams, one fewer than the raw tokens) whose KV goes in
        # [0, protected) is the tree's (the locked path): only the slots past it are handed over
        start = live.protected
        own = self._slots(live.pages[start // p : aligned // p])
        # The request's locked node lies on its key's path: both walks follow links down to it.
        cached, end, _ = self.tree.insert_ending_at(
            key, own, hit_from=live.hits_counted, along=live.lock.node, value_from=start
        )
        live.hits_counted = max(live.hits_counted, aligned)
        prompt = len(raw[: req.num_prompt_tokens].maybe_to_bigram_view(self.is_eagle)[0]) // p * p
        if 0 < prompt < aligned:
            lo = min(start, prompt)
            # the walk follows links down to the deepest node of ``end``'s path within the prompt
            above = end
            depth = aligned
            while depth > prompt:
                depth -= len(above.key)
                above = above.parent  # type: ignore[assignment]
            self.tree.insert(
                key[:prompt], own[: prompt - lo], priority=1, hit_from=prompt, along=above, value_from=lo
            )
        mine = live.pages[start // p : cached // p]
        # Past ``cached`` the tree holds our own slots (just inserted): only the duplicates'
        # slots are gathered.
        match = self.tree.match_prefix(key, along=end, indices_from=start, indices_to=cached)
        assert match.length == aligned, f"re-match found {match.length} of {aligned} inserted tokens"
        tree_pages = self._pages_of(match.indices)
        # Re-point at the tree's pages first; only then free our duplicate copies.
        live.pages[start // p : cached // p] = tree_pages
        self.pool.free(self._duplicates(mine, tree_pages))
        # SGLang unlocks the old node, then locks the new one; the old path is a prefix of the
        # new, so locking first ends in the same state without unindexing and re-indexing it.
        live.lock, live.protected = self.tree.relock(live.lock, match.last_node), aligned

    def _duplicates(self, mine: PageIds, tree_pages: PageIds) -> PageIds:
        """Of a checkpoint's pages for tokens the tree held already, ours that it did not take:
        all of them (HiCache's tree adopts some)."""
        return mine

    def _release(self, req: Request, state: ReqKV) -> None:
        """SGLang's ``release_kv_cache(req, tree, checkpoint=True)`` (common.py): checkpoint the
        computed tokens as a finished request, free the row's unshared computed part (the
        unaligned last page; the component's part first), unlock, then free the room allocated
        beyond the computed tokens. Each is its own free, so with need_sort=False at page size
        > 1 the unused room is reused first."""
        live = state
        p = self.page_size
        computed = req.num_computed_tokens
        if computed and not self.tree.disable:
            self._checkpoint(req, live, finished=True)
        if self.tree.learner is not None:
            self.tree.learn_release(live.lock.node, live.seen, req.num_prompt_tokens, req.num_output_tokens)
        written = -(-computed // p)
        own = live.pages[live.protected // p : written]
        self.pool.free(own if self.component is None else self.component.release(live, own))
        self.tree.unlock(live.lock)
        self.pool.free(live.pages[written:])

    def _evict(self, num_tokens: int) -> int:
        self.pool.end_group()
        freed = self.tree.evict(num_tokens)
        self.stats.evicted_tokens += freed
        return freed

    def evict_component(self, amount: int) -> int:
        """Drop unlocked data of the component (SWA tokens, Mamba states) of at least ``amount``
        units if there is that much (SGLang's ``evict(EvictParams(swa_num_tokens=...)`` /
        ``mamba_num=...)``); returns the units freed. ValueError without a component."""
        if isinstance(amount, bool) or not isinstance(amount, int) or amount < 0:
            raise ValueError(f"amount must be an int >= 0, got {amount!r}")
        if self.component is None:
            raise ValueError(f"radix over {self.config.model_layout.describe()} has no component to evict")
        self.pool.end_group()
        tokens, units = self.tree.evict_for_alloc(0, amount)
        self.stats.evicted_tokens += tokens
        return units

    def _reset(self) -> None:
        # no request is live: every page returns; the same tree, so its version keeps counting
        # (a match taken before the reset is revalidated after it)
        self.pool = self._new_pools()
        self.tree.reset()

    # ------------------------------------------------------------------ decode steps (plain_decode)
    def _page_table(self, req: Request, state: ReqKV) -> list[int]:
        return state.pages.tolist()

    def _calm(self) -> bool:
        """A decode step evicts nothing and merges nothing now: a page is free (SGLang's
        decode then has nothing to evict for) and no staged pages are due to merge."""
        return self.pool.num_free > 0 and not self.pool.would_merge(0, 1)

    def _extend_in_place(self, live: LiveRequest[ReqKV], total_tokens: int) -> bool:
        """A decode step inside the last page while calm: it only marks the request decoding
        (what ``_extend`` leaves: no page, nothing evicted, no merge)."""
        req, state = live.request, live.state
        if total_tokens != req.num_computed_tokens + 1 or req.num_computed_tokens < state.prefill_end:
            return False
        if not self.plain_decode or total_tokens > len(state.pages) * self.page_size or not self._calm():
            return False
        state.decoding = True
        return True

    def _extend_batch(
        self, records: list[LiveRequest[ReqKV]], num_new_tokens: int, evicted: list[tuple[int, int]]
    ) -> int:
        """One request after another, as the base does, except that a run of decode steps
        that each open a page takes its pages in one ``alloc`` while calm, front of the free
        list first, as the one-by-one allocations would (SGLang allocates the decode batch's
        ``out_cache_loc`` at once)."""
        if num_new_tokens != 1 or not self.plain_decode:
            return super()._extend_batch(records, num_new_tokens, evicted)
        k, count = 0, len(records)
        while k < count:
            run = self._page_opening_run(records, k, self.pool.num_ready)
            if run and self._calm():  # (none merges: a run stops at the ready pages)
                self._open_pages(records[k : k + run], reserve=True)
                k += run
                continue
            if not self._extend_one(k, records[k], 1, evicted):
                return k
            k += 1
        return count

    def _page_opening_run(self, records: list[LiveRequest[ReqKV]], start: int, limit: int) -> int:
        """How many records from ``start`` on (none if ``start``'s step does not; at most
        ``limit``, the pages ready in the free list, so no allocation of the run evicts or
        merges) are decode steps that each open one page: past the request's admission and
        its reservation, its next token is the first of a page it does not hold yet. (A loop
        of its own, with no call per record: at page size 1 it runs for every decode token.)"""
        p = self.page_size
        end = min(len(records), start + limit)
        k = start
        while k < end:
            live = records[k]
            computed, state = live.request.num_computed_tokens, live.state
            if computed < live.reserved or computed < state.prefill_end or computed != len(state.pages) * p:
                break
            k += 1
        return k - start

    def _decode_room(self, req: Request, state: ReqKV) -> int:
        """A decode step inside the last page takes no page; ``_in_place_now`` says when it
        changes nothing else. (Past the reservation it counts the pages ``take_decode_pages``
        appended, at page size 1 the only room there is.)"""
        if not state.decoding or not self.plain_decode:
            return 0
        return len(state.pages) * self.page_size - req.num_computed_tokens

    def _takes_decode_pages(self) -> bool:
        return self.plain_decode

    def _take_decode_pages(self, records: list[LiveRequest[ReqKV]], calm_after: bool) -> bool:
        """Page-opening decode steps taken as ``_extend_batch`` takes a run of them while calm
        (one allocation, front of the free list first), the reservations left to
        ``advance_in_place``; with ``calm_after`` a page stays ready for the in-place step after."""
        for live in records:
            if live.request.num_computed_tokens < live.state.prefill_end:
                raise ValueError(f"take_decode_pages of {live.request.request_id!r}, which is not decoding")
        if len(records) + calm_after > self.pool.num_ready or not self._calm():
            return False
        self._open_pages(records, reserve=False)  # (none merges: they fit in the ready pages)
        return True

    def _open_pages(self, records: list[LiveRequest[ReqKV]], reserve: bool) -> None:
        """A decode step that opens a page for each record, calm and within the ready pages:
        one allocation, front of the free list first, in order; ``reserve``: their reservations
        too (a deferred decoder's wait for ``advance_in_place``)."""
        pages = self.pool.alloc(len(records))
        assert pages is not None
        for opened, page in zip(records, pages.tolist(), strict=True):
            opened.state.pages.append(page)
            opened.state.decoding = True
            if reserve:
                opened.reserved += 1

    def _in_place_now(self) -> bool:
        """While calm (``_calm``: a page free, nothing staged to merge), as the in-place
        decode step of ``_extend_in_place`` requires."""
        return self._calm()

    # ------------------------------------------------------------------ accounting
    def usage(self) -> PageUsage:
        """The pages a request's tokens all need (SWA: the full pool's; the component's own:
        ``component_usage``)."""
        free = self.pool.num_free
        evictable = self.tree.evictable_size() // self.page_size
        return PageUsage(free, evictable, self.num_usable_pages() - free - evictable)

    def component_usage(self) -> PageUsage:
        """The component's pool (SWA pages, Mamba state slots), the same three ways."""
        if self.component is None:
            raise ValueError(f"radix over {self.config.model_layout.describe()} has no component")
        return self.component.usage()

    def num_usable_pages(self) -> int:
        return self.pool.num_pages - 1  # page 0 reserved

    def memory_in_use(self) -> int:
        """Pinned full pages, each a page of every full layer, and the component's units."""
        layout = self.config.model_layout
        full = self.usage().in_use * self.page_size * layout.count("full")
        return full if self.component is None else full + self.component.memory_in_use(layout)

    def check_invariants(self) -> None:
        super().check_invariants()
        try:
            self.pool.check()
            self.tree.check()
        except AssertionError as e:
            ensure(False, f"{type(self.tree).__name__}: {e}")
        tree_pages: list[int] = []
        for node in self.tree.iter_nodes():
            if node.value is None:  # host-only (HiCache): no device page
                continue
            pages = self._pages_of(node.value)
            whole = np.array_equal(self._slots(pages), node.value)
            ensure(whole, f"{node} holds slots that are not whole pages")
            tree_pages.extend(pages.tolist())
        tree_set = set(tree_pages)
        ensure(len(tree_set) == len(tree_pages), "a page is held by two tree nodes")
        ensure(0 not in tree_set, "the tree holds reserved page 0")
        self._check_request_pages(tree_set, set(self.pool.free_page_ids().tolist()))
        if self.component is not None:
            lives = {rid: record.state for rid, record in self._live.items()}
            self.component.check_requests(lives, tree_set)

    def _check_request_pages(self, tree_pages: set[int], free: set[int]) -> None:
        """Every usable page is free, the tree's, or one live request's own: a request's first
        ``protected`` tokens point at tree pages only."""
        p = self.page_size
        own: list[int] = []
        for rid, record in self._live.items():
            live = record.state
            shared = live.pages[: live.protected // p].tolist()
            ensure(set(shared) <= tree_pages, f"{rid!r} points at prefix pages the tree no longer holds")
            own.extend(x for x in live.pages[live.protected // p :].tolist() if x not in tree_pages)
        ensure(len(set(own)) == len(own), "a page is owned by two live requests (or twice by one)")
        ensure(0 not in own, "a request holds reserved page 0")
        ensure(not free & tree_pages and not free & set(own), "a free page is also held")
        usable = self.num_usable_pages()
        ensure(
            len(free) + len(tree_pages) + len(own) == usable,
            f"pages free {len(free)} + tree {len(tree_pages)} + requests {len(own)} != {usable} usable",
        )
