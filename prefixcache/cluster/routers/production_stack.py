"""vLLM production-stack's ``prefixaware`` router (``routers/routing_logic.py``,
``prefix/hashtrie.py``): a trie of the prompt's ``chunk_chars``-character chunks (xxh64; the
last, partial chunk included), each node holding the endpoints that were routed through it.
Descend while the next chunk's node exists and is held by an available endpoint; the holders
at the deepest node are the candidates (every endpoint if none); pick one at random, then
insert the prompt for it. No load awareness and no eviction, as upstream."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

import xxhash

from prefixcache.cluster.routers.base import ReplicaState, Route, Router
from prefixcache.cluster.text import TokenText
from prefixcache.request import Request


@dataclass(eq=False)
class _TrieNode:
    children: dict[int, _TrieNode] = field(default_factory=dict)
    endpoints: set[int] = field(default_factory=set)


def chunk_hashes(text: str, chunk_chars: int) -> list[int]:
    chunks = (text[i : i + chunk_chars] for i in range(0, len(text), chunk_chars))
    return [xxhash.xxh64_intdigest(chunk.encode()) for chunk in chunks]


class ProductionStackPrefixAware(Router):
    name = "production-stack"

    def __init__(
        self, num_replicas: int, *, seed: int = 0, chunk_chars: int = 128, text: TokenText | None = None
    ) -> None:
        super().__init__(num_replicas, seed=seed)
        self.chunk_chars = chunk_chars
        self.text = text if text is not None else TokenText(seed)
        self.rng = random.Random(seed)
        self.root = _TrieNode()

    def longest_match(self, hashes: Sequence[int], available: set[int]) -> tuple[int, set[int]]:
        """(chunks matched, their holders among ``available``)."""
        node, depth, holders = self.root, 0, set(available)
        for h in hashes:
            child = node.children.get(h)
            if child is None or not child.endpoints & available:
                break
            node, depth, holders = child, depth + 1, child.endpoints & available
        return depth, holders

    def route(self, req: Request, replicas: Sequence[ReplicaState], now: float) -> Route:
        tokens = req.prompt_array  # spelled as text by numpy gathers
        text = self.text.text(tokens)
        hashes = chunk_hashes(text, self.chunk_chars)
        depth, holders = self.longest_match(hashes, set(range(self.num_replicas)))
        k = self.rng.choice(sorted(holders))
        node = self.root
        for h in hashes:
            node = node.children.setdefault(h, _TrieNode())
            node.endpoints.add(k)
        predicted = min(self.text.tokens_within(tokens, depth * self.chunk_chars), len(tokens) - 1)
        return Route(k, predicted, "cache" if depth else "random")
