"""Preble's E2 scheduler (ICLR'25; WukLab/preble ``multi_node/global_scheduler_with_time.py``).

State: one global token tree whose nodes record the GPUs that hold them (``CharTree`` over
token ids as characters). For a request with ``cached`` tokens matched in the tree and ``new``
= the rest: **exploit** when ``new < cached`` (strict): the matched node's GPUs are the
candidates; otherwise **explore**: every GPU. The candidate of lowest cost wins (the first on
ties), where a GPU's cost is its load over the last ``window_s`` (the prefill time of the
tokens it had to compute for requests routed there, divided among the GPUs sharing each
prefix in Preble; here each request's miss counts on its own GPU) plus its decode load (active
requests x the time an answer of ``mean_output_tokens`` takes), plus this request's own
prefill there, each timed by the cluster's clock (``saturated_request_s``). Preble's
rebalancing at 1.5x skew and prefix replication are not modelled, and neither is its quirk
of returning a candidate's position instead of its id (both said in the paper's table of
routers).
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from prefixcache.cluster.routers.base import ReplicaState, Route, Router
from prefixcache.cluster.routers.char_tree import CharTree
from prefixcache.cost_model import Clock, CostModel
from prefixcache.request import Request


def as_text(tokens: Sequence[int] | np.ndarray) -> str:
    """Token ids as code points, so the character tree serves as a token tree: ``"".join(map(chr,
    tokens))`` decoded in one C call (UTF-32, lone surrogates passed), the same ValueError for an
    id that is no code point."""
    ids = np.asarray(tokens, dtype=np.int64)
    if ids.size and (ids.min() < 0 or ids.max() > sys.maxunicode):
        raise ValueError(f"chr() arg not in range(0x110000): token ids {ids.min()}..{ids.max()}")
    return ids.astype("<u4").tobytes().decode("utf-32-le", "surrogatepass")


def exploits(cached: int, new: int) -> bool:
    return new < cached


class PrebleE2(Router):
    name = "preble"

    def __init__(
        self,
        num_replicas: int,
        *,
        seed: int = 0,
        window_s: float = 180.0,
        mean_output_tokens: float = 256.0,
        cost_model: Clock | None = None,
        token_budget: int = 2048,
    ) -> None:
        """cost_model: the clock a route is costed by; None takes the cluster's at ``attach``
        (Preble profiles the engine it serves), or the measured CPU clock outside a cluster."""
        super().__init__(num_replicas, seed=seed)
        self.window_s = window_s
        self.mean_output_tokens = mean_output_tokens
        self._own_clock = cost_model is not None
        self.cost_model: Clock = cost_model if cost_model is not None else CostModel.measured()
        self.token_budget = token_budget
        self.tree = CharTree()
        self._recent: list[deque[tuple[float, float]]] = [deque() for _ in range(num_replicas)]

    def attach(self, cluster: Any) -> None:
        if not self._own_clock:
            self.cost_model, self.token_budget = cluster.cost_model, cluster.token_budget

    def prefill_s(self, tokens: int) -> float:
        """Seconds ``tokens`` prefilled add to a busy engine (the clock's own cost, so the linear
        CPU clock gives Preble's per-token profile and the roofline its GPU cost)."""
        return self.cost_model.saturated_request_s(tokens, 0, self.token_budget)

    def load(self, gpu: int, active: int, now: float) -> float:
        window = self._recent[gpu]
        while window and window[0][0] < now - self.window_s:
            window.popleft()
        answer_s = self.cost_model.saturated_request_s(0, round(self.mean_output_tokens), self.token_budget)
        return sum(seconds for _, seconds in window) + active * answer_s

    def route(self, req: Request, replicas: Sequence[ReplicaState], now: float) -> Route:
        tokens = req.prompt_array
        text = as_text(tokens)
        m = self.tree.prefix_match(text)
        cached = m.matched_chars
        if exploits(cached, len(tokens) - cached) and m.owners:
            candidates, branch = list(m.owners), "exploit"
        else:
            candidates, branch = list(range(self.num_replicas)), "explore"
        misses = {g: len(tokens) - self.tree.tenant_match(text, g) for g in candidates}
        costs = {g: self.load(g, replicas[g].active_requests, now) + self.prefill_s(misses[g])
                 for g in candidates}
        k = min(candidates, key=lambda g: (costs[g], g))
        self._recent[k].append((now, self.prefill_s(misses[k])))
        self.tree.insert(text, k, now)
        return Route(k, min(len(tokens) - misses[k], len(tokens) - 1), branch)
