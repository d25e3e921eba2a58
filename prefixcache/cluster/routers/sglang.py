"""SGLang's cache-aware router (sgl-router, now sgl-model-gateway / smg ``cache_aware.rs``).

State: one approximate character tree shared by every worker (``char_tree.CharTree``), built
from routed prompt text only; a per-worker count of the requests it routed and that have not
finished. Rule for each request:

1. Load imbalanced (``max - min > balance_abs`` and ``max > balance_rel * min``): the least
   loaded worker (first on ties); the text is still inserted for it.
2. Otherwise match the text; ``rate = matched / len``. ``rate > cache_threshold`` (strict):
   the deepest matched node's first owner. Else the versions differ: ``version="old"``
   (sgl-router) takes the worker with the smallest tree, ``"gateway"`` (sgl-model-gateway
   @b93974f and smg) the least loaded one. Then insert.

Every ``eviction_interval_s`` the tree trims each worker to ``max_tree_size`` characters.
Defaults are the CLI's (0.3, 64, 1.5, 120 s, 2^26), not the Rust struct's (0.5, 32, 1.1, 30 s,
10 000), which the upstream unit tests use.
"""

from __future__ import annotations

from collections.abc import Sequence

from prefixcache.cluster.routers.base import ReplicaState, Route, Router, least_loaded
from prefixcache.cluster.routers.char_tree import CharTree
from prefixcache.cluster.text import TokenText
from prefixcache.request import Request

VERSIONS = ("gateway", "old")


class SGLangCacheAware(Router):
    name = "sglang"

    def __init__(
        self,
        num_replicas: int,
        *,
        seed: int = 0,
        version: str = "gateway",
        cache_threshold: float = 0.3,
        balance_abs: int = 64,
        balance_rel: float = 1.5,
        eviction_interval_s: float = 120.0,
        max_tree_size: int = 1 << 26,
        text: TokenText | None = None,
    ) -> None:
        super().__init__(num_replicas, seed=seed)
        if version not in VERSIONS:
            raise ValueError(f"version must be one of {VERSIONS}, got {version!r}")
        if not 0 <= cache_threshold <= 1:
            raise ValueError(f"cache_threshold must be in [0, 1], got {cache_threshold}")
        self.version = version
        self.cache_threshold = cache_threshold
        self.balance_abs = balance_abs
        self.balance_rel = balance_rel
        self.eviction_interval_s = eviction_interval_s
        self.max_tree_size = max_tree_size
        self.text = text if text is not None else TokenText(seed)
        self.tree = CharTree()
        self.load = [0] * num_replicas
        self._last_eviction = 0.0

    def is_imbalanced(self) -> bool:
        lo, hi = min(self.load), max(self.load)
        return hi - lo > self.balance_abs and hi > self.balance_rel * lo

    def route(self, req: Request, replicas: Sequence[ReplicaState], now: float) -> Route:
        if now - self._last_eviction >= self.eviction_interval_s:
            self.tree.evict_tenant_by_size(self.max_tree_size)
            self._last_eviction = now
        tokens = req.prompt_array  # spelled as text by numpy gathers
        text = self.text.text(tokens)
        if self.is_imbalanced():
            k, branch = least_loaded(self.load), "balance"
        else:
            m = self.tree.prefix_match(text, now)
            rate = m.matched_chars / len(text)
            if rate > self.cache_threshold and m.tenant is not None:
                k, branch = m.tenant, "cache"
            elif self.version == "old":
                k, branch = self.tree.smallest_tenant(list(range(self.num_replicas))), "smallest-tree"
            else:
                k, branch = least_loaded(self.load), "least-load"
        predicted = self.text.tokens_within(tokens, self.tree.tenant_match(text, k))
        self.tree.insert(text, k, now)
        self.load[k] += 1
        return Route(k, min(predicted, len(tokens) - 1), branch)

    def on_finish(self, req: Request, replica: int, now: float) -> None:
        self.load[replica] -= 1
