"""RadixPrefixCache: the radix tree driven the way SGLang's scheduler drives it.

SGLang's request flow, in our hooks::

    lookup   match_prefix(all tokens but the last, whole pages)         (no lock, no count)
    allocate first: match, inc_lock_ref(last node), take pages (evicting unlocked leaves)
             later: take pages for an extend or a decode step
             Eviction demands are SGLang's (allocation.py): page size 1 ``alloc_token_slots``
             evicts for n tokens; a paged extend (``alloc_paged_token_slots_extend``) for
             n + page_size (it assumes each request needs a fresh page), a paged decode step
             (``alloc_paged_token_slots_decode``) for page_size; each evicts what is short of
             that after the free pages (``evict_to_free_tokens``), in whole leaves.
    commit   after an extend (not after a decode step), RadixCache.checkpoint: insert the
             computed whole pages, split at the prompt boundary, re-point the page table at
             the tree's slots, free our duplicates, re-match, move the lock to the new last node
    release  release_kv_cache(checkpoint=True): checkpoint every token whose KV exists, free
             the unaligned tail, unlock, free the unused room (three frees, in SGLang's order)

Pages: the tree stores per-token slot indices (slot = page * page_size + offset, as SGLang's
paged allocator hands them out) but memory moves by whole pages from the shared ``PagePool``.
Slot 0 (page 0) is reserved, as SGLang's padding slot.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import numpy as np
from prefixcache.backends.radix.adapter import RadixAdapter, TreeMatch
from prefixcache.backends.radix.key import RadixKey, request_key
from prefixcache.backends.radix.radix_cache import EMPTY_SLOTS, RadixCache
from prefixcache.backends.radix.tree import SlotArray, TreeNode

from prefixcache.config import CacheConfig
from prefixcache.interface import LiveRequest, Match, PageUsage, ensure
from prefixcache.pool import PageIds, PagePool, PageTable
from prefixcache.request import Request


@dataclass(slots=True)
class _Live:
    """A live request's view: SGLang keeps these on its ``Req``."""

    pages: PageTable  # [0, protected) tree pages, then the request's own pages
    protected: int  # cache_protected_len: leading tokens whose slots belong to the tree
    last_node: TreeNode  # holds the lock on the tree part
    hits_counted: int  # tokens of its path already counted in hit_count (once per request)
    prefill_end: int  # tokens it had at admission: steps from here on are decode steps
    decoding: bool = False  # the last allocation was a decode step: no checkpoint after it
    seen: float = 0.0  # lrp: the share of its prompt the cache would have hit with the ghost
    key: RadixKey | None = None  # request_key of its tokens when last built (they only grow)


EVICTION_GRANULARITIES = ("leaf", "page")


class RadixPrefixCache(RadixAdapter[_Live]):
    page_granular = False  # eviction_granularity="page" (the HiCache subclass keeps SGLang's)

    def __init__(
        self,
        config: CacheConfig,
        *,
        eviction_policy: str = "lru",
        disable: bool = False,
        clock: Callable[[], float] = time.monotonic,
        need_sort: bool = False,
        is_eagle: bool = False,
        kv_events: bool = False,
        eviction_granularity: str = "leaf",
    ) -> None:
        """need_sort: SGLang's allocator mode (prefixcache/pool.py); SGLang sets it only under
        prefill/decode disaggregation, so the default False is what a plain SGLang server does.
        is_eagle: SGLang's ``CacheInitParams.is_eagle`` (EAGLE speculative decoding): the tree
        is keyed by bigrams (key.py), so a request of n tokens reuses at most n - 2 and a
        checkpoint of c computed tokens caches the KV of c - 1 (whole pages).
        kv_events: SGLang's ``enable_kv_cache_events``: the tree records BlockStored /
        BlockRemoved / AllBlocksCleared where SGLang 0.5.23's does (events.py), drained by
        ``kv_events.take_events()`` (needs msgspec). Not with ``is_eagle`` (bigram pages, not modelled).
        eviction_granularity: "leaf" (SGLang: evict whole leaves for allocation.py's
        over-estimate of the demand) or "page" (ours, vLLM's granularity, an ablation switch of
        the decomposition study: evict the pages the allocation takes and no more, splitting a
        leaf to take them from its end). Not with kv_events."""
        if eviction_granularity not in EVICTION_GRANULARITIES:
            raise ValueError(f"eviction_granularity must be one of {EVICTION_GRANULARITIES}, "
                             f"got {eviction_granularity!r}")
        if kv_events and eviction_granularity != "leaf":
            raise ValueError("kv_events with eviction_granularity='page' (a split victim) is not modelled")
        self.page_granular = eviction_granularity == "page"
        if config.is_hybrid:
            raise ValueError(
                f"RadixPrefixCache is the dense cache; layout {config.model_layout.describe()} needs "
                "make_cache('radix', config), which picks SGLang's hybrid cache for it"
            )
        super().__init__(config)
        self.need_sort = need_sort
        self.is_eagle = is_eagle
        self.events = self._event_recorder(kv_events, is_eagle)
        self.pool = PagePool(config.num_pages, need_sort=need_sort, page_size=config.page_size)
        self.tree = self._new_tree(eviction_policy, clock, disable)

    def _new_tree(self, eviction_policy: str, clock: Callable[[], float], disable: bool) -> RadixCache:
        return RadixCache(
            self.page_size,
            disable=disable,
            is_eagle=self.is_eagle,
            eviction_policy=eviction_policy,
            free_slots=self._free_slots,
            clock=clock,
            # SGLang: a disabled tree records nothing
            events=None if disable else self.events,
            capacity=self.config.num_pages,
            learns=True,  # this adapter feeds lrp (learn_admission, learn_release)
            whole_leaves=not self.page_granular,
        )

    # ------------------------------------------------------------------ pool
    def _free_slots(self, runs: list[SlotArray]) -> None:
        """The tree's evicted leaves, a free call each (one check for them all)."""
        self.pool.free_each([self._pages_of(slots) for slots in runs])

    def _make_room(self, num_pages: int, demand_tokens: int) -> bool:
        """SGLang's ``evict_to_free_tokens(demand_tokens)`` before taking ``num_pages`` pages:
        evict unlocked leaves for what ``demand_tokens`` (the caller's over-estimate, as
        allocation.py computes it) exceeds the free tokens. False, evicting nothing, if even
        evicting every unlocked leaf would not give ``num_pages`` pages (SGLang would evict
        and then fail the allocation with an out-of-memory error)."""
        if num_pages > self.pool.num_free + self.tree.evictable_size() // self.page_size:
            return False
        short = self._shortfall(num_pages * self.page_size if self.page_granular else demand_tokens)
        if short > 0:
            self.stats.evicted_tokens += self.tree.evict(short)
        return True

    def _shortfall(self, demand_tokens: int) -> int:
        """Tokens SGLang evicts for before an allocation of ``demand_tokens`` (<= 0: none)."""
        return demand_tokens - self.pool.num_free * self.page_size

    # ------------------------------------------------------------------ hooks
    def _revalidate(self, match: Match) -> TreeMatch:
        """Eviction takes leaves first, so the deepest node of the match that still holds its
        KV ends the part of the match that still holds; a reset leaves none. Added nodes do
        not extend it: SGLang admits with the match its scheduler took."""
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

    def _admit(self, req: Request, num_new_tokens: int, match: Match) -> _Live | None:
        m = cast(TreeMatch, match)
        total = m.tokens + num_new_tokens
        self.tree.inc_lock_ref(m.last_node)  # first, so making room cannot evict our hit
        need = -(-total // self.page_size) - m.tokens // self.page_size
        demand, merge_if_over = self._demand(num_new_tokens, decode=False)
        if not self._make_room(need, demand):
            self.tree.dec_lock_ref(m.last_node)
            return None
        new_pages = self.pool.alloc(need, merge_if_over=merge_if_over)
        assert new_pages is not None
        # [0, hit) tree pages (locked) | [hit, total) our own pages
        pages = PageTable(np.concatenate([self._pages_of(m.indices), new_pages]))
        live = _Live(pages, m.tokens, m.last_node, 0, req.num_tokens, key=m.key)
        if self.tree.learner is not None:
            key = request_key(req, m.key)[: req.num_tokens - 1]  # what _match looked up
            live.seen = self.tree.learn_admission(key, m.tokens, m.last_node)
        return live

    def _extend(self, req: Request, state: _Live, total_tokens: int) -> bool:
        live = state
        decoding = req.num_computed_tokens >= live.prefill_end  # past what it was admitted with
        num_tokens = total_tokens - self.reserved_tokens(req)
        if num_tokens <= 0:
            live.decoding = decoding
            return True
        # SGLang's decode path allocates one token per request; more is an extend.
        decode = decoding and num_tokens == 1
        need = -(-total_tokens // self.page_size) - len(live.pages)
        demand, merge_if_over = self._demand(num_tokens, decode)
        # A paged extend inside the last page takes no page but still evicts for its demand
        # and runs the merge test, as SGLang's alloc_extend does.
        if not self._make_room(need, demand):
            return False
        new_pages = self.pool.alloc(need, merge_if_over=merge_if_over)
        assert new_pages is not None
        live.pages.extend(new_pages)
        live.decoding = decoding
        return True

    def _calm(self) -> bool:
        """A decode step evicts nothing and merges nothing now: a page is free (SGLang's
        decode then has nothing to evict for) and no staged pages are due to merge."""
        return self.pool.num_free > 0 and not self.pool.would_merge(0, 1)

    def _extend_in_place(self, live: LiveRequest[_Live], total_tokens: int) -> bool:
        """A decode step inside the last page while calm: it only marks the request decoding
        (what ``_extend`` leaves: no page, nothing evicted, no merge)."""
        req, state = live.request, live.state
        if total_tokens != req.num_computed_tokens + 1 or req.num_computed_tokens < state.prefill_end:
            return False
        if total_tokens > len(state.pages) * self.page_size or not self._calm():
            return False
        state.decoding = True
        return True

    def _extend_batch(
        self, records: list[LiveRequest[_Live]], num_new_tokens: int, evicted: list[tuple[int, int]]
    ) -> int:
        """One request after another, as the base does, except that a run of decode steps
        that each open a page takes its pages in one ``alloc`` while calm, front of the free
        list first, as the one-by-one allocations would (SGLang allocates the decode batch's
        ``out_cache_loc`` at once)."""
        if num_new_tokens != 1:
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

    def _page_opening_run(self, records: list[LiveRequest[_Live]], start: int, limit: int) -> int:
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

    def _decode_room(self, req: Request, state: _Live) -> int:
        """A decode step inside the last page takes no page; ``_in_place_now`` says when it
        changes nothing else. (Past the reservation it counts the pages ``take_decode_pages``
        appended, at page size 1 the only room there is.)"""
        if not state.decoding:
            return 0
        return len(state.pages) * self.page_size - req.num_computed_tokens

    def _takes_decode_pages(self) -> bool:
        return True

    def _take_decode_pages(self, records: list[LiveRequest[_Live]], calm_after: bool) -> bool:
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

    def _open_pages(self, records: list[LiveRequest[_Live]], reserve: bool) -> None:
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

    def _checkpoint(self, req: Request, live: _Live) -> None:
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
            key, own, hit_from=live.hits_counted, along=live.last_node, value_from=start
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
        self.tree.move_lock(live.last_node, match.last_node)
        live.last_node, live.protected = match.last_node, aligned

    def _duplicates(self, mine: PageIds, tree_pages: PageIds) -> PageIds:
        """Of a checkpoint's pages for tokens the tree held already, ours that it did not take:
        all of them (HiCache's tree adopts some)."""
        return mine

    def _commit_batch(self, records: list[LiveRequest[_Live]]) -> None:
        """As one ``_commit`` after another; a decode step's commit does nothing (below), so a
        decoding request is passed over without the call."""
        for live in records:
            if not live.state.decoding:
                self._commit(live.request, live.state)

    def _release(self, req: Request, state: _Live) -> None:
        """SGLang's ``release_kv_cache(req, tree, checkpoint=True)`` (common.py): checkpoint the
        computed tokens, free the row's unshared computed part (the unaligned last page), unlock,
        then free the room allocated beyond the computed tokens. Each is its own free, so with
        need_sort=False at page size > 1 the unused room is reused first."""
        live = state
        p = self.page_size
        computed = req.num_computed_tokens
        if computed and not self.tree.disable:
            self._checkpoint(req, live)
        if self.tree.learner is not None:
            self.tree.learn_release(live.last_node, live.seen, req.num_prompt_tokens, req.num_output_tokens)
        written = -(-computed // p)
        self.pool.free(live.pages[live.protected // p : written])
        self.tree.dec_lock_ref(live.last_node)
        self.pool.free(live.pages[written:])

    def _reset(self) -> None:
        # no request is live: every page returns
        self.pool = PagePool(self.config.num_pages, need_sort=self.need_sort, page_size=self.page_size)
        self.tree.reset()

    # ------------------------------------------------------------------ accounting
    def usage(self) -> PageUsage:
        free = self.pool.num_free
        evictable = self.tree.evictable_size() // self.page_size
        return PageUsage(free, evictable, self.config.num_usable_pages - free - evictable)

    def check_invariants(self) -> None:
        super().check_invariants()
        self.pool.check()
        try:
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
        free = set(self.pool.free_page_ids().tolist())
        self._check_request_pages(tree_set, free, self.config.num_usable_pages)
