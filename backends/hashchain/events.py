"""KV events of the block pool, as vLLM 0.33 emits them (``block_pool.py``), in its schema
(``prefixcache.kv_events``): a ``BlockPoolEventRecorder`` is given to a ``BlockPool`` with events
on (vLLM's ``enable_kv_cache_events``); a pool given None runs no event code.

Where: ``BlockStored`` when ``cache_full_blocks`` registers blocks (and ``cache_partial_block``
a partial tail), ``BlockRemoved`` (one per hash) whenever a hash leaves the map (lazy eviction
at reuse, ``evict_blocks``, our LRU and ranked evictions), ``AllBlocksCleared`` on a successful
reset. A BlockStored names the request whose blocks are cached: the pool passes it along, as
vLLM's ``cache_full_blocks(request, ...)`` is given it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from prefixcache.backends.hashchain.hashing import (
    BlockHash,
    BlockHashWithGroupId,
    generate_block_hash_extra_keys,
)

from prefixcache.request import Request


def _event_extra_keys(keys: tuple[Any, ...] | None) -> tuple[Any, ...] | None:
    """vLLM 0.33 ``to_event_extra_keys`` for one block: the hash's tagged keys untagged, as
    events publish them (a LoRA name or salt bare, a multimodal key as (identifier, offset))."""
    if keys is None:
        return None
    return tuple(key[1:] if key[0] == "mm" else key[1] for key in keys)


class BlockPoolEventRecorder:
    """vLLM 0.33 ``BlockPool.kv_event_queue`` and the code that fills it; ``take_events``
    drains it (a ``KVEventSink``).

    ``int_block_hashes``: vLLM's VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES (default on): events carry
    the low 64 bits of each hash as an int; off, the hash bytes."""

    __slots__ = ("block_size", "int_block_hashes", "kv_event_queue")

    def __init__(self, block_size: int, int_block_hashes: bool = True) -> None:
        self.block_size = block_size
        self.int_block_hashes = int_block_hashes
        self.kv_event_queue: list[Any] = []

    def emit_block_stored(
        self,
        request: Request,
        block_keys: Sequence[BlockHashWithGroupId],
        num_cached_blocks: int,
        num_full_blocks: int,
        stored_keys: Sequence[BlockHashWithGroupId],
        stored_at: Sequence[int],
    ) -> None:
        """vLLM 0.33 ``cache_full_blocks``' event: one ``BlockStored`` for the whole range, even
        when every block in it was null or masked (then with no hashes); the parent is the hash
        of the block before the range (hashed or not), the tokens those of the whole range."""
        from prefixcache.kv_events import MEDIUM_GPU, BlockStored

        B = self.block_size
        parent = self._external(block_keys[num_cached_blocks - 1]) if num_cached_blocks else None
        extra: list[tuple[Any, ...] | None] = [
            _event_extra_keys(generate_block_hash_extra_keys(request, i * B, (i + 1) * B)) for i in stored_at
        ]
        self.kv_event_queue.append(
            BlockStored(
                block_hashes=[self._external(key) for key in stored_keys],
                parent_block_hash=parent,
                token_ids=request.token_ids(num_cached_blocks * B, num_full_blocks * B),
                block_size=B,
                lora_id=None,  # our requests carry no LoRA adapter id
                medium=MEDIUM_GPU,
                lora_name=request.lora_name,
                extra_keys=extra or None,
                group_idx=int.from_bytes(block_keys[num_cached_blocks][-4:], "big"),
            )
        )

    def emit_partial_block_stored(
        self, request: Request, key: BlockHashWithGroupId, parent: BlockHash | None, start: int, end: int
    ) -> None:
        """vLLM 0.33 ``cache_partial_block``'s event: one hash, block_size = the hash unit."""
        from prefixcache.kv_events import MEDIUM_GPU, BlockStored

        self.kv_event_queue.append(
            BlockStored(
                block_hashes=[self._external(key)],
                parent_block_hash=self._external_hash(parent) if parent is not None else None,
                token_ids=request.token_ids(start, end),
                block_size=end - start,
                lora_id=None,  # our requests carry no LoRA adapter id
                medium=MEDIUM_GPU,
                lora_name=request.lora_name,
                extra_keys=[_event_extra_keys(generate_block_hash_extra_keys(request, start, end))],
                group_idx=int.from_bytes(key[-4:], "big"),
            )
        )

    def emit_block_removed_events(self, keys: Iterable[BlockHashWithGroupId]) -> None:
        """vLLM 0.33 ``_emit_block_removed_events``: one ``BlockRemoved`` per hash."""
        from prefixcache.kv_events import MEDIUM_GPU, BlockRemoved

        external = self._external
        self.kv_event_queue.extend(
            BlockRemoved(block_hashes=[external(key)], medium=MEDIUM_GPU,
                         group_idx=int.from_bytes(key[-4:], "big"))
            for key in keys
        )

    def emit_all_blocks_cleared(self) -> None:
        """vLLM 0.33 ``reset_prefix_cache``'s event."""
        from prefixcache.kv_events import AllBlocksCleared

        self.kv_event_queue.append(AllBlocksCleared())

    def take_events(self) -> list[Any]:
        """The queued KV events, oldest first; the queue is left empty."""
        events, self.kv_event_queue = self.kv_event_queue, []
        return events

    def _external(self, key: BlockHashWithGroupId) -> bytes | int:
        """vLLM 0.33 ``maybe_convert_block_hash`` of the key's block hash (its group id cut off:
        the hash's last 8 bytes are the key's bytes [-12, -4))."""
        return int.from_bytes(key[-12:-4], "big") if self.int_block_hashes else BlockHash(key[:-4])

    def _external_hash(self, block_hash: BlockHash) -> bytes | int:
        return int.from_bytes(block_hash[-8:], "big") if self.int_block_hashes else block_hash
