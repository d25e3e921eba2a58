"""The routing metrics of experiments/analysis/routing.py on hand-made records."""

from __future__ import annotations

import pytest
from prefixcache.experiments.analysis.routing import hit_rates, imbalance, prediction_error

from prefixcache.cluster import RouteRecord


def row(replica: int, prompt: int, predicted: int, held: int, hit: int | None) -> RouteRecord:
    return RouteRecord(f"r{replica}{prompt}{predicted}{held}", replica, 0.0, prompt, "x", predicted, held,
                       hit_tokens=hit, rejected=hit is None)


def test_prediction_error_splits_router_state_from_what_changed_while_queued() -> None:
    rows = [row(0, 100, 50, 50, 50), row(1, 100, 80, 0, 0), row(0, 100, 0, 40, 40), row(1, 100, 30, 30, 10),
            row(0, 100, 90, 90, None)]  # the rejected one counts nowhere
    e = prediction_error(rows)
    assert e["signed_mean"] == pytest.approx((0 + 80 - 40 + 20) / 4)
    assert e["mae"] == pytest.approx((0 + 80 + 40 + 20) / 4)
    assert e["false_hits"] == 0.25 and e["missed_hits"] == 0.25
    assert e["state_signed_mean"] == pytest.approx((0 + 80 - 40 + 0) / 4)
    assert e["queue_signed_mean"] == pytest.approx((0 + 0 + 0 + 20) / 4)
    with pytest.raises(ValueError):
        prediction_error([row(0, 10, 0, 0, None)])


def test_hit_rates_global_and_per_replica() -> None:
    rows = [row(0, 100, 0, 0, 50), row(1, 300, 0, 0, 0), row(0, 100, 0, 0, 100)]
    h = hit_rates(rows, 3)
    assert h["token_hit_rate"] == pytest.approx(150 / 500)
    assert h["request_hit_rate"] == pytest.approx(2 / 3)
    assert h["per_replica_hit_rate"][:2] == [pytest.approx(0.75), 0.0]
    assert h["per_replica_hit_rate"][2] != h["per_replica_hit_rate"][2]  # nan: served nothing


def test_imbalance_is_time_weighted_over_events_put_in_time_order() -> None:
    # 0-1 s: (2, 0); 1-4 s: (1, 1); then idle. The finish at 4 s is logged before the arrival
    # at 1 s (its step began earlier): the metric must put them in time order.
    events = [(0.0, 0, 1), (0.0, 0, 1), (4.0, 0, -1), (1.0, 1, 1), (1.0, 0, -1), (4.0, 1, -1), (5.0, 0, 1),
              (6.0, 0, -1)]
    m = imbalance(events, 2)
    # 1 s at max/mean 2 and cv 1, 3 s balanced, 4-5 s idle (left out), 5-6 s at max/mean 2 and cv 1
    assert m["max_over_mean"] == pytest.approx((2 * 1 + 1 * 3 + 2 * 1) / 5)
    assert m["cv"] == pytest.approx((1 * 1 + 0 * 3 + 1 * 1) / 5)
    with pytest.raises(ValueError, match="finished more"):
        imbalance([(0.0, 0, -1), (1.0, 0, 1)], 2)
