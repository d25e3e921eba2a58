"""The MAMBA component (SGLang 0.5.23's ``unified_cache/components/mamba.py``, Python tree core),
page size 1, no HiCache, no sessions.

A node holds full-attention KV slots (``value``) and at most one recurrent-state slot
(``mamba``; None = tombstone: the KV is kept, the state at the node's end is not). The state of
a node is the model's recurrent state after exactly the tokens from the root to its end.

- match: the hit is cut back to the deepest node holding a state (the recurrent state is exact
  only there); only that node's state moves to the Mamba MRU end.
- locks: the full lock covers node -> root, the Mamba lock the node only.
- insert: a new leaf takes the state; an existing tombstone adopts it; an existing state wins
  (``exist``: the caller frees its slot). A split leaves the upper part a tombstone.
- eviction, after the core's FULL phase: walk the Mamba LRU from its old end (``order``'s, with
  one), skipping Mamba-locked nodes: an evictable leaf is deleted (KV and state), any other node
  tombstoned.
"""

from __future__ import annotations

import functools
import itertools
from collections import OrderedDict
from collections.abc import Callable

import numpy as np
from prefixcache.backends.radix.events import RadixEventRecorder
from prefixcache.backends.radix.key import request_key
from prefixcache.backends.radix.mamba_marconi import marconi_order
from prefixcache.backends.radix.mamba_pool import (
    DEFAULT_MAMBA_FULL_MEMORY_RATIO,
    MambaPoolSizes,
    mamba_pool_sizes,
)
from prefixcache.backends.radix.radix_cache import (
    CheckpointInsert,
    EvictionOrder,
    InsertParams,
    LockReceipt,
    RadixCache,
    ReqKV,
    TreeComponent,
)
from prefixcache.backends.radix.tree import SlotArray, TreeNode

from prefixcache.config import CacheConfig
from prefixcache.interface import KVGroup, PageUsage
from prefixcache.invariants import check_usage, ensure
from prefixcache.layout import ModelLayout
from prefixcache.pool import PageIds, PagePool
from prefixcache.request import Request

ADMISSIONS = ("sglang", "marconi")
EVICTIONS = ("lru", "marconi")


def mamba_tree(
    free_slots: Callable[[list[SlotArray]], None],
    mamba: MambaComponent,
    events: RadixEventRecorder | None = None,
) -> RadixCache:
    """The FULL + MAMBA tree (page size 1): ``free_slots`` takes the KV slots eviction and
    duplicate inserts free. Time counts walks."""
    return RadixCache(
        1, free_slots=free_slots, clock=itertools.count().__next__, events=events, component=mamba,
        order=mamba.eviction_order,
    )


class MambaComponent(TreeComponent):
    def __init__(
        self,
        states: PagePool,
        *,
        admission: str = "sglang",
        eviction_order: EvictionOrder | None = None,
        sizes: MambaPoolSizes | None = None,
    ) -> None:
        """states: the state pool (slot 0 the padding slot). admission: "sglang" (a state at
        every prefill chunk end and at finish) or "marconi" (only at the shared-prefix junction
        and at finish). eviction_order: Marconi's, or None for LRU. sizes: the pools' (for
        ``new_pools``)."""
        if admission not in ADMISSIONS:
            raise ValueError(f"mamba_admission must be one of {ADMISSIONS}, got {admission!r}")
        self.states = states
        self.admission = admission
        self.eviction_order = eviction_order
        self.sizes = sizes

    @classmethod
    def from_config(
        cls,
        config: CacheConfig,
        eviction_policy: str = "lru",
        is_eagle: bool = False,
        *,
        mamba_full_memory_ratio: float | None = None,
        max_mamba_cache_size: int | None = None,
        mamba_admission: str | None = None,
        marconi_alpha: float | None = None,
        marconi_d_model: int | None = None,
    ) -> MambaComponent:
        """The component of a Mamba + full layout, SGLang 0.5.23's no_buffer mode, over pools
        sized as SGLang sizes them (mamba_pool.py; SGLang's --mamba-full-memory-ratio and
        --max-mamba-cache-size). ``eviction_policy`` "lru" (SGLang) or "marconi"
        (mamba_marconi.py: recency + ``marconi_alpha`` x FLOPs saved per unit of memory)."""
        layout = config.model_layout
        if layout.count("sliding_window"):
            raise ValueError("radix (Mamba): sliding-window + mamba layouts are not supported")
        if config.page_size != 1:
            raise ValueError(
                f"radix (Mamba): page_size must be 1, got {config.page_size} (SGLang's no_buffer "
                "mode asserts page_size == 1; its extra_buffer mode is not reproduced)"
            )
        if eviction_policy not in EVICTIONS:
            raise ValueError(f"eviction_policy must be one of {EVICTIONS}, got {eviction_policy!r}")
        if is_eagle:
            raise ValueError(
                "radix (Mamba): is_eagle=True has no bigram keys here: SGLang 0.5.23 drops it for a "
                "tree with a MAMBA component (UnifiedTreeCore: is_eagle and MAMBA not in components) "
                "and keys by tokens; pass is_eagle=False for what it does"
            )
        alpha = 1.0 if marconi_alpha is None else marconi_alpha
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or alpha < 0:
            raise ValueError(f"marconi_alpha must be a number >= 0, got {alpha!r}")
        d_model = 4096 if marconi_d_model is None else marconi_d_model
        if isinstance(d_model, bool) or not isinstance(d_model, int) or d_model < 1:
            raise ValueError(f"marconi_d_model must be a positive int, got {d_model!r}")
        ratio = mamba_full_memory_ratio
        sizes = mamba_pool_sizes(config, DEFAULT_MAMBA_FULL_MEMORY_RATIO if ratio is None else ratio,
                                 max_mamba_cache_size)
        admission = "sglang" if mamba_admission is None else mamba_admission
        mamba = cls(PagePool(sizes.states + 1), admission=admission, sizes=sizes)
        if eviction_policy == "marconi":
            linear = [layer for layer in layout.layers if layer.kind == "mamba"]
            mamba.eviction_order = functools.partial(
                marconi_order, depth=mamba.depth, n_linear=len(linear), n_full=layout.count("full"),
                state_units=sum(layer.size or 0 for layer in linear), alpha=float(alpha), d_model=d_model,
            )
        return mamba

    def free_state(self, slot: int) -> None:
        self.states.free([slot])

    def depth(self, node: TreeNode) -> int:
        """Tokens from the root to the end of ``node``."""
        n = 0
        while node.parent is not None:
            n += len(node.key)
            node = node.parent
        return n

    def reset(self) -> None:
        self.evictable = self.protected = 0
        # Mamba LRU: every node holding a state, least recently used first.
        self.lru: OrderedDict[int, TreeNode] = OrderedDict()

    def _set_state(self, node: TreeNode, slot: int) -> None:
        assert node.mamba is None
        node.mamba = slot
        self.lru[node.id] = node  # MRU end
        if node.mamba_lock:
            self.protected += 1
        else:
            self.evictable += 1

    def _drop_state(self, node: TreeNode) -> None:
        assert node.mamba is not None and node.mamba_lock == 0
        self.free_state(node.mamba)
        node.mamba = None
        del self.lru[node.id]
        self.evictable -= 1

    # ------------------------------------------------------------------ match / insert
    def create_match_validator(self) -> Callable[[TreeNode], bool]:
        return lambda node: node.mamba is not None

    def refresh_lru(self, node: TreeNode) -> None:
        if node.mamba is not None:
            self.lru.move_to_end(node.id)

    def redistribute_on_node_split(self, new: TreeNode, child: TreeNode) -> None:
        """Nothing moves: the upper part is a tombstone (the state is the child's end's)."""

    def check_insert(self, params: InsertParams) -> None:
        """Any state slot (or none) is taken."""

    def update_component_on_insert_overlap(
        self, node: TreeNode, start: int, incoming: SlotArray, params: InsertParams
    ) -> None:
        """The inserter's slots past its own prefix are duplicates: freed, in walk order."""
        dup_start = max(0, params.prev_prefix_len - start)
        if dup_start < len(incoming):
            self.tree.free_slots([incoming[dup_start:]])

    def commit_insert_component_data(
        self, node: TreeNode, start: int, end: int, params: InsertParams, fresh: bool
    ) -> bool:
        """The state ``params.mamba`` (None: KV only, ours for Marconi's admission; SGLang always
        passes one) goes to a new leaf or a tombstone; an existing state wins."""
        mamba = params.mamba
        if fresh:
            if mamba is not None:
                self._set_state(node, mamba)
            return False
        if node is self.tree.root_node or mamba is None:
            return node.mamba is not None
        if node.mamba is None:  # (the insert's walk stamped it, as SGLang's commit does)
            self._set_state(node, mamba)
            self.tree.version += 1  # a match can now reach further
            return False
        self.lru.move_to_end(node.id)
        return True

    # ------------------------------------------------------------------ locks
    def acquire_component_lock(self, node: TreeNode) -> int | None:
        """The node only."""
        if node.mamba_lock == 0 and node.mamba is not None:
            self.evictable -= 1
            self.protected += 1
        node.mamba_lock += 1
        return None

    def release_component_lock(self, receipt: LockReceipt) -> None:
        node = receipt.node
        if node.mamba_lock <= 0:
            raise RuntimeError(f"unbalanced dec_lock_ref on {node}")
        if node.mamba_lock == 1 and node.mamba is not None:
            self.evictable += 1
            self.protected -= 1
        node.mamba_lock -= 1

    # ------------------------------------------------------------------ eviction
    def on_delete_leaf(self, leaf: TreeNode, freed: list[int]) -> None:
        if leaf.mamba is not None:
            self._drop_state(leaf)
            freed[1] += 1

    def evict_component(self, amount: int, freed: list[int]) -> None:
        holders = list(self.lru.values())
        if self.tree.order is not None:
            holders = self.tree.order([n for n in holders if not n.mamba_lock])
        for node in holders:
            if freed[1] >= amount:
                break
            if node.id not in self.lru or node.mamba_lock:
                continue
            if self.tree.in_leaf_index(node):
                self.tree.delete_leaf(node, freed)
            else:
                self._drop_state(node)  # internal (or full-locked): tombstone
                self.tree.version += 1
                freed[1] += 1

    # ------------------------------------------------------------------ the request side
    def new_pools(self) -> PagePool:
        assert self.sizes is not None, "new_pools: a component made without its pool sizes"
        self.states = PagePool(self.states.num_pages)
        return PagePool(self.sizes.kv_tokens + 1)

    def take_state(self) -> tuple[int, int]:
        """A free state slot, evicting one tree state (``evict_for_alloc(mamba_num=1)``) if none
        is free: (the slot, 0 if every state is locked; full tokens the eviction freed)."""
        evicted = 0
        if self.states.num_free == 0:
            if self.evictable == 0:
                return 0, 0
            evicted = self.tree.evict_for_alloc(0, 1)[0]
        if self.states.num_free == 0:
            return 0, evicted
        return int(self.states.alloc(1)[0]), evicted  # type: ignore[index]

    def can_take(self, num_pages: int, admit: bool, bonus: int = 0) -> bool:
        """A new request needs a state slot: a free one or one to evict."""
        return not admit or self.states.num_free > 0 or self.evictable > 0

    def admit(self, req: Request, live: ReqKV, full_hit: int) -> int:
        """The request's own state slot (a copy of its hit's: copy-on-write), taken before its
        KV; with Marconi's admission, a branch point past the hit with no state is noted."""
        slot, evicted = self.take_state()
        assert slot, "can_take promised a state slot"
        live.state, live.cow_source = slot, live.lock.node.mamba or 0
        if self.admission == "marconi" and live.protected < full_hit < req.num_tokens:
            live.junction = full_hit  # a branch point with no state yet: checkpoint it
        return evicted

    def checkpoint(self, req: Request, live: ReqKV, finished: bool, insert: CheckpointInsert) -> int:
        """Unfinished: a copy of the request's state in a fresh slot goes in with the computed
        tokens (an existing state wins and the copy is freed); finished: its own slot goes in
        (freed at release if the node has one)."""
        computed = req.num_computed_tokens
        if finished:
            if self._insert(req, live, computed, live.state, insert):
                live.state = 0  # donated to the tree
            return 0
        if self.admission == "marconi":
            evicted = 0
            if live.junction and live.junction <= computed:
                # Marconi: the state at the junction (as if the prefill chunk ended there).
                slot, evicted = self.take_state()
                if not self._insert(req, live, live.junction, slot or None, insert) and slot:
                    self.free_state(slot)
                live.junction = 0
            self._insert(req, live, computed, None, insert)
            return evicted
        # SGLang (_alloc_mamba_slot asserts a slot comes free; ours skips the checkpoint).
        slot, evicted = self.take_state()
        if slot and not self._insert(req, live, computed, slot, insert):
            self.free_state(slot)  # cleanup_after_caching_req: the tree kept its own
        return evicted

    def _insert(
        self, req: Request, live: ReqKV, length: int, slot: int | None, insert: CheckpointInsert
    ) -> bool:
        """Its first ``length`` tokens with state ``slot`` at their end; True if the tree took it."""
        res = insert(live, request_key(req)[:length], InsertParams(live.protected, mamba=slot))
        return slot is not None and not res.exist

    def release(self, live: ReqKV, own: PageIds) -> PageIds:
        if live.state:
            self.free_state(live.state)
            live.state = 0
        return own

    def usage(self) -> PageUsage:
        free, usable = self.states.num_free, self.states.num_pages - 1
        return PageUsage(free, self.evictable, usable - free - self.evictable)

    def kv_group(self, layout: ModelLayout) -> KVGroup:
        layers = tuple(i for i, layer in enumerate(layout.layers) if layer.kind == "mamba")
        return KVGroup("mamba", None, "mamba", 1, self.states.num_pages, layers)

    def page_table_row(self, live: ReqKV) -> list[int]:
        return [live.state]

    def memory_in_use(self, layout: ModelLayout) -> int:
        """Pinned state slots, one state of every Mamba layer each."""
        return self.usage().in_use * sum(layer.state_tokens or 0 for layer in layout.layers)

    def state_slots(self) -> list[tuple[int, int]]:
        """(tokens from the root, state slot) of every tree node holding a state."""
        nodes = self.tree.iter_nodes()
        return sorted((self.depth(node), node.mamba) for node in nodes if node.mamba is not None)

    def check_requests(self, lives: dict[str, ReqKV], tree_pages: set[int]) -> None:
        """Also: a request's own KV slots (page size 1: pages) are none of the tree's."""
        check_usage("state", self.usage(), self.states.num_pages - 1)
        self.states.check()
        held = [node.mamba for node in self.tree.iter_nodes() if node.mamba is not None]
        tree_states = set(held)
        ensure(len(tree_states) == len(held) and 0 not in tree_states, "a state slot held twice by the tree")
        own: list[int] = []
        for rid, live in lives.items():
            # SGLang's acquire_component_lock skips the root: a request admitted with hit 0
            # holds no lock until its first checkpoint (or its release) moves it to a node.
            node = live.lock.node
            locked = node is self.tree.root_node or node.mamba_lock > 0
            ensure(locked, f"{rid!r}: its node is not Mamba-locked")
            ensure(
                np.array_equal(self.tree.path_indices(node), live.pages[: live.protected]),
                f"{rid!r}: its protected prefix is not its locked node's path",
            )
            own_kv = set(live.pages[live.protected :].tolist())
            ensure(not own_kv & tree_pages, f"{rid!r} owns a tree KV slot")
            ensure(live.state > 0, f"{rid!r} holds no state slot")
            own.append(live.state)
        ensure(len(set(own)) == len(own) and not set(own) & tree_states, "a state slot owned twice")
        free = set(self.states.free_page_ids().tolist())
        ensure(
            len(free) + len(tree_states) + len(own) == self.states.num_pages - 1 and not free & tree_states,
            "state slots free + tree + requests != the pool",
        )

    # ------------------------------------------------------------------ inspection
    def check(self) -> None:
        me = mp = 0
        holders = set()
        for node in self.tree.iter_nodes():
            assert node.lock_ref >= node.mamba_lock, f"{node}: Mamba lock without the full lock"
            if node.mamba is not None:
                holders.add(node.id)
                if node.mamba_lock:
                    mp += 1
                else:
                    me += 1
        root = self.tree.root_node
        assert root.mamba is None and not root.mamba_lock, "the root holds no state, no Mamba lock"
        assert (me, mp) == (self.evictable, self.protected), f"mamba sizes drifted {me, mp}"
        assert holders == set(self.lru), "Mamba LRU != nodes holding a state"
