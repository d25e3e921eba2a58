"""The prefill chunking of a hashchain cache with a Mamba group: vLLM 0.33's
``Scheduler._mamba_block_aligned_split`` (a state is written where a chunk ends, and cached
only at block boundaries), the cache's ``prefill_chunking`` (``prefixcache.prefill_chunking``)."""

from __future__ import annotations

from prefixcache.backends.hashchain.block_match import BlockMatch
from prefixcache.backends.hashchain.kv_cache_manager import KVCacheManager

from prefixcache.prefill_chunking import PrefillChunking
from prefixcache.request import Request


class MambaAlignedChunking(PrefillChunking):
    """Given the block size and the manager whose shared-prefix junctions it reads."""

    def __init__(self, block_size: int, manager: KVCacheManager) -> None:
        self.block_size = block_size
        self.manager = manager

    def chunk(
        self, req: Request, start: int, num_new_tokens: int, max_chunk: int, match: object | None = None
    ) -> int:
        """- a chunk short of the prefill's end ends on a block boundary, unless that leaves
          nothing and a block is wider than a step (then it advances sub-block);
        - then it stops at the first mandatory position strictly inside it: the next boundary
          if it starts mid-block; the last boundary a hit can resume at
          (``get_mamba_prefill_checkpoint_position``: ``num_tokens - 1`` floored to a block);
          the request's shared-prefix junction (found at its admission lookup), floored to a
          block, as with ``enable_mamba_shared_prefix_checkpoint`` off (the default).

        Not modelled: partial-block checkpoints (we have no partial Mamba hits) and EAGLE."""
        B = self.block_size
        prefill_end = max(req.num_prompt_tokens, req.num_tokens - 1)
        end = start + num_new_tokens
        if start >= prefill_end:
            return num_new_tokens
        if end < prefill_end:
            aligned = end // B * B
            if aligned > start or max_chunk >= B:
                end = aligned
        if isinstance(match, BlockMatch):
            junction = match.shared_prefix_boundary
        else:
            junction = self.manager.shared_prefix_boundary.get(req.request_id, 0)
        next_boundary = (start // B + 1) * B if start % B else 0
        last_cache_position = max((req.num_tokens - 1) // B * B, 0)
        junction_stop = start + (junction - start) // B * B if start < junction < end else 0
        stops = (next_boundary, last_cache_position, junction_stop)
        end = min((stop for stop in stops if start < stop < end), default=end)
        return max(end - start, 0)
