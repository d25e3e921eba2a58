"""What every radix cache shares as it implements ``PrefixCache`` over a tree (backend.py:
dense and, by its subclass, HiCache; swa_backend.py; mamba_backend.py): slots <-> pages, the
index version and page table, SGLang's eviction demand, and the page-ownership invariants.

Pages: the trees store per-token slot indices (slot = page * page_size + offset, as SGLang's
paged allocator hands them out) while memory moves by whole pages; page 0 is reserved.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass
from typing import Protocol, TypeVar

import numpy as np
from prefixcache.backends.radix.events import RadixEventRecorder
from prefixcache.backends.radix.key import RadixKey, request_key
from prefixcache.backends.radix.radix_cache import RadixCache
from prefixcache.backends.radix.tree import SlotArray, TreeNode

from prefixcache.interface import Match, PrefixCache, ensure
from prefixcache.kv_event_sink import KVEventSink
from prefixcache.pool import PageIds, PageTable
from prefixcache.request import Request


def page_slots(pages: PageIds, page_size: int) -> SlotArray:
    """The slots of whole pages, in order."""
    if page_size == 1:
        return pages  # slot == page
    return (pages[:, None] * page_size + np.arange(page_size, dtype=np.int64)).reshape(-1)


def slot_pages(slots: SlotArray, page_size: int) -> PageIds:
    """Page ids of whole-page slot runs (slot // page_size at each page start). At page size 1
    that is ``slots`` itself, not a copy (every caller frees, compares or stores the ids into
    a page table at once; one that kept them would copy)."""
    if page_size == 1:
        return slots
    return slots[::page_size] // page_size  # type: ignore[no-any-return]


@dataclass(frozen=True, slots=True, eq=False)
class TreeMatch(Match):
    """``match_prefix``'s result for one request (SGLang keeps it on the ``Req``)."""

    indices: SlotArray  # KV slots of the matched tokens, in token order
    last_node: TreeNode  # deepest node of the hit (the root for none)
    key: RadixKey | None = None  # request_key(request), which the admitted request keeps
    full_hit: int = 0  # full_kv_hit_length: tokens whose full KV matched, past a component's rule


class _LiveState(Protocol):
    pages: PageTable  # [0, protected) the tree's pages, then the request's own
    protected: int  # cache_protected_len: leading tokens whose pages belong to the tree
    decoding: bool  # its last allocation was a decode step


S = TypeVar("S", bound=_LiveState)


class RadixAdapter(PrefixCache[S]):
    """The radix caches' common base: subclasses set ``tree``, the one tree of their mix."""

    name = "radix"
    tree: RadixCache
    events: RadixEventRecorder | None = None  # the recorder the tree reports to (kv_events)

    @property
    def kv_events(self) -> KVEventSink | None:
        """The tree's recorder (events.py), SGLang's ``take_events`` drains it; None when off."""
        return self.events

    def _slots(self, pages: PageIds) -> SlotArray:
        return page_slots(pages, self.page_size)

    def _pages_of(self, slots: SlotArray) -> PageIds:
        return slot_pages(slots, self.page_size)

    def _event_recorder(self, kv_events: bool, is_eagle: bool) -> RadixEventRecorder | None:
        """SGLang's ``enable_kv_cache_events``: a recorder for the tree to report to (events.py;
        needs msgspec), or None. Not with ``is_eagle`` (bigram-keyed pages, not modelled)."""
        if not isinstance(kv_events, bool):
            raise ValueError(f"kv_events must be a bool, got {kv_events!r}")
        if kv_events and is_eagle:
            raise ValueError("kv_events with is_eagle (bigram-keyed pages) is not modelled")
        return RadixEventRecorder(self.page_size) if kv_events else None

    def _index_version(self) -> int:
        return self.tree.version

    def _match(self, req: Request) -> TreeMatch:
        """``match_prefix`` of all its tokens but the last (the model computes that one)."""
        key = request_key(req)
        m = self.tree.match_prefix(key[: req.num_tokens - 1])
        return TreeMatch(
            self, req, req.num_tokens, m.length, self.tree.version, m.indices, m.last_node, key, m.full_hit
        )

    def _commit(self, req: Request, state: S) -> None:
        """SGLang checkpoints after each extend (prefill chunk), not after a decode step:
        output tokens reach the tree at release."""
        if self.tree.disable or state.decoding or req.num_computed_tokens == 0:
            return
        self._checkpoint(req, state)

    @abstractmethod
    def _checkpoint(self, req: Request, state: S) -> None:
        """``checkpoint_into_tree(req, up_to=num_computed_tokens)``: the mix's rules."""

    def _evict(self, num_tokens: int) -> int:
        freed = self.tree.evict(num_tokens)
        self.stats.evicted_tokens += freed
        return freed

    def _revalidate(self, match: Match) -> TreeMatch:
        """Look the request up again (SGLang's scheduler re-matches every waiting request each
        round): a tombstone, a demoted node or a state gone can break the old hit anywhere on
        its path, so what still holds is what a fresh match finds."""
        return self._match(match.request)

    def _page_table(self, req: Request, state: S) -> list[int]:
        return state.pages.tolist()

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

    def _check_request_pages(self, tree_pages: set[int], free: set[int], usable: int) -> None:
        """Every usable page (of the pool page tables point into) is free, the tree's, or one
        live request's own: a request's first ``protected`` tokens point at tree pages only."""
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
        ensure(
            len(free) + len(tree_pages) + len(own) == usable,
            f"pages free {len(free)} + tree {len(tree_pages)} + requests {len(own)} != {usable} usable",
        )
