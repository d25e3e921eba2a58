"""Marconi's FLOP-aware eviction order (Pan et al., MLSys'25, arXiv 2411.19379, sec. 4.2), ours
after the paper: utility = recency + alpha x FLOP efficiency (FLOPs a cached prefix saves per
unit of memory it holds), both min-max normalised over the candidates; the lowest goes first."""

from __future__ import annotations

from collections.abc import Callable

from prefixcache.backends.radix.tree import TreeNode


def prefix_flops(num_tokens: int, n_linear: int, n_full: int, d_model: int) -> float:
    """FLOPs to recompute a prefix of ``num_tokens`` tokens, in units of one token through one
    layer's projections: every layer costs L, each attention layer adds its L^2 / 2 scores
    (with d_model-wide heads: L^2 / (2 d_model) units). Ours, after Marconi's FLOP accounting
    (arXiv 2411.19379, sec. 4.2: linear layers scale with L, attention quadratically)."""
    return (n_linear + n_full) * num_tokens + n_full * num_tokens * num_tokens / (2 * d_model)


def marconi_order(
    nodes: list[TreeNode],
    depth: Callable[[TreeNode], int],
    *,
    n_linear: int,
    n_full: int,
    state_units: int,
    alpha: float,
    d_model: int,
) -> list[TreeNode]:
    """``nodes`` lowest utility first. A node's memory is its state (``state_units``, if it holds
    one) plus its edge's KV (``len(key) x n_full`` units); the FLOPs it saves are those of the
    prefix up to its end (``depth``). Ties go to the older node, then the lower id."""
    if not nodes:
        return []

    def efficiency(node: TreeNode) -> float:
        flops = prefix_flops(depth(node), n_linear, n_full, d_model)
        memory = (state_units if node.mamba is not None else 0) + len(node.key) * n_full
        return flops / memory

    rec = [node.last_access_time for node in nodes]
    eff = [efficiency(node) for node in nodes]

    def norm(xs: list[float]) -> list[float]:
        lo, hi = min(xs), max(xs)
        return [0.0 if hi == lo else (x - lo) / (hi - lo) for x in xs]

    score = [r + alpha * e for r, e in zip(norm(rec), norm(eff), strict=True)]
    order = sorted(range(len(nodes)), key=lambda i: (score[i], rec[i], nodes[i].id))
    return [nodes[i] for i in order]
