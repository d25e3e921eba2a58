"""Ray Serve's ``PrefixCacheAffinityRouter`` (``request_router/prefix_aware/``): one character
tree shared by the replicas (an actor upstream; ``char_tree.CharTree`` here), prompts inserted
after routing. If the queues are skewed (``max - min > imbalanced_threshold``, absolute only),
power of two choices; otherwise, if the match rate is below ``match_rate_threshold`` (strict),
the replicas holding the fewest characters are the candidates, else the owners of the deepest
matched node; the candidate with the shortest queue wins (the first on ties)."""

from __future__ import annotations

import random
from collections.abc import Sequence

from prefixcache.cluster.routers.base import ReplicaState, Route, Router
from prefixcache.cluster.routers.char_tree import CharTree
from prefixcache.cluster.text import TokenText
from prefixcache.request import Request


class RayServePrefixAffinity(Router):
    name = "ray-serve"

    def __init__(
        self,
        num_replicas: int,
        *,
        seed: int = 0,
        imbalanced_threshold: int = 10,
        match_rate_threshold: float = 0.1,
        text: TokenText | None = None,
    ) -> None:
        super().__init__(num_replicas, seed=seed)
        self.imbalanced_threshold = imbalanced_threshold
        self.match_rate_threshold = match_rate_threshold
        self.text = text if text is not None else TokenText(seed)
        self.rng = random.Random(seed)
        self.tree = CharTree()

    def route(self, req: Request, replicas: Sequence[ReplicaState], now: float) -> Route:
        tokens = req.prompt_array  # spelled as text by numpy gathers
        text = self.text.text(tokens)
        queues = [r.active_requests for r in replicas]
        if max(queues) - min(queues) > self.imbalanced_threshold:
            pair = self.rng.sample(range(self.num_replicas), min(2, self.num_replicas))
            k, branch = min(pair, key=lambda i: (queues[i], i)), "power-of-two"
        else:
            m = self.tree.prefix_match(text)
            if m.matched_chars / len(text) < self.match_rate_threshold or not m.owners:
                fewest = min(self.tree.size.get(i, 0) for i in range(self.num_replicas))
                candidates = [i for i in range(self.num_replicas) if self.tree.size.get(i, 0) == fewest]
                branch = "fewest-chars"
            else:
                candidates, branch = list(m.owners), "cache"
            k = min(candidates, key=lambda i: (queues[i], i))
        predicted = self.text.tokens_within(tokens, self.tree.tenant_match(text, k))
        self.tree.insert(text, k, now)
        return Route(k, min(predicted, len(tokens) - 1), branch)
