"""llm-d's inference scheduler (llm-d ``pkg/plugins/scorer``, Gateway API Inference Extension
``scorer/{queue,kvcache_utilization}.go``, ``prefix/plugin.go``).

Each scorer gives every pod a score in [0, 1]; the pod with the highest weighted sum wins (ties
at random, seeded; ``tie_break="round-robin"`` for the newer rule). Scorers:

- ``prefix`` (approximate, the GIE prefix plugin): the prompt's bytes in ``block_chars``-byte
  blocks (a tail shorter than a block is dropped, at most ``max_blocks``), chained xxh64, with
  block 0 the model's hash; each pod keeps an LRU of the last ``lru_capacity`` block hashes
  routed to it; score = consecutive blocks held from block 0 / blocks. The picked pod's blocks
  are added after the pick. ``prefix="precise"`` (llm-d's precise prefix-cache scorer) reads
  an exact index fed by the pods' KV events instead (``event_index.BlockIndex``, blocks of the
  engine's ``block_size``): consecutive blocks held from block 0, min-max normalised over pods.
- ``queue``: ``(max_q - q) / (max_q - min_q)``, 1 for every pod if all queues are equal.
- ``kv``: ``1 - kv_usage``.
- ``load-aware``: 0.5 if the queue is empty, else ``0.5 * (1 - min(q, 128) / 128)``.

Default weights: prefix 3, queue 2, kv 2 (the llm-d guides' profile).
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import xxhash

from prefixcache.cluster.routers.base import ReplicaState, Route, Router, chained_block_hashes
from prefixcache.cluster.routers.event_index import BlockIndex
from prefixcache.cluster.text import TokenText
from prefixcache.request import Request

SCORERS = ("prefix", "queue", "kv", "load-aware")
DEFAULT_WEIGHTS = {"prefix": 3.0, "queue": 2.0, "kv": 2.0}


def queue_scores(queues: Sequence[int]) -> list[float]:
    lo, hi = min(queues), max(queues)
    return [1.0] * len(queues) if hi == lo else [(hi - q) / (hi - lo) for q in queues]


def load_aware_score(queue: int, threshold: int = 128) -> float:
    return 0.5 if queue == 0 else 0.5 * (1 - min(queue, threshold) / threshold)


def prompt_block_hashes(text: str, model: str, block_chars: int = 64, max_blocks: int = 256) -> list[int]:
    """Block 0 = the model's hash; then each full ``block_chars``-byte block, chained."""
    data = text.encode()
    parent = xxhash.xxh64_intdigest(model.encode())
    out = [parent]
    for start in range(0, len(data) - block_chars + 1, block_chars):
        if len(out) >= max_blocks:
            break
        parent = xxhash.xxh64_intdigest(parent.to_bytes(8, "little") + data[start : start + block_chars])
        out.append(parent)
    return out


class LLMD(Router):
    name = "llm-d"

    def __init__(
        self,
        num_replicas: int,
        *,
        seed: int = 0,
        weights: Mapping[str, float] | None = None,
        block_chars: int = 64,
        max_blocks: int = 256,
        lru_capacity: int = 31_250,
        model: str = "model",
        tie_break: str = "random",
        text: TokenText | None = None,
        prefix: str = "approximate",
        block_size: int = 16,
    ) -> None:
        super().__init__(num_replicas, seed=seed)
        self.weights = dict(DEFAULT_WEIGHTS if weights is None else weights)
        unknown = set(self.weights) - set(SCORERS)
        if unknown:
            raise ValueError(f"unknown llm-d scorers {sorted(unknown)}; known: {SCORERS}")
        if tie_break not in ("random", "round-robin"):
            raise ValueError(f"tie_break must be 'random' or 'round-robin', got {tie_break!r}")
        self.block_chars = block_chars
        self.max_blocks = max_blocks
        self.lru_capacity = lru_capacity
        self.model = model
        self.tie_break = tie_break
        if prefix not in ("approximate", "precise"):
            raise ValueError(f"prefix must be 'approximate' or 'precise', got {prefix!r}")
        self.index = BlockIndex(num_replicas, block_size) if prefix == "precise" else None
        self.text = text if text is not None else TokenText(seed)
        self.rng = random.Random(seed)
        self._rr = 0
        self.lru: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(num_replicas)]

    def prefix_scores(self, hashes: Sequence[int]) -> list[float]:
        out = []
        for lru in self.lru:
            n = 0
            for h in hashes:
                if h not in lru:
                    break
                n += 1
            out.append(n / len(hashes))
        return out

    def totals(self, scores: Mapping[str, Sequence[float]]) -> list[float]:
        return [sum(self.weights[s] * scores[s][k] for s in self.weights) for k in range(self.num_replicas)]

    def pick(self, totals: Sequence[float]) -> int:
        best = max(totals)
        tied = [k for k, t in enumerate(totals) if t == best]
        if len(tied) == 1:
            return tied[0]
        if self.tie_break == "random":
            return self.rng.choice(tied)
        self._rr += 1
        return tied[self._rr % len(tied)]

    def route(self, req: Request, replicas: Sequence[ReplicaState], now: float) -> Route:
        if self.index is not None:
            return self._route_precise(req, replicas)
        tokens = req.prompt_array  # spelled as text by numpy gathers
        text = self.text.text(tokens)
        hashes = prompt_block_hashes(text, self.model, self.block_chars, self.max_blocks)
        scores = {"prefix": self.prefix_scores(hashes), **self.load_scores(replicas)}
        k = self.pick(self.totals(scores))
        matched = round(scores["prefix"][k] * len(hashes))
        lru = self.lru[k]
        for h in hashes:
            lru[h] = None
            lru.move_to_end(h)
        while len(lru) > self.lru_capacity:
            lru.popitem(last=False)
        # Block 0 is the model, not text: the blocks after it stand for the prompt's characters.
        chars = max(matched - 1, 0) * self.block_chars
        predicted = min(self.text.tokens_within(tokens, chars), len(tokens) - 1)
        return Route(k, predicted, "cache" if matched > 1 else "load")

    def load_scores(self, replicas: Sequence[ReplicaState]) -> dict[str, list[float]]:
        queues = [r.waiting for r in replicas]
        return {"queue": queue_scores(queues), "kv": [1 - r.kv_usage for r in replicas],
                "load-aware": [load_aware_score(q) for q in queues]}

    def _route_precise(self, req: Request, replicas: Sequence[ReplicaState]) -> Route:
        assert self.index is not None
        tokens = req.prompt_array
        hashes = chained_block_hashes(tokens, self.index.block_size)
        overlaps = [self.index.overlap(k, hashes) for k in range(self.num_replicas)]
        lo, hi = min(overlaps), max(overlaps)
        prefix = [0.0 if hi == lo else (o - lo) / (hi - lo) for o in overlaps]
        k = self.pick(self.totals({"prefix": prefix, **self.load_scores(replicas)}))
        predicted = min(overlaps[k] * self.index.block_size, len(tokens) - 1)
        return Route(k, predicted, "cache" if overlaps[k] else "load")

    def on_events(self, replica: int, seq: int, events: Sequence[Any], now: float) -> None:
        if self.index is not None:
            self.index.apply(replica, seq, events)
