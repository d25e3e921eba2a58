"""Async host loads in the host-tier lifecycle machine (tests/test_stateful_offload_hashchain.py):
the record of a request waiting for its load, and the KV-event checks the machine makes with
``kv_events = True`` (vLLM 0.33 ``Scheduler._update_waiting_for_remote_kv``):

    load acknowledged   the loaded blocks [GPU hit, load_end) cached: one BlockStored, parent
                        the GPU hit's last block; blocks reserved past them at admission (a
                        caller's choice) the next BlockStored, parent the last loaded block
    first chunk         its newly full blocks (not reserved at admission): one BlockStored,
                        parent the last loaded block
    after every rule    the events, replayed into a multiset (EventModel) and Dynamo's
                        BlockIndex, equal the cache's hash map, with no gap
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prefixcache import Request


@dataclass(slots=True)
class Loading:
    """A request admitted with an async host load, not yet computing: vLLM's
    WAITING_FOR_REMOTE_KVS. ``load_end``: GPU hit + external tokens (vLLM caches up to it)."""

    req: Request
    gpu_tokens: int
    load_end: int
    chunk: int  # its first chunk, computed once the load is acknowledged
    reserved: bool  # the admission reserved the chunk too (a caller's choice), not just the hit
    steps_left: int  # step boundaries until the load is acknowledged


class TierLoadEvents:
    kv_events = False
    cache: Any
    page_size: int

    def _start_events(self) -> None:
        if not self.kv_events:
            return
        from prefixcache.cluster.routers.event_index import BlockIndex
        from tests.test_kv_events_backends import EventModel

        self.event_model = EventModel()
        self.event_index = BlockIndex(1, block_size=self.page_size)
        self.event_batches = 0

    def _block_hashes(self, req: Request) -> list[int | None]:
        """The event hash (vLLM's int hash) of each of ``req``'s blocks, None if not cached."""
        blocks = self.cache.block_pool.blocks
        hashes = (blocks[b].block_hash for b in self.cache.page_table(req))
        return [None if h is None else int.from_bytes(h[-12:-4], "big") for h in hashes]

    def _take_events(self) -> list[Any]:
        """The events since the last call, replayed into the multiset and the index."""
        if not self.kv_events:
            return []
        events = self.cache.kv_events.take_events()
        self.event_model.apply(events)
        self.event_index.apply(0, self.event_batches, events)
        self.event_batches += 1
        return events

    def _check_load_events(self, w: Loading, events: list[Any]) -> None:
        """``events``: those of the step boundary that acknowledged ``w``'s load."""
        if not self.kv_events:
            return
        p, hashes = self.page_size, self._block_hashes(w.req)
        first, loaded = w.gpu_tokens // p, w.load_end // p
        stored = [e for e in events if type(e).__name__ == "BlockStored"]
        at = [i for i, e in enumerate(stored) if e.block_hashes == hashes[first:loaded]]
        assert len(at) == 1, f"{w.req.request_id}: its loaded blocks are not one BlockStored of their own"
        assert stored[at[0]].parent_block_hash == (hashes[first - 1] if first else None)
        end = min(self.cache.reserved_tokens(w.req), w.req.num_tokens) // p
        if end > loaded:
            after = stored[at[0] + 1 : at[0] + 2]
            assert [(e.block_hashes, e.parent_block_hash) for e in after] == [
                (hashes[loaded:end], hashes[loaded - 1])
            ], f"{w.req.request_id}: the blocks reserved past its load are not the next BlockStored"

    def _check_first_chunk_events(self, w: Loading, hit: int) -> None:
        """Just after ``w``'s first chunk (from ``hit``) was allocated and computed."""
        if not self.kv_events:
            return
        req, p = w.req, self.page_size
        hashes = self._block_hashes(req)
        first, end = w.load_end // p, min(hit + w.chunk, req.num_tokens) // p
        stored = [e for e in self._take_events() if type(e).__name__ == "BlockStored"]
        expected = [] if w.reserved or end <= first else [(hashes[first:end], hashes[first - 1])]
        assert [(e.block_hashes, e.parent_block_hash) for e in stored] == expected, (
            f"{req.request_id}: the blocks computed after its load are not one BlockStored whose "
            f"parent is the last loaded block's hash"
        )

    def _check_events_agree(self) -> None:
        if not self.kv_events:
            return
        from tests.test_kv_events_backends import cached_blocks

        self._take_events()
        held = cached_blocks(self.cache)
        assert self.event_model.blocks == held, "the replayed events disagree with the cache"
        assert self.event_index.engine_hashes(0) == {h: n for (g, h), n in held.items() if g == 0}
        assert not self.event_index.gaps[0]
