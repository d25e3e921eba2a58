"""One manager per attention group (vLLM ``single_type_kv_cache_manager.py``).

A hybrid model (e.g. full attention layers interleaved with sliding-window layers) keeps one
block list per request per group: the groups see the same tokens but store different KV, so
each group caches its blocks under its own key (``BlockHashWithGroupId``). All groups draw
from one shared BlockPool (see ``coordinator.py`` for how capacity is shared).

The two kinds differ in which cached blocks a request can use:
  * full attention needs every block of the prefix: look up left to right, stop at the first
    miss (chained hashes: once block i misses, every later block misses too);
  * sliding window needs only the last ``window - 1`` tokens before the first recomputed one:
    scan right to left for ``cdiv(window - 1, block_size)`` contiguous cached blocks; blocks
    before that run are never read, so the null block stands in for them.
(Mamba groups: mamba_manager.py.) vLLM 0.33's sparse retention (``reachable_block_mask``)
decides which full blocks of a window group get a hash at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from prefixcache.backends.hashchain.block import KVCacheBlock
from prefixcache.backends.hashchain.block_pool import BlockPool
from prefixcache.backends.hashchain.hashing import BlockHashWithGroupId, RequestHashes, group_id_suffix

from prefixcache.request import Request

ATTENTION_KINDS = ("full", "sliding_window", "mamba")


@dataclass(frozen=True, slots=True)
class AttentionGroupSpec:
    """One KV-cache group: ``("full",)``, ``("sliding_window", window_tokens)`` or
    ``("mamba", state_size)`` (vLLM's MambaSpec in "align" mode; the state size in
    layer-token units, as ``prefixcache.layout`` gives it: it tells equal specs apart)."""

    kind: str
    sliding_window: int | None = None
    state_size: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in ATTENTION_KINDS:
            raise ValueError(f"attention group kind must be one of {ATTENTION_KINDS}, got {self.kind!r}")
        if self.kind != "sliding_window" and self.sliding_window is not None:
            raise ValueError(f"a {self.kind} group takes no window")
        if self.kind == "full" and self.state_size is not None:
            raise ValueError("a full-attention group takes no size: write ('full',)")
        if self.kind == "sliding_window":
            w = self.sliding_window
            if isinstance(w, bool) or not isinstance(w, int) or w < 1:
                raise ValueError(
                    f"a sliding-window group needs a window of >= 1 tokens: ('sliding_window', W), got {w!r}"
                )
        if self.kind == "mamba":
            size = self.state_size
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise ValueError(f"a mamba group needs its state size: ('mamba', S), got {size!r}")

    @classmethod
    def parse(cls, group: object) -> AttentionGroupSpec:
        if isinstance(group, AttentionGroupSpec):
            return group
        if not isinstance(group, (tuple, list)) or not group or not 1 <= len(group) <= 2:
            raise ValueError(
                f"attention group must be ('full',), ('sliding_window', W) or ('mamba', S), got {group!r}"
            )
        if group[0] == "mamba":
            return cls("mamba", None, *group[1:])
        return cls(*group)


def trim_null_head(blocks: list[KVCacheBlock]) -> list[KVCacheBlock]:
    """``blocks`` without its leading null blocks."""
    num_nulls = 0
    while num_nulls < len(blocks) and blocks[num_nulls].is_null:
        num_nulls += 1
    return blocks[num_nulls:] if num_nulls else blocks


class SingleTypeKVCacheManager:
    """Per-request block lists of one group; blocks come from the shared pool."""

    __slots__ = (
        "spec",
        "block_pool",
        "block_size",
        "kv_cache_group_id",
        "null_block",
        "req_to_blocks",
        "num_cached_block",
        "use_eagle",
    )

    def __init__(
        self, spec: AttentionGroupSpec, block_pool: BlockPool, block_size: int, group_id: int
    ) -> None:
        self.spec = spec
        self.block_pool = block_pool
        self.block_size = block_size
        self.kv_cache_group_id = group_id
        self.null_block = block_pool.null_block
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        # Leading blocks of each request already registered in the hash map (hits and nulls included).
        self.num_cached_block: dict[str, int] = {}
        # vLLM 0.33: an EAGLE group (set by the coordinator); its hits drop the last block and
        # sparse retention keeps the block past each boundary (the block the hit peeks at).
        self.use_eagle = False

    # ---------------------------------------------------------------- lookup
    def find_longest_cache_hit(
        self,
        hashes: RequestHashes,
        max_length: int,
        group_ids: Sequence[int],
        drop_eagle_block: bool = False,
    ) -> tuple[list[list[KVCacheBlock]], int]:
        """Hit blocks for each of ``group_ids`` (groups of this same spec, looked up jointly:
        a block hits only if every one of them has it) and the hit length in tokens, at most
        ``max_length``. ``drop_eagle_block`` (vLLM 0.33 EAGLE): the last matched block is
        dropped, so the drafter recomputes the hidden states it needs."""
        raise NotImplementedError

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Leading tokens whose KV no later token reads (0: full attention reads all)."""
        return 0

    # ---------------------------------------------------------------- allocation
    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock],
        num_computed_tokens: int,
    ) -> int:
        """Free blocks this group takes for ``num_tokens`` slots: new blocks plus hit blocks
        that sit in the free queue (touching them takes them out)."""
        num_required = -(-num_tokens // self.block_size)
        held = self.req_to_blocks.get(request_id)
        if held is not None:  # running: no new hit
            return max(num_required - len(held), 0)
        num_skipped = max(0, self.get_num_skipped_tokens(num_computed_tokens)) // self.block_size
        # Hit blocks already out of the window are never touched (nulls replace them).
        kept = new_computed_blocks[num_skipped:]
        num_new = max(num_required - max(num_skipped, len(new_computed_blocks)), 0)
        return num_new + sum(1 for b in kept if b.ref_cnt == 0 and not b.is_null)

    def add_computed_blocks(
        self, request_id: str, new_computed_blocks: Sequence[KVCacheBlock], num_computed_tokens: int
    ) -> None:
        """A new request takes its hit: touch it, nulls for blocks already out of the window."""
        num_skipped = max(0, self.get_num_skipped_tokens(num_computed_tokens)) // self.block_size
        kept = new_computed_blocks[num_skipped:]
        self.block_pool.touch(kept)
        blocks = [self.null_block] * num_skipped
        blocks.extend(kept)
        self.req_to_blocks[request_id] = blocks
        self.num_cached_block[request_id] = len(blocks)

    def allocate_new_blocks(self, request_id: str, num_tokens: int) -> list[KVCacheBlock]:
        blocks = self.req_to_blocks[request_id]
        num_new = -(-num_tokens // self.block_size) - len(blocks)
        if num_new <= 0:
            return []
        new_blocks = self.block_pool.get_new_blocks(num_new)
        blocks.extend(new_blocks)
        return new_blocks

    def cache_blocks(
        self,
        request: Request,
        hashes: RequestHashes,
        num_tokens: int,
        retention_interval: int | None = None,
        reachable_boundaries: Sequence[int] = (),
    ) -> None:
        """Hash the request's blocks full within ``num_tokens`` (``hashes``: the request's);
        ``retention_interval`` and ``reachable_boundaries`` (token positions a later hit may
        resume at) let a sparse group leave blocks no hit can read unhashed
        (``reachable_block_mask``)."""
        request_id = request.request_id
        num_cached = self.num_cached_block[request_id]
        num_full = num_tokens // self.block_size
        if num_full > num_cached:
            self.block_pool.cache_full_blocks(
                request,
                hashes.keys(self.kv_cache_group_id),
                self.req_to_blocks[request_id],
                num_cached,
                num_full,
                request.num_prompt_tokens // self.block_size,
                self.reachable_block_mask(num_cached, num_full, retention_interval, reachable_boundaries),
            )
            self.num_cached_block[request_id] = num_full  # masked blocks too: never hashed later
        if hashes.units_per_block > 1:  # vLLM: on every call, so a tail evicted in use comes back
            self.cache_partial_tail_block(request, hashes, num_tokens)

    def cache_partial_tail_block(self, request: Request, hashes: RequestHashes, num_tokens: int) -> None:
        """Register the prompt's last hit boundary inside a block (full attention only here;
        vLLM's Mamba "align" variant is not modelled)."""

    def reachable_block_mask(
        self, start_block: int, end_block: int, retention_interval: int | None, boundaries: Sequence[int]
    ) -> list[bool] | None:
        """Which of blocks [start_block, end_block) to hash; None: all (full attention)."""
        return None

    def num_blocks_freed_by_skip(self, request_id: str, num_computed_tokens: int) -> int:
        """Blocks ``remove_skipped_blocks`` would return to the free queue (ours: lets a
        failed allocate change nothing while counting what vLLM frees before its check)."""
        _, skipped = self._skipped(request_id, num_computed_tokens)
        return sum(1 for b in skipped if b.ref_cnt == 1)

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        """Free the blocks out of the window, rightmost first, and put nulls in their place."""
        end, skipped = self._skipped(request_id, num_computed_tokens)
        if not skipped:
            return
        blocks = self.req_to_blocks[request_id]
        # [0, end - len(skipped))  nulled by earlier calls; [.., end)  out of the window now
        blocks[end - len(skipped) : end] = [self.null_block] * len(skipped)
        self.block_pool.free_blocks(skipped)

    def _skipped(self, request_id: str, num_computed_tokens: int) -> tuple[int, list[KVCacheBlock]]:
        """(end, real blocks in [.., end) out of the window, rightmost first)."""
        blocks = self.req_to_blocks.get(request_id)
        num_skipped = self.get_num_skipped_tokens(num_computed_tokens) // self.block_size
        if not blocks or num_skipped <= 0:
            return 0, []
        end = min(num_skipped, len(blocks))
        out: list[KVCacheBlock] = []
        for i in range(end - 1, -1, -1):
            if blocks[i].is_null:  # earlier calls nulled everything before it
                break
            out.append(blocks[i])
        return end, out

    def pop_blocks_for_free(self, request_id: str) -> list[KVCacheBlock]:
        """Drop the request's bookkeeping; its blocks in table order, leading nulls trimmed
        (vLLM 0.33 ``trim_null_head``: a window's skipped prefix is never freed)."""
        blocks = self.req_to_blocks.pop(request_id, [])
        self.num_cached_block.pop(request_id, None)
        return trim_null_head(blocks)

    def free(self, request_id: str, reverse: bool = True) -> None:
        blocks = self.pop_blocks_for_free(request_id)
        self.block_pool.free_blocks(reversed(blocks) if reverse else blocks)

    def get_num_common_prefix_blocks(self, request_id: str) -> int:
        return 0


class FullAttentionManager(SingleTypeKVCacheManager):
    __slots__ = ()

    def find_longest_cache_hit(
        self,
        hashes: RequestHashes,
        max_length: int,
        group_ids: Sequence[int],
        drop_eagle_block: bool = False,
    ) -> tuple[list[list[KVCacheBlock]], int]:
        # Left to right, stop at the first miss (chained hashes: every later block misses
        # too); a block hits only where every group hits, so the joint hit is the shortest.
        longest_prefix = self.block_pool.cached_block_hash_to_block.longest_prefix
        limit = max_length // self.block_size
        computed = [longest_prefix(hashes.keys(g), limit) for g in group_ids]
        num_blocks = min(map(len, computed))
        if drop_eagle_block and num_blocks > 0:
            num_blocks -= 1  # vLLM 0.33: the whole block, however short the lookup limit
        for blocks in computed:
            del blocks[num_blocks:]
        return computed, num_blocks * self.block_size

    def cache_partial_tail_block(self, request: Request, hashes: RequestHashes, num_tokens: int) -> None:
        """vLLM 0.33 ``FullAttentionManager._cache_partial_tail_block``: with a hash unit below
        the block size, the prompt's hit cap (prompt - 1, down to a unit) that ends inside a
        block is registered as a further key of that block once the block is cached. Hits stay
        block-aligned (a window group is present), so no lookup reads it; it shows in the KV
        events and leaves the map with the block."""
        unit = self.block_size // hashes.units_per_block
        boundary = min((request.num_prompt_tokens - 1) // unit, len(hashes.hashes)) * unit
        # vLLM's hybrid coordinator hands its managers num_tokens down to the block size.
        num_cached_tokens = num_tokens // self.block_size * self.block_size
        if boundary <= 0 or boundary > num_cached_tokens or boundary % self.block_size == 0:
            return
        blocks = self.req_to_blocks[request.request_id]
        block_idx = boundary // self.block_size
        if block_idx >= len(blocks):
            return
        # [0, boundary)  the prefix the key names; its last unit [boundary - unit, boundary)
        num_units = boundary // unit
        key = hashes.hashes[num_units - 1] + group_id_suffix(self.kv_cache_group_id)
        parent = hashes.hashes[num_units - 2] if num_units > 1 else None
        self.block_pool.cache_partial_block(
            request, blocks[block_idx], BlockHashWithGroupId(key), parent, boundary - unit, boundary
        )

    def get_num_common_prefix_blocks(self, request_id: str) -> int:
        """Leading blocks every running request of this group references (pre-0.33 meaning)."""
        num_running = len(self.req_to_blocks)
        count = 0
        for block in self.req_to_blocks[request_id]:
            if block.ref_cnt != num_running:
                break
            count += 1
        return count


class SlidingWindowManager(SingleTypeKVCacheManager):
    __slots__ = ("sliding_window", "contiguous_blocks")

    def __init__(
        self, spec: AttentionGroupSpec, block_pool: BlockPool, block_size: int, group_id: int
    ) -> None:
        super().__init__(spec, block_pool, block_size, group_id)
        assert spec.sliding_window is not None
        self.sliding_window = spec.sliding_window
        # The window of the first recomputed token covers window - 1 earlier tokens.
        self.contiguous_blocks = -(-(self.sliding_window - 1) // block_size)

    def find_longest_cache_hit(
        self,
        hashes: RequestHashes,
        max_length: int,
        group_ids: Sequence[int],
        drop_eagle_block: bool = False,
    ) -> tuple[list[list[KVCacheBlock]], int]:
        keys = [hashes.keys(g) for g in group_ids]
        max_num_blocks = min(max_length // self.block_size, hashes.num_blocks)
        computed = [[self.null_block] * max_num_blocks for _ in group_ids]
        # EAGLE: a run one block longer, whose last block is then dropped.
        need = self.contiguous_blocks + 1 if drop_eagle_block else self.contiguous_blocks
        get_cached_block = self.block_pool.get_cached_block
        num_contiguous = 0
        match_found = False
        for i in range(max_num_blocks - 1, -1, -1):  # rightmost run first: the longest hit
            cached = get_cached_block([group_keys[i] for group_keys in keys])
            if cached is None:
                num_contiguous = 0
                continue
            for blocks, block in zip(computed, cached, strict=True):
                blocks[i] = block
            num_contiguous += 1
            if num_contiguous >= need:
                # [0, i) nulls, [i, i + run) the run; later (stale) hits are trimmed.
                for blocks in computed:
                    del blocks[i + num_contiguous :]
                match_found = True
                break
        if not match_found:
            # A shorter run that starts at block 0 is a hit too: nothing before it is needed.
            for blocks in computed:
                del blocks[num_contiguous:]
        if drop_eagle_block and computed[0]:
            for blocks in computed:
                blocks.pop()
        return computed, len(computed[0]) * self.block_size

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        # Token t attends to [t - window + 1, t]; the next token is num_computed_tokens.
        return max(0, num_computed_tokens - self.sliding_window + 1)

    def reachable_block_mask(
        self, start_block: int, end_block: int, retention_interval: int | None, boundaries: Sequence[int]
    ) -> list[bool] | None:
        """vLLM 0.33 ``SlidingWindowManager.reachable_block_mask`` (hits aligned to the block
        size, as every group here shares it). A hit at boundary b reads only the
        ``contiguous_blocks`` blocks ending at b, so only those need a hash (EAGLE: one more,
        the block after b that the hit matches and drops, so the tail ends one block later):

        None: dense, every block (a hit may land on any block boundary);
        0:    only the tails ending at ``boundaries`` (the replay boundary prompt - 1 and a
              shared-prefix junction), vLLM's engine default;
        k>0:  also one tail at the end of every k-token segment.
        """
        shift = 1 if self.use_eagle else 0
        need = self.contiguous_blocks + shift
        if retention_interval is None:
            return None
        mask = [False] * (end_block - start_block)
        if retention_interval > 0:
            per_segment = retention_interval // self.block_size
            if need >= per_segment:
                return None  # the tails cover every block
            for i in range(max(start_block, shift), end_block):
                if (i - shift) % per_segment >= per_segment - need:
                    mask[i - start_block] = True
        for boundary in boundaries:
            end = boundary // self.block_size  # the tail [end - need, end) ends on the boundary
            end += shift  # EAGLE: ... on the block past it
            for j in range(max(start_block, end - need), min(end_block, end)):
                mask[j - start_block] = True
        return mask
