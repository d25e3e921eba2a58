"""``HashChainCache``: vLLM v1's automatic prefix caching behind the PrefixCache contract.

The adapter only translates: lookup -> get_computed_blocks, allocate -> allocate_slots,
release -> free, reset -> reset_prefix_cache. vLLM caches full blocks when it allocates them,
so ``commit`` publishes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from prefixcache.backends.hashchain.block_match import BlockMatch
from prefixcache.backends.hashchain.hashing import KnownPromptHashes, get_hash_fn, group_id_suffix
from prefixcache.backends.hashchain.kv_cache_coordinator import KVCacheBlocks, UnitaryKVCacheCoordinator
from prefixcache.backends.hashchain.kv_cache_manager import KVCacheManager
from prefixcache.backends.hashchain.kv_cache_planning import (
    hybrid_block_size,
    partial_hash_hits_enabled,
    plan_kv_cache_groups,
    resolve_hash_block_size,
)
from prefixcache.backends.hashchain.mamba_chunking import MambaAlignedChunking
from prefixcache.backends.hashchain.offload.tier import DelayedCachingKVCacheManager, OffloadingTier
from prefixcache.backends.hashchain.single_type_kv_cache_manager import AttentionGroupSpec

from prefixcache.config import CacheConfig
from prefixcache.interface import KVGroup, LiveRequest, Match, PageUsage, PrefixCache, ensure
from prefixcache.kv_event_sink import KVEventSink
from prefixcache.request import Request
from prefixcache.tiers import HostTier, HostTierConfig

# vLLM 0.33's engine default (``CacheConfig.prefix_cache_retention_interval``, copied into the
# KVCacheConfig by kv_cache_planning.py): sliding-window groups hash only the window tails a
# hit can resume at. None is dense (the KVCacheConfig dataclass default, older vLLM).
ENGINE_DEFAULT_RETENTION_INTERVAL = 0


def _check_switches(
    config: CacheConfig, attention_groups: Sequence[object] | None, *, host_tier: HostTierConfig | None,
    host_ack_delay: int, kv_events: bool, use_eagle: bool, publish: str, dedupe: bool, unhashed_first: bool,
) -> None:
    """The option mixes ``HashChainCache`` refuses before building anything."""
    beside = config.is_hybrid or attention_groups is not None or host_tier is not None
    if (publish != "allocation" or dedupe is not False) and (beside or kv_events or use_eagle):
        # Not modelled: SGLang's publication and insert beside vLLM's groups, tier and events.
        raise ValueError("publish='commit' and dedupe=True are for a dense model without a "
                         "host_tier, kv_events or use_eagle")
    for name, value in (("unhashed_first", unhashed_first), ("kv_events", kv_events)):
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be a bool, got {value!r}")
    if use_eagle is True and host_tier is not None:
        # Not recorded against vLLM: the connector's external hit beside the EAGLE drop.
        raise ValueError("use_eagle with a host_tier is not supported")
    if host_tier is None and host_ack_delay != 0:
        raise ValueError("host_ack_delay without a host_tier")


@dataclass(frozen=True)
class KVCacheGroups:
    """vLLM's KV-cache groups for a config: each group's spec and model layers, the block size
    and pool blocks they share, the padding layers, and the layers one block id spans."""

    specs: list[AttentionGroupSpec]
    layers: list[tuple[int, ...]]
    block_size: int
    num_blocks: int
    num_padding_layers: int
    layers_per_block: int
    from_layout: bool  # formed from a hybrid layout's layers

    @classmethod
    def of(cls, config: CacheConfig, attention_groups: Sequence[object] | None) -> KVCacheGroups:
        """A hybrid layout forms vLLM's groups from its layers (kv_cache_planning.py) and sizes
        the pool from the layer-token budget; else one full-attention group of every layer, or
        the explicit ``attention_groups`` (no layers known) over ``config.num_pages``."""
        if not config.is_hybrid:
            groups = [("full",)] if attention_groups is None else list(attention_groups)
            if not groups:
                raise ValueError("attention_groups needs at least one group, e.g. [('full',)]")
            all_layers = tuple(range(config.model_layout.num_layers))
            return cls(
                [AttentionGroupSpec.parse(g) for g in groups],
                [all_layers if attention_groups is None else () for _ in groups],
                config.page_size, config.num_pages, 0,
                config.model_layout.num_layers if attention_groups is None else 1, False,
            )  # fmt: skip
        if attention_groups is not None:
            raise ValueError(
                "give either a hybrid config.layout or attention_groups=, not both "
                "(the layout forms vLLM's KV-cache groups itself)"
            )
        plan = plan_kv_cache_groups(config.model_layout)
        # vLLM raises the block so a page holds a Mamba state: pages are that many tokens.
        block_size = hybrid_block_size(config.model_layout, config.page_size)
        num_blocks = plan.num_blocks(config.layer_token_budget, block_size)
        if num_blocks < 2:
            raise ValueError(
                f"the layout's {len(plan.groups)} KV-cache groups of {plan.group_size} layers get "
                f"{num_blocks} block(s) from a budget of {config.layer_token_budget} layer-tokens; "
                "at least 2 are needed (block 0 is the null block)"
            )
        return cls(
            [g.spec for g in plan.groups], [g.layers for g in plan.groups], block_size, num_blocks,
            plan.num_padding_layers, plan.group_size, True,
        )  # fmt: skip

    @property
    def kinds(self) -> list[str]:
        return [g.kind for g in self.specs]

    @property
    def primary_group(self) -> int:
        """``page_table``'s group: group 0 (the explicit form, a plain model); from a layout
        the first full-attention group (vLLM may order a Mamba or window group first)."""
        return self.kinds.index("full") if self.from_layout and "full" in self.kinds else 0

    def kv_groups(self) -> tuple[KVGroup, ...]:
        return tuple(
            KVGroup(spec.kind, spec.sliding_window, "blocks", self.block_size, self.num_blocks, layers)
            for spec, layers in zip(self.specs, self.layers, strict=True)
        )

    def hash_block_sizes(self, prefix_match_unit: int | None, use_eagle: bool) -> tuple[int, int]:
        """(vLLM's scheduler block size, its hash block size) for ``--prefix-match-unit``,
        refusing the units we do not model."""
        scheduler_block_size, hash_block_size = resolve_hash_block_size(
            [self.block_size] * len(self.specs), prefix_match_unit
        )
        if partial_hash_hits_enabled(self.kinds, self.block_size, hash_block_size):
            # vLLM would hit inside a block here (copy-on-write of the Mamba state); we cannot.
            raise ValueError(
                "prefix_match_unit below the block size with Mamba and no sliding window enables "
                "vLLM's partial hits, which are not supported"
            )
        if use_eagle is True and hash_block_size != self.block_size:
            # vLLM 0.33's partial tail then reaches the whole prompt and EAGLE caches one block
            # past the aligned boundary (get_num_cacheable_tokens); we model neither.
            raise ValueError("use_eagle with a prefix_match_unit below the block size is not supported")
        return scheduler_block_size, hash_block_size


class HashChainCache(PrefixCache[KVCacheBlocks]):
    """Options (keywords of ``make_cache``; defaults = vLLM):

    hash_fn:        "sha256" | "sha256_cbor" | "xxhash" | "xxhash_cbor" | "builtin" (UNSAFE,
                    for cost comparisons only)
    free_order:     "reverse" (vLLM) | "forward": order in which a request's blocks are freed
    unhashed_first: True (vLLM): freed blocks without a hash go to the head of the free queue
    eviction_policy: "lru" (vLLM: the free queue's order) or any other name of
                    ``prefixcache.eviction_policies("hashchain")``: ranks the free cached leaf
                    blocks (ours, backends/hashchain/eviction.py)
    attention_groups: the explicit low-level form: KV-cache groups, e.g. [("full",),
                    ("sliding_window", 128)], over ``config.num_pages`` blocks. With neither
                    this nor a hybrid ``config.layout``: one full-attention group. A hybrid
                    layout instead forms vLLM's groups from the layers (kv_cache_planning.py)
                    and sizes the pool from ``config.layer_token_budget`` as vLLM does:
                    budget // (block_size x layers per group) blocks. Giving both is an error.
                    ``page_table`` shows group 0 (from a layout: the first full-attention
                    group), ``page_tables`` every group.
    prefix_cache_retention_interval: which sliding-window blocks get a hash (vLLM 0.33):
                    0 (default, vLLM's engine default): only the window tail at the replay
                    boundary (prompt - 1) and at a shared-prefix junction; None: every full
                    block (dense); k > 0 (a multiple of the block size): also one tail per k
                    tokens. Full-attention groups always hash every block.
    free_skipped_on_failure: False (ours, the contract: a failed allocate changes nothing) or
                    True (vLLM 0.33: a running request's out-of-window blocks are freed at
                    the start of every allocate, even one that then fails).
    prefix_match_unit: vLLM's ``--prefix-match-unit`` (= hash_block_size). Every group here
                    has the block size: with one group only it (or None) is valid; with
                    several, any divisor, and hits stay aligned to the block size. Where vLLM
                    would enable partial (sub-block) hits (a Mamba group, no sliding window)
                    it is a ValueError: we have no partial hits. Hashes are computed per
                    unit and a block keyed by its last unit's hash, as vLLM does (hits and
                    block ids are the same as with the unit = the block size).
    use_eagle:      False (default) or True: vLLM 0.33's ``KVCacheManager(use_eagle=True)``,
                    which the engine passes for an EAGLE/EAGLE3/MTP speculative_config with
                    lookahead block hashes off (``disable_lookahead_block_hashes`` or a KV
                    connector; with them on, 0.33's default, it passes False and hashes differ
                    instead, which we do not model). Every hit drops its last block: one
                    group (a plain model) hits floor((n - 1) / B) - 1 blocks of an n-token
                    request; hybrid groups look one block further and drop it, once per
                    candidate length; sliding-window runs need one block more, and sparse
                    retention keeps the tails one block later. Not with a Mamba group.

    kv_events:      False (default) or True: vLLM's ``enable_kv_cache_events``; the block pool
                    queues BlockStored / BlockRemoved / AllBlocksCleared where vLLM 0.33's does
                    (block_pool.py), drained by ``kv_events.take_events()`` (needs msgspec).
    host_tier:      a ``prefixcache.tiers.HostTierConfig``: vLLM 0.33's native CPU offloading
                    (OffloadingConnector + CPUOffloadingManager, offload/); dense layouts only.
                    None (default): no tier, the backend exactly as without one.
    host_ack_delay: steps a transfer takes beyond vLLM's fastest worker (0: a load is
                    acknowledged in its step, a store in the step after it is built).
    publish:        "allocation" (vLLM: a full block is cached when allocated, before its KV
                    exists) or "commit" (ours, SGLang's publication time: blocks are cached at
                    a prefill chunk's commit and, output included, at release; a decode step's
                    commit publishes nothing). An ablation switch of the decomposition study.
    dedupe:         False (vLLM keeps a duplicate block when a recomputed block's content is
                    cached already) or True (ours, SGLang's insert: the request takes the cached
                    block and its duplicate goes back to the pool at once). Ablation switch.
                    Both switches: a dense model, no host tier, no KV events, no EAGLE.
    known_prompt_hashes: None (default: every block hashed as vLLM does) or a source of
                    prompt block hashes computed before (``hashing.KnownPromptHashes``, e.g.
                    a trace's store, experiments/inputs/trace_hashes.py): the same hashes,
                    read instead of computed; a request it does not know is hashed as usual.

    A live request's state is its block list per group: the very lists the single-type
    managers keep in ``req_to_blocks`` (vLLM's owner of them), not copies.
    """

    name = "hashchain"

    def __init__(
        self, config: CacheConfig, *, hash_fn: str = "sha256", free_order: str = "reverse",
        unhashed_first: bool = True, attention_groups: Sequence[object] | None = None,
        eviction_policy: str = "lru",
        prefix_cache_retention_interval: int | None = ENGINE_DEFAULT_RETENTION_INTERVAL,
        prefix_match_unit: int | None = None, free_skipped_on_failure: bool = False,
        use_eagle: bool = False, kv_events: bool = False, host_tier: HostTierConfig | None = None,
        host_ack_delay: int = 0, known_prompt_hashes: KnownPromptHashes | None = None,
        publish: str = "allocation", dedupe: bool = False,
    ) -> None:  # fmt: skip
        super().__init__(config)
        _check_switches(config, attention_groups, host_tier=host_tier, host_ack_delay=host_ack_delay,
                        kv_events=kv_events, use_eagle=use_eagle, publish=publish, dedupe=dedupe,
                        unhashed_first=unhashed_first)  # fmt: skip
        self.hash_fn_name = hash_fn
        groups = self._take_groups(KVCacheGroups.of(config, attention_groups), prefix_match_unit, use_eagle)
        self.prefix_cache_retention_interval = prefix_cache_retention_interval
        self.manager = (KVCacheManager if host_tier is None else DelayedCachingKVCacheManager)(
            groups.num_blocks, groups.block_size, get_hash_fn(hash_fn), groups.specs, free_order=free_order,
            unhashed_first=unhashed_first, eviction_policy=eviction_policy,
            prefix_cache_retention_interval=prefix_cache_retention_interval,
            free_skipped_on_failure=free_skipped_on_failure, hash_block_size=self.hash_block_size,
            use_eagle=use_eagle, known_prompt_hashes=known_prompt_hashes, publish=publish, dedupe=dedupe,
            enable_kv_cache_events=kv_events,
        )  # fmt: skip
        # publish="commit": each live request's length at admission (later commits: decode steps)
        self._prefill_end: dict[str, int] | None = None if publish == "allocation" else {}
        self.use_eagle = use_eagle
        self.block_pool = self.manager.block_pool
        if "mamba" in groups.kinds:  # prefill chunks end on block boundaries
            self.prefill_chunking = MambaAlignedChunking(self.page_size, self.manager)
        self._evicted_seen = 0  # block_pool.num_evicted_blocks already in stats.evicted_tokens
        self.offload = None if host_tier is None else self._offloading_tier(host_tier, host_ack_delay)
        # _extend_in_place: only one group without a tier has steps allocate_slots skips at once
        unitary = isinstance(self.manager.coordinator, UnitaryKVCacheCoordinator)
        self._steps_in_place = self.offload is None and unitary

    def _take_groups(
        self, groups: KVCacheGroups, prefix_match_unit: int | None, use_eagle: bool
    ) -> KVCacheGroups:
        """The layout vLLM's planner gives the model: its groups, block and hash sizes."""
        self.attention_groups = groups.specs
        self.num_padding_layers = groups.num_padding_layers
        self._layers_per_block = groups.layers_per_block  # one block id = a page in each group layer
        self.page_size = groups.block_size
        sizes = groups.hash_block_sizes(prefix_match_unit, use_eagle)
        self.scheduler_block_size, self.hash_block_size = sizes
        self.primary_group = groups.primary_group  # page_table's group
        self._kv_groups = groups.kv_groups()
        return groups

    def _offloading_tier(self, host_tier: HostTierConfig, ack_delay: int) -> OffloadingTier:
        """The host tier: vLLM 0.33's OffloadingConnector over this cache's manager (offload/)."""
        return OffloadingTier(
            host_tier, self.manager, capacity_tokens=self.config.capacity_tokens, page_size=self.page_size,
            hash_block_size=self.hash_block_size, stats=lambda: self.stats, is_live=self.is_live,
            reserved_tokens=self.reserved_tokens, ack_delay=ack_delay,
        )  # fmt: skip

    # ---------------------------------------------------------------- hooks
    def _match(self, req: Request) -> BlockMatch:
        hit = self.manager.get_cache_hit(req)
        junction = self.manager.junction(hit)
        m = BlockMatch(self, req, req.num_tokens, hit.length, self._index_version(), hit.blocks, junction)
        return m if self.offload is None else self.offload.with_host_part(m)

    def _index_version(self) -> int:
        version = self.block_pool.cached_block_hash_to_block.version
        return version if self.offload is None else version + self.offload.version

    def _revalidate(self, match: Match) -> BlockMatch:
        """What still holds of the hit, and what was cached since: exactly a fresh lookup."""
        m = cast(BlockMatch, match)
        hit = self.manager.revalidate_computed_blocks(m.request, m.blocks)
        junction = self.manager.junction(hit)
        fresh = BlockMatch(
            self, m.request, m.num_tokens, hit.length, self._index_version(), hit.blocks, junction
        )
        return fresh if self.offload is None else self.offload.with_host_part(fresh)

    def _admit(self, req: Request, num_new_tokens: int, match: Match) -> KVCacheBlocks | None:
        m = cast(BlockMatch, match)
        # A waiting request has computed nothing (vLLM's invariant); put back whatever the
        # caller left there if we fail, so that a failed allocate changes nothing.
        prior = req.num_computed_tokens
        req.num_computed_tokens = 0
        if self.offload is not None:  # slots for the host part too, loaded now
            new_blocks = self.offload.allocate_slots(req, num_new_tokens, m)
        else:
            new_blocks = self.manager.allocate_slots(
                req, num_new_tokens, m.tokens, m.blocks, m.shared_prefix_boundary
            )
        self._sync_evictions()
        if new_blocks is None:
            req.num_computed_tokens = prior
            return None
        if self._prefill_end is not None:
            self._prefill_end[req.request_id] = req.num_tokens
        return self.manager.get_blocks(req.request_id)

    def whole_sequence_fits(self, req: Request, match: Match) -> bool:
        """vLLM 0.33 ``KVCacheManager.allocate_slots(full_sequence_must_fit=True)``: blocks for
        ``req.num_tokens`` beyond the GPU hit, plus the hit blocks a touch takes out of the free
        queue, against the free blocks (watermark 0, vLLM's default). One full-attention group
        only: vLLM caps a window group's count (``max_admission_blocks_per_request``)."""
        if [g.kind for g in self.attention_groups] != ["full"]:
            raise NotImplementedError(
                "the whole-sequence admission gate is modelled for one full-attention group"
            )
        m = cast(BlockMatch, self._current(req, match))
        needed = self.manager.coordinator.get_num_blocks_to_allocate(
            req.request_id, req.num_tokens, m.blocks, m.tokens
        )
        return needed <= self.block_pool.get_num_free_blocks()

    def _extend(self, req: Request, state: KVCacheBlocks, total_tokens: int) -> bool:
        num_new_tokens = total_tokens - req.num_computed_tokens
        if num_new_tokens <= 0:
            return True
        ok = self.manager.allocate_slots(req, num_new_tokens) is not None
        self._sync_evictions()
        return ok

    def _extend_in_place(self, live: LiveRequest[KVCacheBlocks], total_tokens: int) -> bool:
        """The steps vLLM's ``allocate_slots`` returns from at once (one group, no tier: the
        request holds the slots and no block fills), taken without a call into the manager."""
        if not self._steps_in_place:
            return False
        req = live.request
        coordinator = self.manager.coordinator
        return coordinator.extends_in_place(req.request_id, total_tokens, min(total_tokens, req.num_tokens))

    def _decode_room(self, req: Request, state: KVCacheBlocks) -> int:
        return self.manager.coordinator.decode_steps_in_place(req.request_id, req.num_computed_tokens)

    def _in_place_now(self) -> bool:
        # While the tier is busy a step could store or acknowledge something: none is skipped.
        return self.offload is None or not self.offload.busy()

    def _commit(self, req: Request, state: KVCacheBlocks) -> None:
        # vLLM: nothing to publish, full blocks were cached at allocation. Only check.
        held = len(state[self.primary_group])
        if held * self.page_size < req.num_computed_tokens:  # the message only on failure
            ensure(False, f"{req.request_id!r} committed {req.num_computed_tokens} tokens into {held} blocks")
        if self._prefill_end is not None and req.num_computed_tokens <= self._prefill_end[req.request_id]:
            self._publish(req)
        if self.offload is not None:
            self.offload.on_commit(req)

    def _publish(self, req: Request) -> None:
        """publish="commit": cache the request's full blocks with computed KV."""
        self.manager.cache_blocks(req, req.num_computed_tokens)

    def _release(self, req: Request, state: KVCacheBlocks) -> None:
        if self._prefill_end is not None:
            del self._prefill_end[req.request_id]
            self._publish(req)
        self.manager.free(req)
        if self.offload is not None:
            self.offload.on_release(req)

    def _page_table(self, req: Request, state: KVCacheBlocks) -> list[int]:
        return [b.block_id for b in state[self.primary_group]]

    def kv_groups(self) -> tuple[KVGroup, ...]:
        """One KVGroup per vLLM KV-cache group, all in the one pool "blocks" (padding layers,
        which hold memory but no model layer, are not listed)."""
        return self._kv_groups

    def page_tables(self, req: Request) -> list[list[int]]:
        """One page table per attention group (null block 0 where a window skipped a block)."""
        return [[b.block_id for b in blocks] for blocks in self._live_record(req, "page_tables").state]

    def _min_pages_to_fit(self, num_tokens: int) -> int:
        """Every group's blocks come from the one pool (a hybrid request takes more)."""
        return self.manager.coordinator.min_blocks_to_fit(num_tokens)

    def _layout_note(self) -> str:
        return f" over {len(self.attention_groups)} attention groups"

    def memory_in_use(self) -> int:
        """Blocks with a holder, each a page in every layer of its group (padding included, as
        vLLM sizes the pool)."""
        return self.usage().in_use * self.page_size * self._layers_per_block

    def num_usable_pages(self) -> int:
        """The block pool, which a hybrid layout sizes from the memory budget (vLLM)."""
        return self.block_pool.num_gpu_blocks - 1

    def _evict(self, num_tokens: int) -> int:
        dropped = self.block_pool.evict_lru_blocks(-(-num_tokens // self.page_size))
        self._sync_evictions()
        return dropped * self.page_size

    def _reset(self) -> None:
        ensure(self.manager.reset_prefix_cache(), "reset_prefix_cache refused with no live request")
        self._evicted_seen = self.block_pool.num_evicted_blocks
        if self.offload is not None:
            self.offload.reset()

    # ---------------------------------------------------------------- what it is given
    @property
    def host_tier(self) -> HostTier | None:
        """The offloading tier (offload/), None without one."""
        return self.offload

    @property
    def kv_events(self) -> KVEventSink | None:
        """The manager, whose ``take_events`` vLLM's engine drains (vLLM 0.33 annotates each
        BlockStored with its group's spec there); None with events off."""
        return self.manager if self.manager.enable_kv_cache_events else None

    # ---------------------------------------------------------------- vLLM extras
    def evict_blocks(self, block_ids: set[int]) -> int:
        """Drop the cached hashes of these block ids (vLLM's KV-connector hook); returns tokens."""
        dropped = self.manager.evict_blocks(block_ids)
        self._sync_evictions()
        return dropped * self.page_size

    def get_num_common_prefix_blocks(self, req: Request) -> int:
        """Leading blocks of ``req`` (group 0) that every running request references."""
        self._live_record(req, "get_num_common_prefix_blocks")
        return self.manager.coordinator.single_type_managers[0].get_num_common_prefix_blocks(req.request_id)

    # ---------------------------------------------------------------- accounting
    def usage(self) -> PageUsage:
        pool = self.block_pool
        num_free = pool.get_num_free_blocks()
        return PageUsage(
            free=num_free - pool.num_cached_free_blocks,
            evictable=pool.num_cached_free_blocks,
            in_use=pool.num_gpu_blocks - 1 - num_free,
        )

    def check_invariants(self) -> None:
        super().check_invariants()
        self.block_pool.check_invariants()
        live = {r.request_id for r in self.live_requests}
        holders = [0] * self.block_pool.num_gpu_blocks
        held_by: dict[str, set[int]] = {rid: set() for rid in live}
        for group_id, manager in enumerate(self.manager.coordinator.single_type_managers):
            req_to_blocks, num_cached_block = manager.req_to_blocks, manager.num_cached_block
            windowed = manager.spec.kind == "sliding_window"
            ensure(
                set(req_to_blocks) == live,
                f"group {group_id} holds {sorted(req_to_blocks)}, live {sorted(live)}",
            )
            ensure(
                set(num_cached_block) == live,
                f"group {group_id}: num_cached_block and live requests disagree",
            )
            for rid, blocks in req_to_blocks.items():
                ensure(num_cached_block[rid] <= len(blocks), f"{rid!r} cached more blocks than it holds")
                num_nulls = sum(1 for b in blocks if b.is_null)
                if manager.spec.kind == "mamba":
                    num_nulls = 0  # only the live states are real; nulls anywhere between them
                elif windowed:
                    # Out-of-window blocks are nulled from the left: the nulls are a prefix.
                    ensure(
                        all(b.is_null for b in blocks[:num_nulls]), f"{rid!r}: a null block after a real one"
                    )
                else:
                    ensure(num_nulls == 0, f"{rid!r} holds the null block in full-attention group {group_id}")
                for b in blocks[num_nulls:]:
                    if b.is_null and manager.spec.kind == "mamba":
                        continue
                    ensure(b is not self.block_pool.null_block, f"{rid!r} holds the null block")
                    ensure(b.block_id not in held_by[rid], f"{rid!r} holds block {b.block_id} twice")
                    held_by[rid].add(b.block_id)
                    ensure(b.ref_cnt >= 1, f"{rid!r} holds block {b.block_id} with ref_cnt {b.ref_cnt}")
                    key = b.block_hash
                    ensure(
                        key is None or key.endswith(group_id_suffix(group_id)),
                        f"block {b.block_id} in group {group_id} is cached under another group's key",
                    )
                    holders[b.block_id] += 1
        for rid, record in self._live.items():
            ensure(
                all(a is b for a, b in zip(record.state, self.manager.get_blocks(rid), strict=True)),
                f"{rid!r}: live record and managers hold different block lists",
            )
        for b in self.block_pool.blocks[1:]:
            ensure(
                b.ref_cnt == holders[b.block_id],
                f"block {b.block_id}: ref_cnt {b.ref_cnt}, held by {holders[b.block_id]}",
            )
        ensure(self.stats.evicted_tokens >= 0, "negative evicted_tokens")
        self.block_pool.eviction.check_requests(live)
        if self.offload is not None:
            self.offload.check_invariants(live)

    def _sync_evictions(self) -> None:
        evicted = self.block_pool.num_evicted_blocks
        self.stats.evicted_tokens += (evicted - self._evicted_seen) * self.page_size
        self._evicted_seen = evicted
        self.stats.orphaned_tokens = self.block_pool.eviction.num_orphaned_blocks * self.page_size
