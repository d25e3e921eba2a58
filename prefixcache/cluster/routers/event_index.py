"""An exact index of which replica holds which block, fed by vLLM's KV events: what Dynamo's
KV router and llm-d's precise prefix scorer keep.

Like Dynamo, the index re-hashes the tokens a ``BlockStored`` event carries with the router's
own chained hash (``base.chained_block_hashes``), so a request's blocks can be looked up from
its tokens without knowing the engine's hash function, and keeps the engine's hash of each
block to apply the ``BlockRemoved`` events, which carry only that. Events of other KV-cache
groups than ``group`` (a hybrid model's sliding-window groups) and partial blocks (vLLM 0.33
reports a block it caches before it is full with ``block_size`` < the group's) are not
indexed.

Events come with their batch's sequence number; a jump means batches were lost, which the
index records (``gaps``) so that a router can re-sync the replica (Dynamo recovers gaps from
the worker's local index).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from prefixcache.cluster.routers.base import chain_hash


class BlockIndex:
    def __init__(self, num_replicas: int, block_size: int, *, group: int = 0, seed: int = 0) -> None:
        self.block_size = block_size
        self.group = group
        self.seed = seed
        self.held: list[set[int]] = [set() for _ in range(num_replicas)]  # local hashes per replica
        self._local: list[dict[Any, int]] = [{} for _ in range(num_replicas)]  # engine hash -> local hash
        self.last_seq: list[int | None] = [None] * num_replicas
        self.gaps: list[list[tuple[int, int]]] = [[] for _ in range(num_replicas)]

    def apply(self, replica: int, seq: int, events: Iterable[Any]) -> None:
        last = self.last_seq[replica]
        if last is not None and seq > last + 1:
            self.gaps[replica].append((last + 1, seq - 1))
        self.last_seq[replica] = seq if last is None else max(last, seq)
        held, local = self.held[replica], self._local[replica]
        for e in events:
            kind = type(e).__name__
            if kind == "AllBlocksCleared":
                held.clear()
                local.clear()
                continue
            if getattr(e, "group_idx", None) not in (None, self.group):
                continue
            if kind == "BlockStored":
                if e.block_size != self.block_size:
                    continue  # a partial block, reported before it is full
                parent = self.seed if e.parent_block_hash is None else local.get(e.parent_block_hash)
                if parent is None:
                    continue  # its parent was never seen (lost, or stored before we listened)
                for i, engine_hash in enumerate(e.block_hashes):
                    parent = chain_hash(parent, e.token_ids[i * self.block_size : (i + 1) * self.block_size])
                    local[engine_hash] = parent
                    held.add(parent)
            elif kind == "BlockRemoved":
                for engine_hash in e.block_hashes:
                    h = local.pop(engine_hash, None)
                    if h is not None:
                        held.discard(h)

    def overlap(self, replica: int, hashes: Sequence[int]) -> int:
        """Consecutive blocks of ``hashes`` (``chained_block_hashes`` of a prompt) held from 0."""
        held = self.held[replica]
        n = 0
        for h in hashes:
            if h not in held:
                break
            n += 1
        return n
