"""NVIDIA Dynamo's KV router (``lib/kv-router/src/scheduling/selector.rs``).

State: which blocks each worker holds, by chained block hash: with ``use_kv_events=True``
(Dynamo's default) an exact index fed by the workers' KV events (``event_index.BlockIndex``:
the cluster must be made with ``kv_events=True`` and caches that emit them); otherwise
(``--no-kv-events``, our default, so that a router made with no options needs no event
delivery) the router's own record of the blocks of each routed request, each expiring
``ttl_s`` after it was routed.
Overlap = consecutive held blocks from block 0. Costs (lower wins), B = block size, ISL = the prompt's tokens:

- ``"classic"`` (v0.x): ``w * (active_prefill + ISL - overlap * B) / B + decode_blocks``;
- ``"current"``: ``prefill_load_scale * max(0, (active_prefill + ISL) / B - credit * overlap)
  + decode_blocks + k * active_requests``.

``temperature`` 0 takes the lowest cost (the first on ties); above 0 it samples with
``p ~ exp(-(cost - min) / ((max - min) * T))`` (uniform when all costs are equal).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

from prefixcache.cluster.routers.base import ReplicaState, Route, Router, chained_block_hashes
from prefixcache.cluster.routers.event_index import BlockIndex
from prefixcache.request import Request

COSTS = ("classic", "current")


def classic_cost(isl: int, overlap_blocks: int, block_size: int, active_prefill: int, decode_blocks: int,
                 overlap_weight: float = 1.0) -> float:
    return overlap_weight * (active_prefill + isl - overlap_blocks * block_size) / block_size + decode_blocks


def current_cost(isl: int, overlap_blocks: int, block_size: int, active_prefill: int, decode_blocks: int,
                 active_requests: int, prefill_load_scale: float = 1.0, credit: float = 1.0,
                 k: float = 0.0) -> float:
    prefill = max(0.0, (active_prefill + isl) / block_size - credit * overlap_blocks)
    return prefill_load_scale * prefill + decode_blocks + k * active_requests


def _weights(costs: Sequence[float], temperature: float) -> list[float] | None:
    """exp(-(cost - min) / ((max - min) T)) per worker; None when every cost is equal."""
    lo, hi = min(costs), max(costs)
    if hi == lo:
        return None
    return [math.exp(-(c - lo) / ((hi - lo) * temperature)) for c in costs]


def softmax_pick(costs: Sequence[float], temperature: float, rng: random.Random) -> int:
    """Dynamo's sampling: the cheapest at T=0 (first on ties), else exp(-normalised cost / T)."""
    if temperature == 0:
        return list(costs).index(min(costs))
    weights = _weights(costs, temperature)
    if weights is None:
        return rng.randrange(len(costs))
    return rng.choices(range(len(costs)), weights=weights)[0]


def pick_probabilities(costs: Sequence[float], temperature: float) -> list[float]:
    """The probability ``softmax_pick`` gives each worker (for tests and the paper)."""
    weights = _weights(costs, temperature)
    if weights is None:
        return [1 / len(costs)] * len(costs)
    total = sum(weights)
    return [w / total for w in weights]


class DynamoKV(Router):
    name = "dynamo"

    def __init__(
        self,
        num_replicas: int,
        *,
        seed: int = 0,
        block_size: int = 16,
        cost: str = "classic",
        overlap_weight: float = 1.0,
        prefill_load_scale: float = 1.0,
        credit: float = 1.0,
        active_request_weight: float = 0.0,
        temperature: float = 0.0,
        use_kv_events: bool = False,
        ttl_s: float = 120.0,
    ) -> None:
        super().__init__(num_replicas, seed=seed)
        if cost not in COSTS:
            raise ValueError(f"cost must be one of {COSTS}, got {cost!r}")
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        self.block_size = block_size
        self.cost = cost
        self.overlap_weight = overlap_weight
        self.prefill_load_scale = prefill_load_scale
        self.credit = credit
        self.active_request_weight = active_request_weight
        self.temperature = temperature
        self.ttl_s = ttl_s
        self.rng = random.Random(seed)
        self.blocks: list[dict[int, float]] = [{} for _ in range(num_replicas)]  # hash -> expiry
        self.index = BlockIndex(num_replicas, block_size) if use_kv_events else None

    def overlap(self, worker: int, hashes: Sequence[int], now: float) -> int:
        if self.index is not None:
            return self.index.overlap(worker, hashes)
        held = self.blocks[worker]
        n = 0
        for h in hashes:
            if held.get(h, -1.0) < now:
                break
            n += 1
        return n

    def costs(self, isl: int, overlaps: Sequence[int], replicas: Sequence[ReplicaState]) -> list[float]:
        B = self.block_size
        if self.cost == "classic":
            return [classic_cost(isl, o, B, r.prefill_tokens, r.decode_blocks, self.overlap_weight)
                    for o, r in zip(overlaps, replicas, strict=True)]
        return [current_cost(isl, o, B, r.prefill_tokens, r.decode_blocks, r.active_requests,
                             self.prefill_load_scale, self.credit, self.active_request_weight)
                for o, r in zip(overlaps, replicas, strict=True)]

    def route(self, req: Request, replicas: Sequence[ReplicaState], now: float) -> Route:
        tokens = req.prompt_array
        hashes = chained_block_hashes(tokens, self.block_size)
        overlaps = [self.overlap(k, hashes, now) for k in range(self.num_replicas)]
        k = softmax_pick(self.costs(len(tokens), overlaps, replicas), self.temperature, self.rng)
        if self.index is None:
            expiry = now + self.ttl_s
            for h in hashes:
                self.blocks[k][h] = expiry
        predicted = min(overlaps[k] * self.block_size, len(tokens) - 1)
        return Route(k, predicted, "cache" if overlaps[k] else "load")

    def on_events(self, replica: int, seq: int, events: Sequence[Any], now: float) -> None:
        if self.index is not None:
            self.index.apply(replica, seq, events)
