"""MambaRadixPrefixCache: SGLang 0.5.23's radix cache for a Mamba / linear-attention hybrid
(``UnifiedRadixCache`` with the FULL + MAMBA components, no_buffer mode) driven the way its
scheduler drives it, plus Marconi's admission and eviction as options.

SGLang's request flow (no_buffer; ``mem_cache/common.py``, ``unified_radix_cache.py``,
``unified_cache/components/mamba.py``), in our hooks::

    lookup   match_prefix(all tokens but the last): cut to the deepest node holding a state
    allocate first: lock the match's node, take the request's own state slot (evicting one
             state if none is free) and copy the hit's state into it (copy-on-write), take
             KV slots (evicting leaves); later: KV slots for an extend or a decode step
    commit   after an extend (a prefill chunk), not after a decode step: checkpoint_into_tree
             unfinished: copy the request's state into a fresh slot (evicting one state if
             none is free), insert the computed tokens with it (an existing state wins and the
             copy is freed), free our duplicate KV, move the lock to the new node
    release  release_kv_cache(checkpoint=True): insert the computed tokens, donating the
             request's own state slot (freed instead if the node already had one), free the
             unused room, unlock

Pool sizes: mamba_pool.py (SGLang's ratio split). Marconi's eviction order: mamba_marconi.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import numpy as np
from prefixcache.backends.radix.adapter import RadixAdapter, TreeMatch
from prefixcache.backends.radix.components.mamba import MambaComponent, mamba_tree
from prefixcache.backends.radix.key import request_key
from prefixcache.backends.radix.mamba_marconi import marconi_order
from prefixcache.backends.radix.mamba_pool import DEFAULT_MAMBA_FULL_MEMORY_RATIO, mamba_pool_sizes
from prefixcache.backends.radix.radix_cache import InsertParams, LockReceipt
from prefixcache.backends.radix.tree import SlotArray, TreeNode

from prefixcache.config import CacheConfig
from prefixcache.interface import KVGroup, Match, PageUsage, ensure
from prefixcache.invariants import check_usage
from prefixcache.pool import PagePool, PageTable
from prefixcache.request import Request

ADMISSIONS = ("sglang", "marconi")
EVICTIONS = ("lru", "marconi")


@dataclass(slots=True)
class _Live:
    pages: PageTable  # [0, protected) tree slots, then the request's own (page size 1)
    protected: int  # cache_protected_len
    lock: LockReceipt  # its node holds the lock; path_indices(lock.node) == pages[:protected]
    state: int  # the request's own state slot (SGLang's req.kv.mamba_pool_idx); 0 once donated
    cow_source: int  # the state slot the hit was copied from (0: a fresh state)
    junction: int  # Marconi: shared-prefix length to checkpoint at (0: none pending)
    prefill_end: int
    decoding: bool = False


class MambaRadixPrefixCache(RadixAdapter[_Live]):
    """Radix cache for a layout of ("mamba", S) and ("full",) layers, SGLang 0.5.23 no_buffer.

    Contract for the model and the stateful tests (``kv_groups`` / ``page_tables``):

    - ``kv_groups()`` = (KVGroup("full", None, "full", 1, kv_tokens + 1, <full layers>),
      KVGroup("mamba", None, "mamba", 1, states + 1, <mamba layers>)). Slot 0 of each pool is
      the padding slot, never handed out.
    - ``page_tables(req)`` = [full, [s]]: ``full[t]`` is the KV slot of token t for every token
      of the reservation, ``s`` the request's own state slot: after the first ``allocate`` it
      holds the state after exactly the hit (``lookup(req).tokens``; copied from the hit's
      node, ``cow_source(req)``; a fresh zero state if the hit is 0) and, once the model has
      run, the state after exactly ``req.num_computed_tokens`` tokens. It stays the same slot
      for the request's whole life (0 if none).
    - A tree state slot (``TreeNode.mamba``) holds the state after exactly the tokens from the
      root to its node's end; a hit always ends at such a node (the state is exact only there).
      ``state_slots()`` lists them with their lengths.

    Page size 1 only (SGLang's no_buffer mode asserts it; extra_buffer is not reproduced); no
    sliding-window layers (a FULL + SWA + MAMBA tree is not reproduced). A release is taken as
    a finish (SGLang releases a preempted request without inserting it: we insert it too).

    Options: ``mamba_full_memory_ratio``, ``max_mamba_cache_size`` (SGLang's flags; pool sizes);
    ``mamba_admission`` "sglang" (a state at every prefill chunk end and at finish) or "marconi"
    (a state only at the shared-prefix junction and at finish); ``eviction_policy`` "lru"
    (SGLang) or "marconi" (score = recency + marconi_alpha x FLOPs saved per unit of memory, both
    min-max normalised over the candidates, lowest evicted first).
    """

    mamba: MambaComponent  # the tree's MAMBA component

    def __init__(
        self,
        config: CacheConfig,
        *,
        mamba_full_memory_ratio: float = DEFAULT_MAMBA_FULL_MEMORY_RATIO,
        max_mamba_cache_size: int | None = None,
        mamba_admission: str = "sglang",
        eviction_policy: str = "lru",
        marconi_alpha: float = 1.0,
        marconi_d_model: int = 4096,
        need_sort: bool = False,
        disable: bool = False,
        is_eagle: bool = False,
        kv_events: bool = False,
    ) -> None:
        """kv_events: SGLang's ``enable_kv_cache_events`` on its unified tree: BlockStored for
        each new leaf, BlockRemoved for each deleted node (a Mamba tombstone emits nothing),
        AllBlocksCleared at every reset (radix_cache.py)."""
        if not isinstance(config, CacheConfig):
            raise ValueError(f"config must be a CacheConfig, got {type(config).__name__}")
        layout = config.model_layout
        if not layout.count("mamba"):
            raise ValueError("MambaRadixPrefixCache needs a layout with ('mamba', S) layers")
        if layout.count("sliding_window"):
            raise ValueError("radix (Mamba): sliding-window + mamba layouts are not supported")
        if config.page_size != 1:
            raise ValueError(
                f"radix (Mamba): page_size must be 1, got {config.page_size} (SGLang's no_buffer "
                "mode asserts page_size == 1; its extra_buffer mode is not reproduced)"
            )
        if mamba_admission not in ADMISSIONS:
            raise ValueError(f"mamba_admission must be one of {ADMISSIONS}, got {mamba_admission!r}")
        if eviction_policy not in EVICTIONS:
            raise ValueError(f"eviction_policy must be one of {EVICTIONS}, got {eviction_policy!r}")
        if need_sort or disable:
            raise ValueError("radix (Mamba): need_sort=True and disable=True are not supported")
        if is_eagle:
            raise ValueError(
                "radix (Mamba): is_eagle=True has no bigram keys here: SGLang 0.5.23 drops it for a "
                "tree with a MAMBA component (UnifiedTreeCore: is_eagle and MAMBA not in components) "
                "and keys by tokens; pass is_eagle=False for what it does"
            )
        if not isinstance(marconi_alpha, (int, float)) or marconi_alpha < 0:
            raise ValueError(f"marconi_alpha must be a number >= 0, got {marconi_alpha!r}")
        if isinstance(marconi_d_model, bool) or not isinstance(marconi_d_model, int) or marconi_d_model < 1:
            raise ValueError(f"marconi_d_model must be a positive int, got {marconi_d_model!r}")
        super().__init__(config)
        self.sizes = mamba_pool_sizes(config, mamba_full_memory_ratio, max_mamba_cache_size)
        self.mamba_admission = mamba_admission
        self.eviction_policy = eviction_policy
        self.marconi_alpha = float(marconi_alpha)
        self.marconi_d_model = marconi_d_model
        self.full_layers = tuple(i for i, x in enumerate(layout.layers) if x.kind == "full")
        self.mamba_layers = tuple(i for i, x in enumerate(layout.layers) if x.kind == "mamba")
        self.state_units = sum(layout.layers[i].size or 0 for i in self.mamba_layers)
        self._new_pools()
        order = self._marconi_order if self.eviction_policy == "marconi" else None
        # One tree for the cache's life: its reset keeps the version counting, so a match
        # taken before a reset is revalidated after it (a new tree restarted the count).
        self.events = self._event_recorder(kv_events, False)
        self.mamba = MambaComponent(self._free_state)
        self.tree = mamba_tree(self._free_slots, self.mamba, order, events=self.events)

    def _new_pools(self) -> None:
        self.kv = PagePool(self.sizes.kv_tokens + 1)
        self.states = PagePool(self.sizes.states + 1)

    def _free_slots(self, runs: list[SlotArray]) -> None:
        self.kv.free_each(runs)

    def _free_state(self, slot: int) -> None:
        self.states.free([slot])

    # ------------------------------------------------------------------ layout
    def kv_groups(self) -> tuple[KVGroup, ...]:
        return (
            KVGroup("full", None, "full", 1, self.sizes.kv_tokens + 1, self.full_layers),
            KVGroup("mamba", None, "mamba", 1, self.sizes.states + 1, self.mamba_layers),
        )

    def page_tables(self, req: Request) -> list[list[int]]:
        live = self._live_record(req, "page_tables").state
        return [live.pages.tolist(), [live.state]]

    def cow_source(self, req: Request) -> int:
        """The tree state slot the live request's state was copied from at admission (0: none)."""
        return self._live_record(req, "cow_source").state.cow_source

    def state_slots(self) -> list[tuple[int, int]]:
        """(tokens from the root, state slot) of every tree node holding a state."""
        out = []
        for node in self.tree.iter_nodes():
            if node.mamba is not None:
                out.append((self._depth(node), node.mamba))
        return sorted(out)

    def _depth(self, node: TreeNode) -> int:
        n = 0
        while node.parent is not None:
            n += len(node.key)
            node = node.parent
        return n

    def _check_fits(self, req: Request, total_tokens: int) -> None:
        if total_tokens > req.num_tokens:
            super()._check_fits(req, total_tokens)
        if total_tokens > self.sizes.kv_tokens:
            raise ValueError(
                f"request {req.request_id!r} needs {total_tokens} tokens but the full KV pool "
                f"holds {self.sizes.kv_tokens} (Mamba hybrid: {self.sizes.states} state slots)"
            )

    def _marconi_order(self, nodes: list[TreeNode]) -> list[TreeNode]:
        return marconi_order(
            nodes,
            self._depth,
            n_linear=len(self.mamba_layers),
            n_full=len(self.full_layers),
            state_units=self.state_units,
            alpha=self.marconi_alpha,
            d_model=self.marconi_d_model,
        )

    # ------------------------------------------------------------------ room
    def _room_for_state(self) -> bool:
        """One free state slot, evicting one tree state (SGLang: evict_for_alloc mamba_num=1)
        if none is free; False if every state is locked."""
        if self.states.num_free == 0:
            if self.mamba.evictable == 0:
                return False
            self.stats.evicted_tokens += self.tree.evict_for_alloc(0, 1)[0]
        return self.states.num_free > 0

    def _take_kv(self, n: int) -> SlotArray | None:
        """``n`` KV slots, evicting leaves for the shortfall (alloc_token_slots); None if even
        evicting every unlocked leaf would not give them (then nothing is evicted)."""
        if n > self.kv.num_free + self.tree.evictable_size():
            return None
        short = n - self.kv.num_free
        if short > 0:
            self.stats.evicted_tokens += self.tree.evict(short)
        slots = self.kv.alloc(n)
        assert slots is not None
        return slots

    # ------------------------------------------------------------------ hooks
    def _admit(self, req: Request, num_new_tokens: int, match: Match) -> _Live | None:
        m = cast(TreeMatch, match)  # last_node: the deepest node holding a state (the root for none)
        lock = self.tree.lock(m.last_node)  # first: making room cannot evict our hit
        if self.states.num_free == 0 and self.mamba.evictable == 0:
            self.tree.unlock(lock)
            return None
        if num_new_tokens > self.kv.num_free + self.tree.evictable_size():
            self.tree.unlock(lock)
            return None
        ok = self._room_for_state()  # a tombstone or leaf deletion leaves the KV check true
        assert ok
        state = int(self.states.alloc(1)[0])  # type: ignore[index]
        slots = self._take_kv(num_new_tokens)
        assert slots is not None
        junction = 0
        if self.mamba_admission == "marconi" and m.tokens < m.full_hit < req.num_tokens:
            junction = m.full_hit  # a branch point with no state yet: checkpoint it
        pages = PageTable(np.concatenate([m.indices, slots]))
        return _Live(pages, m.tokens, lock, state, m.last_node.mamba or 0, junction, req.num_tokens)

    def _extend(self, req: Request, state: _Live, total_tokens: int) -> bool:
        live = state
        decoding = req.num_computed_tokens >= live.prefill_end
        need = total_tokens - len(live.pages)
        if need > 0:
            slots = self._take_kv(need)
            if slots is None:
                return False
            live.pages.extend(slots)
        live.decoding = decoding
        return True

    def _insert(self, req: Request, live: _Live, length: int, mamba: int | None) -> bool:
        """Insert the first ``length`` computed tokens with state slot ``mamba`` at their end;
        re-point the page table at the tree's slots and move the lock. True if the tree took
        the state (it had none there)."""
        key = request_key(req)[:length]
        own = live.pages[:length]
        res = self.tree.insert_ending_at(key, own, params=InsertParams(live.protected, mamba=mamba))
        path = self.tree.path_indices(res.node)
        assert len(path) == length, f"insert ended at {len(path)} of {length} tokens"
        if length > live.protected:
            live.pages[live.protected : length] = path[live.protected :]
            self.tree.unlock(live.lock)
            live.lock, live.protected = self.tree.lock(res.node), length
        return mamba is not None and not res.exist

    def _checkpoint(self, req: Request, live: _Live) -> None:
        """An unfinished request's (a release inserts with its own state: ``_release``)."""
        computed = req.num_computed_tokens
        if self.mamba_admission == "marconi":
            if live.junction and live.junction <= computed:
                # Marconi: the state at the junction (as if the prefill chunk ended there).
                slot = int(self.states.alloc(1)[0]) if self._room_for_state() else None  # type: ignore[index]
                if not self._insert(req, live, live.junction, slot) and slot is not None:
                    self._free_state(slot)
                live.junction = 0
            self._insert(req, live, computed, None)
            return
        # SGLang (_alloc_mamba_slot asserts a slot comes free; ours skips the checkpoint).
        if not self._room_for_state():
            return
        slot = int(self.states.alloc(1)[0])  # type: ignore[index]
        if not self._insert(req, live, computed, slot):
            self._free_state(slot)  # cleanup_after_caching_req: the tree kept its own

    def _release(self, req: Request, state: _Live) -> None:
        live = state
        computed = req.num_computed_tokens
        if computed and self._insert(req, live, computed, live.state):
            live.state = 0  # donated to the tree
        if live.state:
            self._free_state(live.state)
            live.state = 0
        self.kv.free(live.pages[live.protected : computed])
        self.tree.unlock(live.lock)
        self.kv.free(live.pages[computed:])

    def evict_states(self, num_states: int) -> int:
        """SGLang's evict(mamba_num=...): drop at least ``num_states`` unlocked states (fewer
        if not there). Returns the states dropped."""
        if isinstance(num_states, bool) or not isinstance(num_states, int) or num_states < 0:
            raise ValueError(f"num_states must be an int >= 0, got {num_states!r}")
        tokens, states = self.tree.evict_for_alloc(0, num_states)
        self.stats.evicted_tokens += tokens
        return states

    def _reset(self) -> None:
        self._new_pools()
        self.tree.reset()

    # ------------------------------------------------------------------ accounting
    def usage(self) -> PageUsage:
        """The full KV pool's slots (every token of a request needs one)."""
        free, evictable = self.kv.num_free, self.tree.evictable_size()
        return PageUsage(free, evictable, self.sizes.kv_tokens - free - evictable)

    def num_usable_pages(self) -> int:
        """The full KV pool's slots, which ``usage`` reports (``state_usage`` the states')."""
        return self.sizes.kv_tokens

    def memory_in_use(self) -> int:
        """Pinned KV slots (one per token in every full layer) and pinned state slots (one
        state of every Mamba layer each)."""
        layout = self.config.model_layout
        state_units = sum(layer.state_tokens or 0 for layer in layout.layers)
        return self.usage().in_use * layout.count("full") + self.state_usage().in_use * state_units

    def state_usage(self) -> PageUsage:
        free, evictable = self.states.num_free, self.mamba.evictable
        return PageUsage(free, evictable, self.sizes.states - free - evictable)

    def check_invariants(self) -> None:
        check_usage("KV", self.usage(), self.sizes.kv_tokens)
        check_usage("state", self.state_usage(), self.sizes.states)
        self.kv.check()
        self.states.check()
        try:
            self.tree.check()
        except AssertionError as e:
            ensure(False, f"mamba radix tree: {e}")
        tree_kv: list[int] = []
        tree_states: list[int] = []
        for node in self.tree.iter_nodes():
            tree_kv.extend(node.value.tolist())
            if node.mamba is not None:
                tree_states.append(node.mamba)
        kv_set, st_set = set(tree_kv), set(tree_states)
        ensure(
            len(kv_set) == len(tree_kv) and 0 not in kv_set, "a KV slot held twice (or slot 0) by the tree"
        )
        ensure(len(st_set) == len(tree_states) and 0 not in st_set, "a state slot held twice by the tree")
        own_kv: list[int] = []
        own_states: list[int] = []
        for rid, record in self._live.items():
            live, req = record.state, record.request
            ensure(rid == req.request_id, f"live entry {rid!r} holds request {req.request_id!r}")
            ensure(
                req.num_computed_tokens <= record.reserved <= len(live.pages),
                f"{rid!r}: computed {req.num_computed_tokens}, reserved {record.reserved}, "
                f"{len(live.pages)} slots",
            )
            # SGLang's acquire_component_lock skips the root: a request admitted with hit 0
            # holds no lock until its first checkpoint (or its release) moves it to a node.
            ensure(
                live.lock.node is self.tree.root_node or live.lock.node.mamba_lock > 0,
                f"{rid!r}: its node is not Mamba-locked",
            )
            ensure(
                np.array_equal(self.tree.path_indices(live.lock.node), live.pages[: live.protected]),
                f"{rid!r}: its protected prefix is not its locked node's path",
            )
            own_kv.extend(live.pages[live.protected :].tolist())
            ensure(live.state > 0, f"{rid!r} holds no state slot")
            own_states.append(live.state)
        ensure(
            len(set(own_kv)) == len(own_kv) and not set(own_kv) & kv_set and 0 not in own_kv,
            "a KV slot owned by two requests or by a request and the tree",
        )
        ensure(
            len(set(own_states)) == len(own_states) and not set(own_states) & st_set,
            "a state slot owned twice",
        )
        free_kv = set(self.kv.free_page_ids().tolist())
        free_st = set(self.states.free_page_ids().tolist())
        ensure(
            len(free_kv) + len(kv_set) + len(own_kv) == self.sizes.kv_tokens and not free_kv & kv_set,
            "KV slots free + tree + requests != the pool",
        )
        ensure(
            len(free_st) + len(st_set) + len(own_states) == self.sizes.states and not free_st & st_set,
            "state slots free + tree + requests != the pool",
        )
