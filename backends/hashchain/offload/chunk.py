"""What the CPU manager and its policies share (vLLM 0.33 ``kv_offload/base.py`` and
``cpu/policies/base.py``): the offload key, a chunk's status, the per-request context."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum, auto

OffloadKey = bytes  # a block hash + the 4-byte group id (vLLM's make_offload_key)


class LookupResult(Enum):
    MISS = auto()
    HIT = auto()
    HIT_PENDING = auto()  # stored, not yet acknowledged: the lookup is retried later


@dataclass(slots=True)
class ChunkStatus:
    """One CPU chunk: ``ref_cnt`` -1 while its store is in flight (not readable), else the
    number of loads reading it (0: evictable)."""

    chunk_id: int
    ref_cnt: int = -1

    @property
    def is_ready(self) -> bool:
        return self.ref_cnt >= 0


@dataclass(slots=True)
class ReqContext:
    """vLLM's ReqContext: the end-token position of each of the request's keys (managers
    recover prefix order from it) and the managers' per-request state."""

    req_id: str
    key_positions: dict[OffloadKey, int] = field(default_factory=dict)
    lru_rank: tuple[int, int] | None = None  # LRU: (cache generation, the request's rank)
    # The manager's record of what the request touched (vLLM _RequestCacheAccess).
    seen_keys: list[OffloadKey] = field(default_factory=list)
    seen: set[OffloadKey] = field(default_factory=set)
    inserted_keys: set[OffloadKey] = field(default_factory=set)
    reused_keys: set[OffloadKey] = field(default_factory=set)
    store_miss_keys: set[OffloadKey] = field(default_factory=set)
    finished: bool = False


def order_request_keys(keys: Sequence[OffloadKey], ctx: ReqContext) -> list[OffloadKey]:
    """Head to tail, by key position when every key has one (vLLM order_request_keys)."""
    ordered = list(keys)
    if all(k in ctx.key_positions for k in ordered):
        ordered.sort(key=ctx.key_positions.__getitem__)
    return ordered
