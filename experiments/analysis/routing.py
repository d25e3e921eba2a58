"""What a routing run shows (REFERENCE-routing.md section 5), from ``Cluster.run``'s records.

- hit rate, global and per replica: reused prompt tokens / prompt tokens, requests too large
  for their replica left out (as every rate in ``metrics``);
- the router's prediction error: predicted minus actually reused tokens, as a signed mean and
  a mean absolute error, with false hits (predicted > 0, reused 0) and missed hits (predicted
  0, reused > 0) as shares of the requests; split in two: what the router believed against what
  the chosen cache held when it decided (its state: unseen evictions, text-vs-token mismatch,
  expired history), and what the cache held then against what the request reused at admission
  (what changed while it queued: other requests' evictions and commits);
- load imbalance over time: the time-weighted mean of max/mean active requests per replica and
  of their coefficient of variation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def served(rows: Sequence[Any]) -> list[Any]:
    return [r for r in rows if not r.rejected]


def hit_rates(rows: Sequence[Any], num_replicas: int) -> dict[str, Any]:
    ok = served(rows)
    prompt = sum(r.prompt_tokens for r in ok)
    per = []
    for k in range(num_replicas):
        mine = [r for r in ok if r.replica == k]
        tokens = sum(r.prompt_tokens for r in mine)
        per.append(sum(r.hit_tokens for r in mine) / tokens if tokens else float("nan"))
    return {
        "token_hit_rate": sum(r.hit_tokens for r in ok) / prompt if prompt else float("nan"),
        "request_hit_rate": sum(1 for r in ok if r.hit_tokens > 0) / len(ok) if ok else float("nan"),
        "per_replica_hit_rate": per,
    }


def prediction_error(rows: Sequence[Any]) -> dict[str, float]:
    ok = served(rows)
    if not ok:
        raise ValueError("no served request to measure a prediction on")
    pred = np.array([r.predicted_tokens for r in ok], dtype=float)
    held = np.array([r.cached_at_route for r in ok], dtype=float)
    got = np.array([r.hit_tokens for r in ok], dtype=float)
    return {
        "signed_mean": float((pred - got).mean()),
        "mae": float(np.abs(pred - got).mean()),
        "false_hits": float(((pred > 0) & (got == 0)).mean()),
        "missed_hits": float(((pred == 0) & (got > 0)).mean()),
        "state_signed_mean": float((pred - held).mean()),  # the router's belief vs the cache
        "state_mae": float(np.abs(pred - held).mean()),
        "queue_signed_mean": float((held - got).mean()),  # the cache at routing vs at admission
        "queue_mae": float(np.abs(held - got).mean()),
    }


def active_over_time(load_events: Sequence[tuple[float, int, int]], num_replicas: int) -> tuple[Any, Any]:
    """(times, active requests per replica from each time on) from ``Cluster.load_events``,
    put in time order first (a finish is logged when its step ends, possibly after an arrival
    routed during that step)."""
    ordered = sorted(load_events, key=lambda e: e[0])  # stable: same-time events keep their order
    times = np.array([t for t, _, _ in ordered])
    delta = np.zeros((len(ordered), num_replicas))
    for i, (_, k, d) in enumerate(ordered):
        delta[i, k] = d
    return times, np.cumsum(delta, axis=0)


def imbalance(load_events: Sequence[tuple[float, int, int]], num_replicas: int) -> dict[str, float]:
    """Time-weighted over the run: each state holds until the next event; instants with no
    active request carry no imbalance and are left out."""
    nan = {"max_over_mean": float("nan"), "cv": float("nan")}
    if len(load_events) < 2:
        return nan
    times, active = active_over_time(load_events, num_replicas)
    if active.min() < 0:
        raise ValueError("a replica finished more requests than were routed to it")
    dt = np.diff(times)
    active = active[:-1]
    mean = active.mean(axis=1)
    busy = (mean > 0) & (dt > 0)
    if not busy.any():
        return nan
    w = dt[busy]
    ratio = active[busy].max(axis=1) / mean[busy]
    cv = active[busy].std(axis=1) / mean[busy]
    return {"max_over_mean": float(np.average(ratio, weights=w)), "cv": float(np.average(cv, weights=w))}
