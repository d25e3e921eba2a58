"""Request objects that ran are refused by the next engine (issue 29, item 3).

A Request carries its run: the output tokens appended, ``num_computed_tokens``,
``num_preemptions``. Handed to a second engine unchanged, it used to resume from there (radix:
hit rate 0.6646 and no output token instead of 0.72 and 100, no error). The engine refuses such a
request as it arrives, with the request's id and the way to get fresh ones; fresh copies give
exactly the first run's results.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterator

import pytest
from prefixcache.experiments.inputs.workloads import make_workload

from prefixcache import CacheConfig, PrefixCache, Request, RequestRecord, make_cache
from prefixcache.engine import Engine
from tests.helpers import tokens

BACKENDS = ["hashchain", "radix", "none"]


def cache_for(backend: str) -> PrefixCache:
    return make_cache(backend, CacheConfig(1 << 14, 16))


def rows(records: list[RequestRecord]) -> list[RequestRecord]:
    """Everything a record says but the wall time spent in cache calls."""
    return [dataclasses.replace(r, cache_op_ns=0) for r in records]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_second_run_of_the_same_request_objects_is_refused_naming_the_request(backend: str) -> None:
    reqs = make_workload("multi-turn-chat", seed=1).generate()
    Engine(cache_for(backend)).run(reqs)
    first = min(reqs, key=lambda r: r.arrival_time)
    message = rf"request {first.request_id!r} carries run state .*fresh Request objects"
    with pytest.raises(ValueError, match=message):
        Engine(cache_for(backend)).run(reqs)


@pytest.mark.parametrize("backend", BACKENDS)
def test_fresh_copies_taken_before_the_first_run_give_exactly_its_records(backend: str) -> None:
    reqs = make_workload("multi-turn-chat", seed=1).generate()
    spare = copy.deepcopy(reqs)  # the remedy the error names
    first_cache, second_cache = cache_for(backend), cache_for(backend)
    first = Engine(first_cache).run(reqs)
    second = Engine(second_cache).run(spare)
    assert rows(second) == rows(first)
    assert dataclasses.astuple(second_cache.stats) == dataclasses.astuple(first_cache.stats)
    assert sum(r.output_tokens for r in second) > 0


def ran_request(state: str, cache: PrefixCache) -> Request:
    req = Request("r", tokens(20), max_new_tokens=4)
    if state == "output tokens":
        req.append_output_token_ids([1, 2])
    elif state == "num_computed_tokens":
        req.num_computed_tokens = 5
    elif state == "num_preemptions":
        req.num_preemptions = 1
    else:  # live in the cache the engine drives
        assert cache.allocate(req, 1)
        req.num_computed_tokens = 0
    return req


STATES = ["output tokens", "num_computed_tokens", "num_preemptions", "live in the cache"]


@pytest.mark.parametrize("backend", ["hashchain", "radix"])
@pytest.mark.parametrize("state", STATES)
def test_each_kind_of_run_state_is_refused_as_the_request_arrives_and_adds_nothing(
    backend: str, state: str
) -> None:
    cache = cache_for(backend)
    engine = Engine(cache)
    req = ran_request(state, cache)
    with pytest.raises(ValueError, match=rf"'r' carries run state \(.*{state}"):
        engine.add_request(req)
    assert not engine.records and not engine.arrivals and not engine.has_unfinished()


def test_a_lazy_source_is_checked_request_by_request_without_building_deferred_prompts() -> None:
    built: list[str] = []

    def deferred(rid: str, seed: int) -> Request:
        def make() -> list[int]:
            built.append(rid)
            return tokens(32, seed=seed)

        return Request.deferred(rid, 32, make, max_new_tokens=2, arrival_time=float(seed))

    engine = Engine(cache_for("radix"))
    waiting = deferred("later", 9)
    engine.add_request(waiting)  # the check reads counters only: the prompt is still unbuilt
    assert built == []

    done = [deferred(f"t{i}", i) for i in range(3)]
    Engine(cache_for("radix")).run(iter(done))
    assert all(r.num_output_tokens == 2 for r in done)

    def source() -> Iterator[Request]:  # a trace reader that hands the same objects again
        yield from done

    with pytest.raises(ValueError, match=r"request 't0' carries run state \(2 output tokens"):
        Engine(cache_for("radix")).run(source())
