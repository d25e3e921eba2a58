"""What a router sees and decides. Routers are small and stateful: ``route`` picks a replica for
one request at one time and says what it expects to be reused there; ``on_finish`` tells it
that a request finished (only routers that count their own load listen), ``on_events`` hands
it a replica's KV events (only the exact routers listen)."""

from __future__ import annotations

import sys
from abc import ABC, abstractmethod
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import xxhash

from prefixcache.request import Request


@dataclass(frozen=True, slots=True)
class ReplicaState:
    """One replica at routing time, as its engine reports it (the metrics llm-d scrapes and
    Dynamo's tracker keeps). Routers that count their own load ignore these."""

    index: int
    active_requests: int  # routed here and not finished (queued or running)
    waiting: int  # queued, not admitted yet
    kv_usage: float  # pages pinned by running requests / usable pages (vLLM's kv_cache_usage)
    prefill_tokens: int  # prompt tokens still to compute, queued and running
    decode_blocks: int  # blocks of page_size held by requests past their prefill


@dataclass(frozen=True, slots=True)
class Route:
    replica: int
    predicted_tokens: int  # the router's estimate of prompt tokens reusable there (0: none)
    branch: str  # the rule that decided: "cache", "balance", "explore", "random", ...


class Router(ABC):
    name = "router"

    def __init__(self, num_replicas: int, *, seed: int = 0) -> None:
        if isinstance(num_replicas, bool) or not isinstance(num_replicas, int) or num_replicas < 1:
            raise ValueError(f"num_replicas must be an int >= 1, got {num_replicas!r}")
        self.num_replicas = num_replicas
        self.seed = seed

    def attach(self, cluster: Any) -> None:
        """Called once by the cluster before the first request (the oracle reads its caches)."""
        return None

    @abstractmethod
    def route(self, req: Request, replicas: Sequence[ReplicaState], now: float) -> Route:
        """Pick a replica for ``req`` arriving at ``now``."""

    def on_finish(self, req: Request, replica: int, now: float) -> None:
        """``req`` finished on ``replica`` (routers that count their own load decrement)."""
        return None

    def on_events(self, replica: int, seq: int, events: Sequence[Any], now: float) -> None:
        """A batch of ``replica``'s KV events (sequence number ``seq``) reached the router
        (exact routers index them; the others ignore them)."""
        return None


def least_loaded(loads: Sequence[float]) -> int:
    """The index of the smallest load, the first on ties."""
    return min(range(len(loads)), key=loads.__getitem__)


_U32 = next(code for code in "ILH" if array(code).itemsize == 4)  # the array type code of 4 bytes


def token_bytes(tokens: Sequence[int] | np.ndarray) -> bytes:
    """Each token id as 4 little-endian bytes, in one C pass; OverflowError for an id outside
    [0, 2**32), as ``int.to_bytes(4, "little")`` raises."""
    if isinstance(tokens, list):  # an event's token ids: array() checks the range as it packs
        packed = array(_U32, tokens)
        if sys.byteorder == "big":
            packed.byteswap()
        return packed.tobytes()
    arr = np.asarray(tokens)
    if arr.size and (arr.min() < 0 or arr.max() >= 1 << 32):
        raise OverflowError(f"a token id outside [0, 2**32) cannot be hashed: {arr.min()}..{arr.max()}")
    return arr.astype("<u4").tobytes()


def chain_hash_bytes(parent: int, block: bytes) -> int:
    """A router's own hash of one block (``token_bytes`` of its tokens) after its parent's:
    xxh64 over the parent's 8 bytes, then the block's."""
    return xxhash.xxh64_intdigest(parent.to_bytes(8, "little") + block)


def chained_block_hashes(
    tokens: Sequence[int] | np.ndarray, block_size: int, seed: int = 0, *, start_parent: int | None = None
) -> list[int]:
    """The router's chained hash of each full block of ``tokens``: equal lists mean equal
    prefixes, as vLLM's hashes do. ``start_parent``: the hash the first block chains from
    (default ``seed``: the first block of a prompt)."""
    data, width = token_bytes(tokens), 4 * block_size
    out, parent = [], seed if start_parent is None else start_parent
    for start in range(0, len(tokens) // block_size * width, width):
        parent = chain_hash_bytes(parent, data[start : start + width])
        out.append(parent)
    return out
