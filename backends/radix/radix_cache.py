"""RadixCache: the one radix tree over KV slot indices, pool-agnostic: SGLang 0.5.23's
``UnifiedTreeCore`` (``unified_cache/unified_tree_core.py``). One walk, split, insert, lock and
eviction serve every mix: FULL (the KV every token has) is the tree's own; another component
(components/: SWA or MAMBA) takes part through SGLang's ``TreeComponent`` hooks (below, named
as SGLang names them); HiCache's host copies are a subclass (hicache_tree.py).

The tree knows tokens and slot indices only; whoever owns the KV pool passes ``free_slots``,
called once per eviction phase with the slots of each leaf it took, in order (a free call each,
as SGLang frees leaf by leaf). Sizes are in tokens:
``evictable_size + protected_size == total_size()`` at all times (root excluded).

Time, ours: one ``clock`` reading per walk. A match stamps its path from the root to its best
node with it (SGLang: from that node up, each ancestor a tick older), an insert every node it
walks and the new leaf (SGLang: a tick each). Only the order of the stamps reaches an eviction
(no two nodes of one path are evictable leaves at once), so the recorded fixtures and the random
streams through the pinned SGLang agree with either.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
from prefixcache.backends.radix.events import RadixEventRecorder
from prefixcache.backends.radix.key import RadixKey
from prefixcache.backends.radix.swa_pool import SWAPagePool
from prefixcache.backends.radix.tree import ROOT_PRIORITY, SlotArray, TreeNode, iter_nodes

from prefixcache.eviction import (
    EvictionPolicy,
    LearnedReuse,
    admit,
    forget,
    has_ghost,
    keys_stay_fresh,
    make_index,
    make_policy,
    note_eviction,
)
from prefixcache.interface import KVGroup, PageUsage
from prefixcache.layout import ModelLayout
from prefixcache.pool import PageIds, PagePool, PageTable
from prefixcache.request import Request

EMPTY_SLOTS: SlotArray = np.empty(0, dtype=np.int64)
EvictionOrder = Callable[[list[TreeNode]], list[TreeNode]]


def _part(value: SlotArray, end: int, start: int, stop: int) -> SlotArray:
    """The slots of tokens [start, stop) among an edge's slots that end at token ``end``."""
    first = end - len(value)
    return value[max(start - first, 0) : min(stop, end) - first]


class MatchResult(NamedTuple):
    length: int  # tokens matched (whole pages) on device, up to ``last_node`` (device_prefix_len)
    indices: SlotArray  # their KV slots, in token order
    last_node: TreeNode  # deepest device node the component accepts (the root for none)
    full_hit: int  # tokens whose full KV matched (full_kv_hit_length), on device or (HiCache) host
    last_visited: TreeNode  # the deepest node the walk reached (HiCache: best_match_node)


class TreeInsert(NamedTuple):
    prefix_len: int  # tokens already cached (the caller frees its own slots there, or the component did)
    node: TreeNode  # where the key ends: a new leaf, or the node the walk ended on (the root: empty)
    exist: bool  # MAMBA: that node kept its own state (``mamba_exist``: the caller's slot was not taken)


class InsertParams(NamedTuple):
    prev_prefix_len: int = 0  # the inserter's tree-owned prefix: its slots there are the tree's
    swa_evicted_seqlen: int = 0  # SWA: the inserter freed the SWA KV of its first this many tokens
    mamba: int | None = None  # MAMBA: the state slot at the key's end (None: KV only)


class LockReceipt(NamedTuple):
    node: TreeNode
    swa_uuid: int | None  # SWA: where its lock's window ended (None: at the root, or no SWA)


@dataclass(slots=True)
class ReqKV:
    """A live request's KV, as SGLang keeps it on the ``Req`` (``req.kv``, ``req.lock``)."""

    pages: PageTable  # full-pool pages: [0, protected) the tree's, then the request's own
    protected: int  # cache_protected_len: leading tokens whose pages belong to the tree
    lock: LockReceipt  # held where its tree-owned prefix ends
    prefill_end: int  # tokens at admission: steps from there on are decode steps
    decoding: bool = False  # its last allocation was a decode step: no checkpoint after it
    hits_counted: int = 0  # tokens of its path already counted in hit_count (once per request)
    key: RadixKey | None = None  # request_key of its tokens when last built (they only grow)
    seen: float = 0.0  # lrp: the share of its prompt the cache would have hit with the ghost
    # SWA: swa_branching_seqlen (page-aligned; the full hit ran past the SWA-valid one there, and
    # the first checkpoint inserts only up to it, reviving the tombstones it crosses), and
    # swa_evicted_seqlen (the SWA of [0, this) freed by the request)
    branching: int | None = None
    swa_evicted: int = 0
    # MAMBA: its own state slot (mamba_pool_idx; 0 once donated), the slot its hit was copied
    # from (0: a fresh state), Marconi's shared-prefix junction to checkpoint at (0: none)
    state: int = 0
    cow_source: int = 0
    junction: int = 0


CheckpointInsert = Callable[[ReqKV, RadixKey, InsertParams], TreeInsert]


class TreeComponent(ABC):
    """A component's part in the tree's operations (SGLang's ``TreeComponent``); its sizes
    (``evictable`` / ``protected``) count its own units over the nodes holding its data. Its
    lock covers part of the FULL lock's path, so a node it locks is never an evictable leaf."""

    tree: RadixCache
    evictable: int
    protected: int

    @abstractmethod
    def reset(self) -> None:
        """Empty sizes and lists, at every reset (the root is new)."""

    @abstractmethod
    def create_match_validator(self) -> Callable[[TreeNode], bool]:
        """Asked of each node a match walks, in order: may the hit end there?"""

    @abstractmethod
    def refresh_lru(self, node: TreeNode) -> None:
        """A match ended at ``node`` (``refresh_lru`` at MATCH_END)."""

    @abstractmethod
    def redistribute_on_node_split(self, new: TreeNode, child: TreeNode) -> None:
        """Its share of a split's data (``new`` the upper part, ``child`` the lower)."""

    @abstractmethod
    def check_insert(self, params: InsertParams) -> None:
        """ValueError, before anything changes, for parameters it cannot take."""

    @abstractmethod
    def update_component_on_insert_overlap(
        self, node: TreeNode, start: int, incoming: SlotArray, params: InsertParams
    ) -> None:
        """An insert walked ``node`` (tokens from ``start``) with slots ``incoming`` for it: adopt
        what it holds no more and free the inserter's duplicates (past ``prev_prefix_len``)."""

    @abstractmethod
    def commit_insert_component_data(
        self, node: TreeNode, start: int, end: int, params: InsertParams, fresh: bool
    ) -> bool:
        """The insert ends at ``node``, a new leaf for tokens [start, end) if ``fresh``; returns
        ``TreeInsert.exist``."""

    @abstractmethod
    def acquire_component_lock(self, node: TreeNode) -> int | None:
        """Its lock for a request locked at ``node``; returns what ``LockReceipt.swa_uuid`` keeps."""

    @abstractmethod
    def release_component_lock(self, receipt: LockReceipt) -> None:
        """Undo ``acquire_component_lock`` (RuntimeError, changing nothing, if not held)."""

    @abstractmethod
    def on_delete_leaf(self, leaf: TreeNode, freed: list[int]) -> None:
        """Free its data of a leaf being deleted, counting its units in ``freed[1]``."""

    @abstractmethod
    def evict_component(self, amount: int, freed: list[int]) -> None:
        """Its own eviction phase, until ``freed[1]`` reaches ``amount`` or nothing is left."""

    @abstractmethod
    def check(self) -> None:
        """AssertionError unless its sizes and lists agree with the nodes."""

    # ------------------------------------------------------------------ the request side
    # UnifiedRadixCache's caching hooks and what the scheduler's allocation asks of the
    # component's pool, called by the adapter (backend.py) for every request.
    eviction_order: EvictionOrder | None = None  # an order for both phases (Marconi), or the policy's
    free_groups = False  # a batch's frees go back as one group (process_batch_result)
    slides_window = False  # a decode step may first free what slid out of a window (``slide_span``)

    @abstractmethod
    def new_pools(self) -> PagePool | SWAPagePool:
        """Its pools, empty (at construction and every reset); returns the pool a request's
        pages come from, whose free page counts full pages."""

    def can_take(self, num_pages: int, admit: bool, bonus: int = 0) -> bool:
        """Whether evicting all it can would give ``num_pages`` more pages (``admit``: and a new
        request's own part; ``bonus``: its pages the step frees first)."""
        return True

    def shortfall(self, demand: int) -> int:
        """Its units to evict for before an allocation of ``demand`` tokens."""
        return 0

    def admit(self, req: Request, live: ReqKV, full_hit: int) -> int:
        """A new request's own part, taken before its pages; returns full tokens evicted."""
        return 0

    def slide_span(self, req: Request, live: ReqKV, decode: bool) -> tuple[int, int] | None:
        """Tokens [lo, hi) whose pages in this pool the step frees first (``free_span``), or None."""
        return None

    def free_span(self, live: ReqKV, span: tuple[int, int]) -> None:
        """Free what ``slide_span`` named."""
        raise NotImplementedError(f"{type(self).__name__} names no span to free")

    @abstractmethod
    def checkpoint(self, req: Request, live: ReqKV, finished: bool, insert: CheckpointInsert) -> int:
        """``checkpoint_into_tree(req, up_to=num_computed_tokens)``, its rules around the inserts
        it makes through ``insert``; returns full tokens evicted."""

    def release(self, live: ReqKV, own: PageIds) -> PageIds:
        """A released request's own part; returns what of ``own`` the caller frees as usual."""
        return own

    def new_page_limit(self) -> int | None:
        """The most pages one allocation can take from its pool (None: the full pool's bound)."""
        return None

    @abstractmethod
    def usage(self) -> PageUsage:
        """Its pool's units: free / evictable / in use."""

    @abstractmethod
    def kv_group(self, layout: ModelLayout) -> KVGroup:
        """Its KV group (after the full one)."""

    @abstractmethod
    def page_table_row(self, live: ReqKV) -> list[int]:
        """The request's row of its group's page table."""

    @abstractmethod
    def memory_in_use(self, layout: ModelLayout) -> int:
        """Its pinned units, in layer-token units."""

    @abstractmethod
    def check_requests(self, lives: dict[str, ReqKV], tree_pages: set[int]) -> None:
        """InvariantError unless its pool and the live requests' parts (by id) agree;
        ``tree_pages``: the full-pool pages the tree holds (checked by the caller)."""


class RadixCache:
    def __init__(
        self,
        page_size: int = 1,
        *,
        disable: bool = False,
        is_eagle: bool = False,
        eviction_policy: str = "lru",
        free_slots: Callable[[list[SlotArray]], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        events: RadixEventRecorder | None = None,
        capacity: int | None = None,
        learns: bool = False,
        whole_leaves: bool = True,
        component: TreeComponent | None = None,
        order: EvictionOrder | None = None,
    ) -> None:
        """capacity: the most leaves the tree can hold (the pool's pages), for the policies with
        a ghost of that size (arc, s3fifo, lrp). learns: the owner feeds ``lrp`` each request's
        admission and release (``learn_admission``, ``learn_release``); only then may the
        policy be lrp. whole_leaves: SGLang evicts a victim leaf whole (True); False (ours, an
        ablation) splits it and evicts only the pages still asked for, from its end.
        component: the tree's other component (components/: SWA or MAMBA; None: FULL only).
        order: None for the policy's order, else a function putting the eviction candidates
        in eviction order (Marconi), asked at every step of both eviction phases."""
        self.page_size = page_size
        self.whole_leaves = whole_leaves
        self.disable = disable
        self.is_eagle = is_eagle  # keys become bigram views at match / insert (key.py)
        self.policy: EvictionPolicy = make_policy(eviction_policy, capacity, lookups=learns)
        self.learner = self.policy if isinstance(self.policy, LearnedReuse) else None
        # Only a policy with a ghost (arc, s3fifo, lrp) reads an edge's content id.
        self.ghosts = self.learner is not None or has_ghost(self.policy)
        self.free_slots = free_slots if free_slots is not None else (lambda runs: None)
        self.clock = clock
        # SGLang's ``kv_events`` recorder (None: off); set before the first reset, which it records.
        self.events = events
        self.component, self.order = component, order
        if component is not None:
            component.tree = self
        # Ours: changes whenever a match could find something else (a leaf added, a leaf
        # evicted, a reset), so a match taken earlier knows whether it still holds. Splits
        # change no match and do not count.
        self.version = 0
        self.reset()

    def reset(self) -> None:
        self.version += 1
        self.root_node = TreeNode(self.clock(), priority=ROOT_PRIORITY)
        self.root_node.lock_ref = 1  # forever: the root is never evicted nor counted
        self.evictable_size_ = 0
        self.protected_size_ = 0
        # SGLang re-heapifies every evictable leaf on each evict() call; we keep them sorted by
        # (policy priority, id) and update on each change, so evict pays only for what it pops.
        self._leaves = make_index(self.policy)
        self._leaf_entry: dict[int, tuple[Any, int, TreeNode]] = {}
        if self.component is not None:
            self.component.reset()
        if self.events is not None:
            self.events.record_all_cleared()

    # ------------------------------------------------------------------ sizes
    def evictable_size(self) -> int:
        return self.evictable_size_

    def protected_size(self) -> int:
        return self.protected_size_

    def total_size(self) -> int:
        if self.disable:
            return 0
        total, stack = 0, list(self.root_node.children.values())
        while stack:
            node = stack.pop()
            total += len(node.value) if node.value is not None else 0
            stack.extend(node.children.values())
        return total

    # ------------------------------------------------------------------ match / insert
    def match_prefix(
        self, key: RadixKey, along: TreeNode | None = None, indices_from: int = 0,
        indices_to: int | None = None,
    ) -> MatchResult:
        """Longest cached whole-page prefix of ``key`` that the component accepts (its validator
        asked of each node walked). Splits a node where the match ends inside it, stamps the
        path from the root to the hit's end (HiCache: to the end of its host-only part, which
        ``full_hit`` counts in); never locks, never counts a hit.

        along: a node the caller knows lies on ``key``'s path (its root-to-node tokens are a
        prefix of ``key``: a request's own locked node): the walk down to it follows parent
        links instead of comparing tokens, with the same stamps in the same order.
        indices_from, indices_to: the result's ``indices`` are the slots of tokens
        [indices_from, min(indices_to, length)) only (a caller that holds the other slots need
        not have them gathered again)."""
        key, _ = key.maybe_to_bigram_view(self.is_eagle)
        key = key.page_aligned(self.page_size)
        if self.disable or len(key) == 0:
            return MatchResult(0, EMPTY_SLOTS, self.root_node, 0, self.root_node)
        now = self.clock()
        accept = None if self.component is None else self.component.create_match_validator()
        node = self.root_node
        values: list[SlotArray] = []
        pos = 0
        end = len(key)
        stop = end if indices_to is None else min(indices_to, end)
        if along is not None:
            assert accept is None, "along: a FULL-only tree's walk"
            for child in self._path_from_root(along):
                value = child.value
                assert value is not None
                pos += len(value)  # a slot per token of its key
                if pos > indices_from and pos - len(value) < stop:
                    values.append(_part(value, pos, indices_from, stop))
            assert pos <= end, "along: the node's path is longer than the key"
            node = along
        best, best_pos, kept = node, pos, len(values)
        for child, n, diverged in self._walk(node, key, pos, end, now, stamp=False):
            node, pos = child, pos + n
            if child.value is not None:  # (None: HiCache's host-only tail, the rest of the path)
                if pos > indices_from and pos - n < stop:
                    values.append(_part(child.value, pos, indices_from, stop))
                if accept is None or accept(child):
                    best, best_pos, kept = child, pos, len(values)
            if diverged:
                break
        if self.component is not None:
            self.component.refresh_lru(best)
        self._stamp_path(best if self.component is not None else node, now)
        chunks = values[:kept]
        indices = np.concatenate(chunks) if chunks else EMPTY_SLOTS
        return MatchResult(best_pos, indices, best, pos, node)

    def _stamp_path(self, node: TreeNode | None, now: float) -> None:
        """A match's stamp: ``node`` and its ancestors, the root included."""
        while node is not None:
            node.last_access_time = now
            self._refresh(node)
            node = node.parent

    def _begin_insert(
        self, key: RadixKey, value: SlotArray | None, priority: int, value_from: int = 0
    ) -> tuple[RadixKey, np.ndarray, float]:
        """What every insert does first: the key as stored (bigram view, page-aligned), its slot
        indices (of tokens [value_from, len)) checked against it, the root stamped; returns
        (key, value, now)."""
        key, _ = key.maybe_to_bigram_view(self.is_eagle)
        key = key.page_aligned(self.page_size)
        if not 0 <= value_from <= len(key) or (value is None and value_from):
            raise ValueError(f"insert of {len(key)} tokens with slot indices from token {value_from}")
        value = np.asarray(key.token_ids if value is None else value, dtype=np.int64)[: len(key) - value_from]
        if len(value) != len(key) - value_from:
            raise ValueError(
                f"insert of {len(key)} tokens with only {len(value)} slot indices from token {value_from}"
            )
        now = self.clock()
        root = self.root_node
        root.last_access_time = now
        root.priority = max(root.priority, priority)
        return key, value, now

    def insert(
        self, key: RadixKey, value: SlotArray | None = None, priority: int = 0, hit_from: int = 0,
        along: TreeNode | None = None, value_from: int = 0, params: InsertParams | None = None,
    ) -> int:
        """Cache ``key`` (page-aligned) with slot indices ``value``; returns the length that was
        already cached (the caller frees its own slots for that range). Never overwrites.

        hit_from: nodes ending at or before this token were already counted for this request
        (a request inserts its growing prefix several times and counts once per node); pass
        len(key) to count nothing.
        along: as for ``match_prefix``, a node known to lie on ``key``'s path.
        value_from: ``value`` holds the slots of tokens [value_from, len) only, for a caller
        whose tokens before it are cached already (ValueError if any of them is not).
        params: the component's (``InsertParams``), which sees each node walked
        (``update_component_on_insert_overlap``, its slots) and the end
        (``commit_insert_component_data``).
        """
        return self.insert_ending_at(key, value, priority, hit_from, along, value_from, params)[0]

    def insert_ending_at(
        self, key: RadixKey, value: SlotArray | None = None, priority: int = 0, hit_from: int = 0,
        along: TreeNode | None = None, value_from: int = 0, params: InsertParams | None = None,
    ) -> TreeInsert:
        """``insert``, the node the inserted key ends at (the root for an empty key), which a
        caller's next walk of the same key can pass as ``along``, and the component's ``exist``."""
        if self.disable:
            return TreeInsert(0, self.root_node, False)
        component = self.component
        if component is not None:
            params = InsertParams() if params is None else params
            component.check_insert(params)
            assert along is None and value_from == 0, "along, value_from: a FULL-only tree's insert"
        key, value, now = self._begin_insert(key, value, priority, value_from)
        node = self.root_node
        pos = 0
        end = len(key)
        if along is not None:
            for child in self._path_from_root(along):
                # stamped as _descend stamps, updated as the walk below; re-sorted once, after
                # every field changed (a leaf's place is a function of the node)
                child.last_access_time = now
                if priority > child.priority:
                    child.priority = priority
                assert child.value is not None
                pos += len(child.value)  # a slot per token of its key
                if pos > hit_from:
                    self._count_hit(child)
                child.tail_tokens = end - pos
                self._refresh(child)
            assert pos <= end, "along: the node's path is longer than the key"
            node = along
        for child, n, _ in self._walk(node, key, pos, end, now):
            child.priority = max(child.priority, priority)
            if child.value is None:  # HiCache: a host-only node takes the inserter's fresh KV
                assert pos >= value_from, "a host-only node within the inserter's own prefix"
                self._unevict(child, value[pos - value_from : pos - value_from + n])
            if component is not None:
                assert params is not None
                component.update_component_on_insert_overlap(child, pos, value[pos : pos + n], params)
            pos += n
            if pos > hit_from:
                self._count_hit(child)
            child.tail_tokens = end - pos
            self._refresh(child)
            node = child
        fresh = pos < end
        if fresh:
            if pos < value_from:
                raise ValueError(f"insert: tokens [{pos}, {value_from}) are not cached and have no slots")
            node = self._new_leaf(node, key[pos:], value[pos - value_from :], now, priority, end > hit_from)
        if component is None:
            return TreeInsert(pos, node, False)
        assert params is not None
        return TreeInsert(pos, node, component.commit_insert_component_data(node, pos, end, params, fresh))

    def _count_hit(self, node: TreeNode) -> None:
        """An insert passed ``node``, past what its request counted already."""
        node.hit_count += 1

    def _unevict(self, node: TreeNode, fresh: SlotArray) -> None:
        """An insert passed a node holding no device KV: only HiCache's tree has such nodes."""
        raise AssertionError(f"{node} is linked without its KV")

    def _new_leaf(
        self, parent: TreeNode, key: RadixKey, value: SlotArray, now: float, priority: int, counted: bool
    ) -> TreeNode:
        """An insert's new leaf, its hit counted if ``counted``, admitted by the policy's ghost."""

        def admitted(leaf: TreeNode) -> None:
            leaf.hit_count = int(counted)
            if self.ghosts:
                admit(self.policy, leaf, self._content_id(leaf))

        return self._add_leaf(parent, key, value, now, priority, admitted)

    def _add_leaf(
        self, parent: TreeNode, key: RadixKey, value: SlotArray, now: float, priority: int,
        prepare: Callable[[TreeNode], None] | None = None,
    ) -> TreeNode:
        """A new leaf under ``parent`` holding ``key`` and its slots ``value`` (own copies: a
        view would keep the caller's whole arrays alive), filed, counted, indexed and reported.
        ``prepare`` runs before it is indexed (what the policy's key reads: hit count, ghost)."""
        leaf = TreeNode(now, priority=priority)
        leaf.parent = parent
        leaf.key = key.copy()
        leaf.value = value.copy()
        if prepare is not None:
            prepare(leaf)
        parent.children[leaf.key.child_key(self.page_size)] = leaf
        self.version += 1
        self.evictable_size_ += len(leaf.value)
        self._update_leaf_status(parent)
        self._update_leaf_status(leaf)
        if self.events is not None:
            self.events.record_store(leaf)
        return leaf

    def _path_from_root(self, node: TreeNode) -> list[TreeNode]:
        """The nodes from the root's child down to ``node`` (the root excluded), by parent
        links (each caller checks, as it walks them, that they fit in its key)."""
        path = []
        while node is not self.root_node:
            assert node.parent is not None, f"{node} is not in this tree"
            path.append(node)
            node = node.parent
        path.reverse()
        return path

    def _walk(
        self, node: TreeNode, key: RadixKey, pos: int, end: int, now: float, stamp: bool = True
    ) -> Iterator[tuple[TreeNode, int, bool]]:
        """``_descend`` edge after edge from ``node`` at ``key[pos]`` while tokens before ``end``
        remain, as long as a child matches: each (child, tokens matched, split)."""
        while pos < end:
            step = self._descend(node, key, pos, now, stamp)
            if step is None:
                return
            yield step
            node, pos = step[0], pos + step[1]

    def _descend(
        self, node: TreeNode, key: RadixKey, pos: int, now: float, stamp: bool = True
    ) -> tuple[TreeNode, int, bool] | None:
        """One edge down from ``node`` along ``key[pos:]`` (match and insert alike): the child,
        stamped ``now`` if ``stamp`` (an insert's walk; a match stamps its hit's path after),
        split where the match ends inside it, the tokens it matched, and whether it was split;
        None if no child starts with ``key[pos:]``."""
        rest = key[pos:]
        child = node.children.get(rest.child_key(self.page_size))
        if child is None:
            return None
        if stamp:
            child.last_access_time = now
            self._refresh(child)
        n = child.key.match(rest, self.page_size)
        diverged = n < len(child.key)  # the query ends or differs inside this edge
        if diverged:
            child = self._split_node(child, n, now)
        return child, n, diverged

    def _split_node(self, child: TreeNode, split_len: int, now: float) -> TreeNode:
        """parent -> new[:split_len] -> child[split_len:]; sizes unchanged; both parts stamped
        ``now``, the component's data redistributed. Returns new. (A host-only child, HiCache's,
        has no device slots: nor has the new node.)

        The new prefix node takes the child's creation time, as 0.5.23's UnifiedRadixCache
        splits (what its registry builds for a plain model); its older RadixCache gives the prefix
        a fresh one, which fifo / filo (and our s3fifo) would order differently."""
        assert child.parent is not None and 0 < split_len < len(child.key)
        new = TreeNode(now, priority=child.priority)
        new.creation_time = child.creation_time
        new.lock_ref = child.lock_ref
        new.hit_count = child.hit_count
        new.ghost_hit, new.policy_state = child.ghost_hit, child.policy_state
        new.reuse_class, new.credited = child.reuse_class, child.credited
        new.tail_tokens = child.tail_tokens + len(child.key) - split_len
        new.parent = child.parent
        new.key = child.key[:split_len]
        child.key = child.key[split_len:]
        if child.value is None:
            new.value = None
        else:
            new.value, child.value = child.value[:split_len].copy(), child.value[split_len:].copy()
        child.parent = new
        new.children = {child.key.child_key(self.page_size): child}
        new.parent.children[new.key.child_key(self.page_size)] = new
        child.last_access_time = now
        if self.component is not None:
            self.component.redistribute_on_node_split(new, child)
        self._refresh(child)  # its stamp, and a key that depends on the length (wlfu), changed
        return new

    # ------------------------------------------------------------------ lrp
    def learn_admission(self, key: RadixKey, matched: int, last_node: TreeNode) -> float:
        """lrp, as a request is admitted with the first ``matched`` tokens of ``key`` cached up to
        ``last_node``: each node of its hit is reused, and the ghost edges its key would take
        beyond the hit are credited (walking on from each one's own node). Returns the share
        of ``key`` (page-aligned) it would have hit with them."""
        assert self.learner is not None, "learn_admission: the policy is not lrp"
        key = key.maybe_to_bigram_view(self.is_eagle)[0].page_aligned(self.page_size)
        now = self.clock()
        node = last_node
        while node is not self.root_node and node.parent is not None:
            self.learner.reused(node, now)
            node = node.parent
        seen, parent_id = matched, last_node.id
        while seen < len(key):
            found = self.learner.take_ghost((parent_id, key[seen:].child_key(self.page_size)), now)
            if found is None:
                break
            parent_id, length = found
            seen += length
        return min(seen, len(key)) / len(key) if len(key) else 0.0

    def learn_release(self, node: TreeNode, seen: float, prompt_tokens: int, output_tokens: int) -> None:
        """lrp, as a request locked at ``node`` is released (before ``dec_lock_ref(node)``): its
        class is now known, and the nodes it alone still locks take it, as hashchain's blocks
        take it when their last reference goes."""
        assert self.learner is not None, "learn_release: the policy is not lrp"
        self.learner.classify(seen, prompt_tokens, output_tokens)
        while node is not self.root_node and node.parent is not None:
            if node.lock_ref == 1:
                self.learner.assign(node)
            node = node.parent

    # ------------------------------------------------------------------ locks
    def inc_lock_ref(self, node: TreeNode) -> int:
        """Pin ``node`` and its ancestors (root excluded). Returns the change in evictable size."""
        if self.disable:
            return 0
        if node.evicted:
            raise ValueError(f"inc_lock_ref on evicted {node}")
        delta = 0
        while node is not self.root_node:
            assert node.parent is not None, f"{node} is not in this tree"
            delta += self._pin(node)
            node = node.parent
        return delta

    def _pin(self, node: TreeNode) -> int:
        """One more lock on ``node``; returns the change in evictable size."""
        assert node.value is not None, f"{node} is not in this tree"
        node.lock_ref += 1
        if node.lock_ref > 1:
            return 0
        # only a count leaving 0 can take a node out of the leaf index
        self.evictable_size_ -= len(node.value)
        self.protected_size_ += len(node.value)
        self._update_leaf_status(node)
        return -len(node.value)

    def move_lock(self, old: TreeNode, new: TreeNode) -> int:
        """``inc_lock_ref(new)`` then ``dec_lock_ref(old)`` (a checkpoint moving a request's
        lock down its own path). Where ``old`` is ``new`` or an ancestor, the shared path's
        counts rise and fall by one without reaching 0 (``old`` is locked), so only the nodes
        below ``old`` change: one walk over them, not two over the whole path. Elsewhere, the
        two calls. Returns the change in evictable size."""
        if self.disable:
            return 0
        below = []
        node = new
        while node is not old:
            if node is self.root_node or node.parent is None:  # old is not on new's path
                return self.inc_lock_ref(new) + self.dec_lock_ref(old)
            below.append(node)
            node = node.parent
        if old is not self.root_node and old.lock_ref <= 0:
            raise RuntimeError(f"unbalanced dec_lock_ref: {old} is not locked")
        if new.evicted:
            raise ValueError(f"inc_lock_ref on evicted {new}")
        return sum(self._pin(node) for node in below)  # bottom up, as inc_lock_ref goes

    def lock(self, node: TreeNode) -> LockReceipt:
        """``inc_lock_ref(node)`` and the component's lock as it scopes it (none on the root)."""
        self.inc_lock_ref(node)
        if self.component is None or node is self.root_node:
            return LockReceipt(node, None)
        return LockReceipt(node, self.component.acquire_component_lock(node))

    def relock(self, receipt: LockReceipt, node: TreeNode) -> LockReceipt:
        """A request's lock moved to ``node`` (a checkpoint): ``move_lock`` on a FULL-only tree,
        ``unlock`` then ``lock`` on another, as SGLang."""
        if self.component is None:
            self.move_lock(receipt.node, node)
            return LockReceipt(node, None)
        self.unlock(receipt)
        return self.lock(node)

    def unlock(self, receipt: LockReceipt, swa_released: bool = False) -> None:
        """Undo ``lock``: the component's lock (unless ``swa_released``: SWA let go of it
        early), then the FULL lock."""
        if self.component is not None and receipt.node is not self.root_node and not swa_released:
            self.component.release_component_lock(receipt)
        self.dec_lock_ref(receipt.node)

    def dec_lock_ref(self, node: TreeNode) -> int:
        """Unpin what ``inc_lock_ref(node)`` pinned. Returns the change in evictable size.

        Raises RuntimeError (changing nothing) if a node on the path is not locked: SGLang lets
        the count go negative and the sizes drift; we refuse."""
        if self.disable:
            return 0
        path = []
        while node is not self.root_node:
            if node.parent is None or node.lock_ref <= 0:
                raise RuntimeError(f"unbalanced dec_lock_ref: {node} is not locked (or not in this tree)")
            path.append(node)
            node = node.parent
        delta = 0
        for node in path:
            assert node.value is not None
            node.lock_ref -= 1
            if node.lock_ref == 0:  # only a count reaching 0 can make a node an evictable leaf
                self.evictable_size_ += len(node.value)
                self.protected_size_ -= len(node.value)
                delta += len(node.value)
                self._update_leaf_status(node)
        return delta

    # ------------------------------------------------------------------ eviction
    def evict(self, num_tokens: int) -> int:
        """Free whole evictable leaves, lowest policy priority first, until ``num_tokens`` are
        freed (it may overshoot) or none is left; returns the tokens freed. Without
        ``whole_leaves`` a leaf longer than the pages still asked for is split first and only
        its end evicted."""
        return self.evict_for_alloc(num_tokens)[0]

    def evict_for_alloc(self, full_tokens: int, component: int = 0) -> tuple[int, int]:
        """The FULL phase (``evict``) for ``full_tokens`` tokens, then the component's for
        ``component`` of its units (SWA tokens, Mamba states), each counting what the other
        freed. Returns (full tokens, component units) freed. (SGLang's ``evict_for_alloc`` stops
        each phase once its pool gained the shortfall: the same stop, as a pool gains exactly
        what is freed.)"""
        if self.disable:
            return 0, 0
        freed = [0, 0]
        if full_tokens > 0:
            self._evict_full(full_tokens, freed)
        if self.component is not None and component > 0 and freed[1] < component:
            self.component.evict_component(component, freed)
        return freed[0], freed[1]

    def _evict_full(self, num_tokens: int, freed: list[int]) -> None:
        runs: list[SlotArray] = []  # each leaf's slots, freed after the walk in one call
        while freed[0] < num_tokens and self._leaves:
            if self.order is None:
                key, _, leaf = self._leaves[0]
            else:
                leaf = self.order([entry[2] for entry in self._leaves])[0]
                key = self._leaf_entry[leaf.id][0]
            if not self.whole_leaves:
                asked = -(-(num_tokens - freed[0]) // self.page_size) * self.page_size
                if len(leaf.key) > asked:  # the upper part stays, stamped as the leaf was
                    self._split_node(leaf, len(leaf.key) - asked, leaf.last_access_time)
                    key = self._leaf_entry[leaf.id][0]
            note_eviction(self.policy, key)
            self._evict_leaf(leaf, freed, runs)
        if runs:
            self.free_slots(runs)

    def _evict_leaf(self, leaf: TreeNode, freed: list[int], runs: list[SlotArray]) -> None:
        """The FULL phase's victim: deleted, its slots kept in ``runs`` for the phase's free."""
        if self.ghosts:
            content_id = self._content_id(leaf)
            forget(self.policy, leaf, content_id)
            if self.learner is not None:  # the ghost walks on from the edge's own node
                self.learner.evicted(leaf, content_id, (leaf.id, len(leaf.key)))
        assert leaf.value is not None
        runs.append(leaf.value)
        self._remove_leaf(leaf, freed)

    def delete_leaf(self, leaf: TreeNode, freed: list[int]) -> None:
        """Free an evictable leaf's KV, the component's and the full, and unlink it
        (``_delete_unbacked_device_leaf``), counting full tokens in ``freed[0]``."""
        assert leaf.value is not None
        value = leaf.value
        self._remove_leaf(leaf, freed)
        self.free_slots([value])

    def _remove_leaf(self, leaf: TreeNode, freed: list[int]) -> None:
        """``delete_leaf`` but the full slots' free: the caller frees them."""
        assert leaf.id in self._leaf_entry and leaf.value is not None
        if self.component is not None:
            self.component.on_delete_leaf(leaf, freed)
        freed[0] += len(leaf.value)
        self._delete_leaf(leaf)  # its parent joins the leaves if now unlocked and childless
        if self.events is not None:
            self.events.record_remove(leaf)

    def _delete_leaf(self, node: TreeNode) -> None:
        parent = node.parent
        assert parent is not None and node.value is not None and not node.children
        removed = parent.children.pop(node.key.child_key(self.page_size))
        assert removed is node, f"parent does not file {node} under its child key"
        self.version += 1
        self.evictable_size_ -= len(node.value)
        node.value = None
        self._update_leaf_status(node)
        self._update_leaf_status(parent)

    def _content_id(self, leaf: TreeNode) -> tuple:
        """What a ghost remembers an edge by (arc, s3fifo): its parent and first page, the branch
        it hangs from (siblings never share one). Not its length: a conversation's next turn
        re-inserts a longer edge on the same branch, and that is the content coming back."""
        assert leaf.parent is not None
        return (leaf.parent.id, leaf.key.child_key(self.page_size))

    def _is_evictable_leaf(self, node: TreeNode) -> bool:
        return not node.evicted and node.lock_ref == 0 and not node.children and node is not self.root_node

    def in_leaf_index(self, node: TreeNode) -> bool:
        """Whether ``node`` is a candidate of the FULL phase now (filed in the leaf index, as
        ``_is_evictable_leaf`` says it must be after every change)."""
        return node.id in self._leaf_entry

    def _update_leaf_status(self, node: TreeNode) -> None:
        entry = self._leaf_entry.pop(node.id, None)
        if entry is not None:
            self._leaves.remove(entry)
        if self._is_evictable_leaf(node):
            entry = (self.policy.priority(node), node.id, node)
            self._leaf_entry[node.id] = entry
            self._leaves.add(entry)

    def _refresh(self, node: TreeNode) -> None:
        """Re-sort ``node`` if it is an evictable leaf whose priority inputs just changed."""
        if node.id in self._leaf_entry:
            self._update_leaf_status(node)

    # ------------------------------------------------------------------ inspection
    def iter_nodes(self) -> list[TreeNode]:
        """Every node but the root, parents before children."""
        return iter_nodes(self.root_node)

    def path_indices(self, node: TreeNode) -> SlotArray:
        """The full slots of the tokens from the root to the end of ``node``."""
        chunks = []
        for child in self._path_from_root(node):
            assert child.value is not None
            chunks.append(child.value)
        return np.concatenate(chunks) if chunks else EMPTY_SLOTS

    def evictable_leaves(self) -> list[TreeNode]:
        """The evictable leaves in eviction order."""
        return [entry[2] for entry in self._leaves]

    def check(self) -> None:
        """AssertionError unless sizes, links, child keys, locks and the leaf index agree."""
        evictable = protected = 0
        expected_leaves: set[int] = set()
        for node in self.iter_nodes():
            parent = node.parent
            assert parent is not None and node.value is not None, f"{node} detached or evicted"
            assert len(node.value) == len(node.key) > 0, f"{node}: value length != key length"
            assert len(node.key) % self.page_size == 0, f"{node}: key not whole pages"
            ck = node.key.child_key(self.page_size)
            assert parent.children.get(ck) is node, f"{node} not filed under its child key {ck!r}"
            assert min(node.lock_ref, node.swa_lock, node.mamba_lock) >= 0, f"{node}: negative lock"
            if node.lock_ref > 0:
                protected += len(node.value)
                assert parent is self.root_node or parent.lock_ref > 0, f"{node} locked, its parent not"
            else:
                evictable += len(node.value)
            if self._is_evictable_leaf(node):
                expected_leaves.add(node.id)
        assert self.root_node.lock_ref == 1, "the root must stay locked exactly once"
        assert (evictable, protected) == (self.evictable_size_, self.protected_size_), (
            f"sizes drifted: counted evictable={evictable} protected={protected}, "
            f"kept {self.evictable_size_} / {self.protected_size_}"
        )
        assert set(self._leaf_entry) == expected_leaves, "evictable-leaf index != unlocked childless nodes"
        assert len(self._leaves) == len(self._leaf_entry), "leaf index and its sorted list disagree"
        fresh = keys_stay_fresh(self.policy)  # gdsf's keys read the inflation of their day
        for prio, nid, node in self._leaves:
            assert node.id == nid, f"{node}: filed under another id"
            assert not fresh or prio == self.policy.priority(node), f"{node}: stale eviction priority"
        if self.component is not None:
            self.component.check()

