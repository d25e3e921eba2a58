"""An exact index of which replica holds which block, fed by vLLM's KV events: what Dynamo's
KV router and llm-d's precise prefix scorer keep.

Like Dynamo, the index re-hashes the tokens a ``BlockStored`` event carries with the router's
own chained hash (``base.chained_block_hashes``), so a request's blocks can be looked up from
its tokens without knowing the engine's hash function, and keeps the engine's hash of each
block to apply the ``BlockRemoved`` events, which carry only that. Only full-attention
KV-cache groups are indexed: a hybrid model's sliding-window or Mamba group hashes only some
blocks (its ``BlockStored`` skips the rest, so hashes and tokens do not line up) under the same
block hashes. vLLM 0.33 names each ``BlockStored``'s group kind (``kv_cache_spec_kind``); the
index learns per replica which group ids are full attention from them and applies the
``BlockRemoved`` events (which carry only the group id) of those groups. Events that name no
kind are indexed for group ``group`` (or no group). Partial blocks (vLLM 0.33 reports a block
it caches before it is full with ``block_size`` < the group's) are not indexed.

Both maps count: vLLM caches one block under the same hash twice (a prompt of whole blocks
recomputes its last block, capped at n - 1 tokens, into a second block) and publishes a
``BlockStored`` for each and a ``BlockRemoved`` for each, and two engine hashes (a salted and a
plain prompt) may share the router's token hash; a block leaves the index with its last copy.

Events come with their batch's sequence number; a jump means batches were lost, which the
index records (``gaps``) so that a router can re-sync the replica (Dynamo recovers gaps from
the worker's local index).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from prefixcache.cluster.routers.base import chained_block_hashes

# vLLM 0.33 KVCacheSpecKind values of groups that hash every block of the prefix
FULL_ATTENTION_KINDS = frozenset({"full_attention", "mla_attention", "sink_full_attention"})


class BlockIndex:
    def __init__(self, num_replicas: int, block_size: int, *, group: int = 0, seed: int = 0) -> None:
        self.block_size = block_size
        self.group = group
        self.seed = seed
        self.held: list[set[int]] = [set() for _ in range(num_replicas)]  # local hashes per replica
        self._local: list[dict[Any, int]] = [{} for _ in range(num_replicas)]  # engine hash -> local hash
        self._copies: list[Counter[Any]] = [Counter() for _ in range(num_replicas)]  # per engine hash
        self._held_copies: list[Counter[int]] = [Counter() for _ in range(num_replicas)]  # per local hash
        self.last_seq: list[int | None] = [None] * num_replicas
        self.gaps: list[list[tuple[int, int]]] = [[] for _ in range(num_replicas)]
        # per replica: group ids a BlockStored named full attention / another kind
        self._full_groups: list[set[int]] = [set() for _ in range(num_replicas)]
        self._other_groups: list[set[int]] = [set() for _ in range(num_replicas)]

    def _indexed(self, replica: int, event: Any) -> bool:
        """Whether ``event`` belongs to an indexed (full-attention) group of ``replica``."""
        group = getattr(event, "group_idx", None)
        if group is None:
            return True
        spec_kind = getattr(event, "kv_cache_spec_kind", None)
        if spec_kind is not None:  # only BlockStored names it
            full = spec_kind in FULL_ATTENTION_KINDS
            (self._full_groups if full else self._other_groups)[replica].add(group)
            return full
        if group in self._full_groups[replica]:
            return True
        return group == self.group and group not in self._other_groups[replica]

    def apply(self, replica: int, seq: int, events: Iterable[Any]) -> None:
        last = self.last_seq[replica]
        if last is not None and seq > last + 1:
            self.gaps[replica].append((last + 1, seq - 1))
        self.last_seq[replica] = seq if last is None else max(last, seq)
        held, local = self.held[replica], self._local[replica]
        copies, held_copies = self._copies[replica], self._held_copies[replica]
        for e in events:
            kind = type(e).__name__
            if kind == "AllBlocksCleared":
                held.clear()
                local.clear()
                copies.clear()
                held_copies.clear()
                continue
            if not self._indexed(replica, e):
                continue
            if kind == "BlockStored":
                if e.block_size != self.block_size:
                    continue  # a partial block, reported before it is full
                parent = self.seed if e.parent_block_hash is None else local.get(e.parent_block_hash)
                if parent is None:
                    continue  # its parent was never seen (lost, or stored before we listened)
                hashes = chained_block_hashes(e.token_ids, self.block_size, start_parent=parent)
                if len(hashes) != len(e.block_hashes):  # checked before anything is indexed
                    raise ValueError(f"BlockStored: {len(e.block_hashes)} hashes, {len(hashes)} blocks")
                # each block as a loop over them would index it, the counting in C (Counter.update)
                local.update(zip(e.block_hashes, hashes, strict=True))
                copies.update(e.block_hashes)
                held_copies.update(hashes)
                held.update(hashes)
            elif kind == "BlockRemoved":
                for engine_hash in e.block_hashes:
                    h = local.get(engine_hash)
                    if h is None:
                        continue
                    copies[engine_hash] -= 1
                    if not copies[engine_hash]:
                        del copies[engine_hash], local[engine_hash]
                    held_copies[h] -= 1
                    if not held_copies[h]:
                        del held_copies[h]
                        held.discard(h)

    def engine_hashes(self, replica: int) -> dict[Any, int]:
        """The engine hashes the replica holds, each with its number of copies."""
        return dict(self._copies[replica])

    def overlap(self, replica: int, hashes: Sequence[int]) -> int:
        """Consecutive blocks of ``hashes`` (``chained_block_hashes`` of a prompt) held from 0."""
        held = self.held[replica]
        n = 0
        for h in hashes:
            if h not in held:
                break
            n += 1
        return n
