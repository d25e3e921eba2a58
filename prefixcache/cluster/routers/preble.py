"""Preble's E2 scheduler (ICLR'25; WukLab/preble ``multi_node/global_scheduler_with_time.py``).

State: one global token tree whose nodes record the GPUs that hold them (``CharTree`` over
token ids as characters). For a request with ``cached`` tokens matched in the tree and ``new``
= the rest: **exploit** when ``new < cached`` (strict): the matched node's GPUs are the
candidates; otherwise **explore**: every GPU. The candidate of lowest cost wins (the first on
ties), where a GPU's cost is its load over the last ``window_s`` (the prefill time of the
tokens it had to compute for requests routed there, divided among the GPUs sharing each
prefix in Preble; here each request's miss counts on its own GPU) plus its decode load (active
requests x ``mean_output_tokens`` x the time a decoded token takes), plus this request's own
prefill there. Preble's rebalancing at 1.5x skew and prefix replication are not modelled, and
neither is its quirk of returning a candidate's position instead of its id (both said in the
paper's table of routers).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from prefixcache.cluster.routers.base import ReplicaState, Route, Router
from prefixcache.cluster.routers.char_tree import CharTree
from prefixcache.cost_model import CostModel
from prefixcache.request import Request


def as_text(tokens: Sequence[int]) -> str:
    """Token ids as code points, so the character tree serves as a token tree."""
    return "".join(map(chr, tokens))


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
        cost_model: CostModel | None = None,
    ) -> None:
        super().__init__(num_replicas, seed=seed)
        self.window_s = window_s
        self.mean_output_tokens = mean_output_tokens
        self.cost_model = cost_model if cost_model is not None else CostModel.measured()
        self.tree = CharTree()
        self._recent: list[deque[tuple[float, float]]] = [deque() for _ in range(num_replicas)]

    def load(self, gpu: int, active: int, now: float) -> float:
        window = self._recent[gpu]
        while window and window[0][0] < now - self.window_s:
            window.popleft()
        decode = active * self.mean_output_tokens * self.cost_model.decode_token_s
        return sum(seconds for _, seconds in window) + decode

    def route(self, req: Request, replicas: Sequence[ReplicaState], now: float) -> Route:
        tokens = req.prompt_token_ids
        text = as_text(tokens)
        m = self.tree.prefix_match(text)
        cached = m.matched_chars
        if exploits(cached, len(tokens) - cached) and m.owners:
            candidates, branch = list(m.owners), "exploit"
        else:
            candidates, branch = list(range(self.num_replicas)), "explore"
        prefill = self.cost_model.prefill_token_s
        misses = {g: len(tokens) - self.tree.tenant_match(text, g) for g in candidates}
        costs = {g: self.load(g, replicas[g].active_requests, now) + misses[g] * prefill for g in candidates}
        k = min(candidates, key=lambda g: (costs[g], g))
        self._recent[k].append((now, misses[k] * prefill))
        self.tree.insert(text, k, now)
        return Route(k, min(len(tokens) - misses[k], len(tokens) - 1), branch)
