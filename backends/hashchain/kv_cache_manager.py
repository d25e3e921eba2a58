"""``KVCacheManager``: the scheduler-facing facade (vLLM ``kv_cache_manager.py``).

KVCacheManager -> KVCacheCoordinator (Unitary for one group, Hybrid for several) ->
SingleTypeKVCacheManager (FullAttention / SlidingWindow) per group -> one BlockPool.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prefixcache.backends.hashchain.block_pool import BlockPool
from prefixcache.backends.hashchain.events import BlockPoolEventRecorder
from prefixcache.backends.hashchain.eviction import make_eviction_order
from prefixcache.backends.hashchain.hashing import (
    BlockHasher,
    BlockHashWithGroupId,
    HashFn,
    KnownPromptHashes,
)
from prefixcache.backends.hashchain.kv_cache_coordinator import (
    CacheHit,
    KVCacheBlocks,
    make_kv_cache_coordinator,
)
from prefixcache.backends.hashchain.single_type_kv_cache_manager import AttentionGroupSpec

from prefixcache.request import Request

FREE_ORDERS = ("reverse", "forward")
# When a full block is published (gets its hash, so that lookups see it): at allocation, before
# its KV is computed (vLLM); or at commit, as SGLang inserts at the end of a prefill chunk and
# at release (``"commit"``, our ablation switch).
PUBLISH_TIMES = ("allocation", "commit")
# vLLM 0.33 ``KVCacheSpecKind`` values, which BlockStored events carry.
_EVENT_SPEC_KINDS = {"full": "full_attention", "sliding_window": "sliding_window", "mamba": "mamba"}


def max_cache_hit_length(request: Request) -> int:
    """The last token is always recomputed (its logits are needed): a prompt of exactly k
    blocks hits k - 1."""
    return request.num_tokens - 1


class KVCacheManager:
    """``free_order`` is our ablation switch; vLLM always frees a request's blocks reversed.

    ``free_skipped_on_failure``: vLLM frees a running request's out-of-window blocks (and old
    Mamba states) at the start of allocate_slots, even when the allocation then fails. Off
    (ours, the PrefixCache contract: a failed allocate changes nothing), those frees are
    counted instead and happen only with a successful allocation; on, as vLLM (for replaying
    its recorded fixtures exactly).

    ``use_eagle``: vLLM 0.33's ``KVCacheManager(use_eagle=True)``, the EAGLE block drop (see
    the coordinator); it changes lookups and which sliding-window blocks get a hash, not the
    allocation count (the drafter's lookahead slots are the caller's: num_new_tokens).

    ``publish`` and ``dedupe`` are our ablation switches towards SGLang (``PUBLISH_TIMES``;
    ``BlockPool``); vLLM's are "allocation" and False.

    ``enable_kv_cache_events`` (vLLM's): the block pool is given a ``BlockPoolEventRecorder``,
    which ``take_events`` drains; off, it is given none."""

    def __init__(
        self,
        num_gpu_blocks: int,
        block_size: int,
        hash_fn: HashFn,
        attention_groups: Sequence[AttentionGroupSpec] = (AttentionGroupSpec("full"),),
        *,
        free_order: str = "reverse",
        unhashed_first: bool = True,
        eviction_policy: str = "lru",
        prefix_cache_retention_interval: int | None = None,
        free_skipped_on_failure: bool = False,
        hash_block_size: int | None = None,
        use_eagle: bool = False,
        known_prompt_hashes: KnownPromptHashes | None = None,
        publish: str = "allocation",
        dedupe: bool = False,
        enable_kv_cache_events: bool = False,
    ) -> None:
        if publish not in PUBLISH_TIMES:
            raise ValueError(f"publish must be one of {PUBLISH_TIMES}, got {publish!r}")
        self.publish_at_allocation = publish == "allocation"
        if free_order not in FREE_ORDERS:
            raise ValueError(f"free_order must be one of {FREE_ORDERS}, got {free_order!r}")
        if not isinstance(free_skipped_on_failure, bool):
            raise ValueError(f"free_skipped_on_failure must be a bool, got {free_skipped_on_failure!r}")
        self.free_skipped_on_failure = free_skipped_on_failure
        self.block_size = block_size
        self.free_order = free_order
        if not isinstance(enable_kv_cache_events, bool):
            raise ValueError(f"enable_kv_cache_events must be a bool, got {enable_kv_cache_events!r}")
        self.enable_kv_cache_events = enable_kv_cache_events
        kv_events = BlockPoolEventRecorder(block_size) if enable_kv_cache_events else None
        self.block_pool = BlockPool(
            num_gpu_blocks,
            unhashed_first,
            make_eviction_order(eviction_policy, num_gpu_blocks - 1, block_size),
            dedupe,
            kv_events,
        )
        # vLLM's hash_block_size: tokens per hash; a block is keyed by its last unit's hash.
        hash_block_size = block_size if hash_block_size is None else hash_block_size
        if hash_block_size < 1 or block_size % hash_block_size:
            raise ValueError(f"hash_block_size {hash_block_size} must divide the block size {block_size}")
        self.hasher = BlockHasher(
            hash_block_size, hash_fn, block_size // hash_block_size, known_prompt_hashes
        )
        self.coordinator = make_kv_cache_coordinator(
            attention_groups, self.block_pool, block_size, prefix_cache_retention_interval, use_eagle
        )
        # vLLM keeps it on the Request (set at each admission lookup): the shared-prefix
        # junction whose window tail sparse retention must hash; 0 = none.
        self.shared_prefix_boundary: dict[str, int] = {}

    # ---------------------------------------------------------------- read path
    def get_computed_blocks(self, request: Request) -> tuple[KVCacheBlocks, int]:
        """The longest cached prefix of ``request`` in whole blocks (per group), and its
        length in tokens.

        Pure: touches nothing, counts nothing. Capped (``max_cache_hit_length``).
        """
        blocks, length, _ = self.get_cache_hit(request)
        return blocks, length

    def get_cache_hit(self, request: Request) -> CacheHit:
        """``get_computed_blocks`` with vLLM 0.33's third answer (see ``shared_prefix_boundary``)."""
        return self.coordinator.find_cache_hit(
            self.hasher.request_hashes(request), max_cache_hit_length(request)
        )

    def revalidate_computed_blocks(self, request: Request, hit_blocks: KVCacheBlocks) -> CacheHit:
        """``get_cache_hit`` after the index changed, given the blocks it returned then."""
        hashes = self.hasher.request_hashes(request)
        return self.coordinator.revalidate_cache_hit(hashes, hit_blocks, max_cache_hit_length(request))

    @staticmethod
    def junction(hit: CacheHit) -> int:
        """vLLM 0.33 ``get_computed_blocks``' ``shared_prefix_boundary``: the longest one-group
        hit when some group hit longer than the joint hit, else 0."""
        return (
            hit.length + hit.num_uncached_common_prefix_tokens if hit.num_uncached_common_prefix_tokens else 0
        )

    # ---------------------------------------------------------------- write path
    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: KVCacheBlocks | None = None,
        shared_prefix_boundary: int = 0,
    ) -> KVCacheBlocks | None:
        """Room for ``num_new_tokens`` after the request's computed tokens plus the new hit.

        Returns the newly allocated blocks per group, or None when the pool is short; then
        NOTHING has changed, not even the ref counts of the hit blocks. Full blocks are cached
        right away, before their KV is computed, so an identical prompt admitted in the same
        step hits (with ``publish="commit"`` the caller caches them later).
        """
        if num_new_tokens <= 0:
            raise ValueError(f"num_new_tokens must be positive, got {num_new_tokens}")
        coordinator = self.coordinator
        request_id = request.request_id
        running = coordinator.is_running(request_id)
        hits = new_computed_blocks if new_computed_blocks is not None else coordinator.empty_blocks()
        if running and any(hits):
            raise ValueError(f"new computed blocks for {request_id!r}, which already holds blocks")
        # [0, num_computed_tokens)                 KV exists (earlier steps or the new hit)
        # [num_computed_tokens, num_tokens_need)   to be computed now: needs slots
        num_computed_tokens = request.num_computed_tokens + num_new_computed_tokens
        num_tokens_need_slot = num_computed_tokens + num_new_tokens
        num_tokens = min(num_tokens_need_slot, request.num_tokens)  # slots whose token exists
        if running and coordinator.extends_in_place(request_id, num_tokens_need_slot, num_tokens):
            return hits  # no new block in any group
        if self.free_skipped_on_failure:
            coordinator.remove_skipped_blocks(request_id, num_computed_tokens)  # vLLM: before the check
        needed = coordinator.get_num_blocks_to_allocate(
            request_id, num_tokens_need_slot, hits, num_computed_tokens
        )
        if needed > self.block_pool.get_num_free_blocks():
            return None
        coordinator.remove_skipped_blocks(request_id, num_computed_tokens)
        if not running:
            self.block_pool.eviction.admitted(request, hits[0], self._lookup_keys)
            coordinator.save_new_computed_blocks(request_id, hits, num_computed_tokens)
            self.shared_prefix_boundary[request_id] = shared_prefix_boundary
        new_blocks = coordinator.allocate_new_blocks(request_id, num_tokens_need_slot)
        # Only blocks whose tokens all exist can be hashed (a lookahead slot has no token).
        if self.publish_at_allocation:
            self.cache_blocks(request, num_tokens)
        return new_blocks

    def _lookup_keys(self, request: Request) -> list[BlockHashWithGroupId]:
        """The request's lookup: group 0's keys within the hit cap (for an eviction order that
        asks, at admission)."""
        keys = self.hasher.request_hashes(request).keys(0)
        return keys[: max_cache_hit_length(request) // self.block_size]

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Register the request's blocks that are full within its first ``num_tokens`` tokens.
        With a hash unit below the block size every call goes through, as in vLLM: a partial
        tail evicted while in use is registered again (``_cache_partial_tail_block``)."""
        if (
            self.hasher.units_per_block > 1
            or self.coordinator.num_blocks_to_cache(request.request_id, num_tokens) > 0
        ):
            self.coordinator.cache_blocks(
                request,
                self.hasher.request_hashes(request),
                num_tokens,
                self.shared_prefix_boundary.get(request.request_id, 0),
            )

    def free(self, request: Request) -> None:
        """Release the request's blocks, last block first (vLLM's order).

        Reversed, the partial tail is reused first and the chain's deepest block is evicted
        first, so the shared start of a prefix survives longest.
        """
        self.block_pool.eviction.released(request)
        self.shared_prefix_boundary.pop(request.request_id, None)
        self.coordinator.free(request.request_id, reverse=self.free_order == "reverse")

    # ---------------------------------------------------------------- queries
    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        return self.coordinator.get_blocks(request_id)

    def evict_blocks(self, block_ids: set[int]) -> int:
        return self.block_pool.evict_blocks(block_ids)

    def reset_prefix_cache(self) -> bool:
        return self.block_pool.reset_prefix_cache()

    def take_events(self) -> list[Any]:
        """vLLM 0.33 ``KVCacheManager.take_events``: the block pool's KV events since the last
        call ([] with events off), each BlockStored annotated with its group's spec kind and
        window. With events on, the manager is its cache's ``kv_events`` sink."""
        events = self.block_pool.take_events()
        for event in events:
            if type(event).__name__ == "BlockStored":
                spec = self.coordinator.single_type_managers[event.group_idx].spec
                event.kv_cache_spec_kind = _EVENT_SPEC_KINDS[spec.kind]
                event.kv_cache_spec_sliding_window = spec.sliding_window
        return events
