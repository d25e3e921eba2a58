"""The engine over every registered backend and scheduler, through the PrefixCache contract."""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import fields
from typing import Any

import pytest
from prefixcache.experiments.inputs.workloads import available_workloads, make_workload

from prefixcache import (
    CacheConfig,
    Match,
    PrefixCache,
    Request,
    RequestRecord,
    available_backends,
    make_cache,
)
from prefixcache.cost_model import Clock, CostModel, named_clock
from prefixcache.engine import Engine
from prefixcache.scheduler import available_schedulers, dfs_weight_order, make_scheduler
from prefixcache.synthesis import simulated_tokens
from tests.helpers import tokens


def _importable(name: str) -> bool:
    try:
        make_cache(name, CacheConfig(64, 16))
    except ImportError:  # a backend still being written is registered before it imports
        return False
    return True


BACKENDS = [b for b in available_backends() if _importable(b)]
REUSING = [b for b in BACKENDS if b != "none"]
PAGE = 4


class InvariantEngine(Engine):
    """Checks the cache's invariants after every step, preemption steps included."""

    def step(self) -> int:
        n = super().step()
        self.cache.check_invariants()
        return n


def shared_prefix_requests(n: int = 6, prefix: int = 24, suffix: int = 10, out: int = 3) -> list[Request]:
    base = tokens(prefix, seed=1)
    return [Request(f"r{i}", base + tokens(suffix, seed=10 + i), max_new_tokens=out) for i in range(n)]


@pytest.mark.parametrize("scheduler", available_schedulers())
@pytest.mark.parametrize("backend", BACKENDS)
def test_every_request_finishes_with_its_output_and_releases_everything(backend: str, scheduler: str) -> None:
    cache = make_cache(backend, CacheConfig(64 * PAGE, PAGE))
    engine = InvariantEngine(cache, scheduler, token_budget=16)
    reqs = shared_prefix_requests()
    records = engine.run(reqs)
    assert all(r.finish_step is not None and r.output_tokens == 3 for r in records)
    assert all(r.num_output_tokens == 3 for r in reqs)
    assert cache.usage().in_use == 0 and not cache.live_requests
    if backend != "none":
        assert sum(r.hit_tokens for r in records) > 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_small_capacity_forces_preemption_and_everything_still_finishes(backend: str) -> None:
    cache = make_cache(backend, CacheConfig(12 * PAGE, PAGE))  # 44 usable tokens
    engine = InvariantEngine(cache, "fcfs", token_budget=64)
    reqs = [Request(f"r{i}", tokens(12, seed=i), max_new_tokens=12) for i in range(4)]
    records = engine.run(reqs)
    assert sum(r.preemptions for r in records) > 0
    assert all(r.finish_step is not None and r.output_tokens == 12 for r in records)
    assert [r.num_preemptions for r in reqs] == [r.preemptions for r in records]


@pytest.mark.parametrize("backend", BACKENDS)
def test_chunked_prefill_respects_the_token_budget(backend: str) -> None:
    cache = make_cache(backend, CacheConfig(64 * PAGE, PAGE))
    engine = InvariantEngine(cache, "fcfs", token_budget=8)
    req = Request("long", tokens(30), max_new_tokens=2)
    engine.add_request(req)
    computed = []
    while engine.has_unfinished():
        assert engine.step() <= 8
        computed.append(req.num_computed_tokens)
    rec = engine.records["long"]
    assert computed[:4] == [8, 16, 24, 30]  # ceil(30 / 8) prefill chunks, then decode
    assert rec.first_token_step == 3 and rec.computed_prefill_tokens == 30


def test_arrivals_are_honoured_and_the_idle_clock_jumps() -> None:
    cache = make_cache("none", CacheConfig(64 * PAGE, PAGE))
    engine = Engine(cache, "fcfs", token_budget=64)
    late = Request("late", tokens(8), arrival_time=100.0, max_new_tokens=1)
    early = Request("early", tokens(8, seed=2), arrival_time=1.0, max_new_tokens=1)
    records = {r.request_id: r for r in engine.run([late, early])}
    assert records["early"].admission_time == 1.0
    assert records["late"].admission_time == 100.0
    assert records["early"].finish_step < records["late"].admission_step


def matching(hit: Callable[[Request], int]) -> Callable[[Request], Match]:
    """A policy's lookup whose matches reuse ``hit(r)`` tokens (policies read only that)."""
    cache = make_cache("none", CacheConfig(64, 4))
    return lambda r: Match(cache, r, r.num_tokens, hit(r), 0)


@pytest.mark.parametrize("backend", REUSING)
def test_planned_outputs_are_emitted_and_reused_by_the_next_turn(backend: str) -> None:
    cache = make_cache(backend, CacheConfig(64 * PAGE, PAGE))
    engine = InvariantEngine(cache, "fcfs", token_budget=64)
    prompt, answer = tokens(20), tokens(8, seed=5)
    first = Request("t0", prompt, max_new_tokens=8, planned_output_ids=answer)
    second = Request("t1", prompt + answer + tokens(6, seed=6), arrival_time=10.0, max_new_tokens=1)
    records = engine.run([first, second])
    assert list(first.output_token_ids) == answer
    # the answer's KV is cached except its last token (never computed): 27 tokens, whole pages
    assert records[1].hit_tokens == 27 // PAGE * PAGE


def test_lpm_admits_the_longest_cached_prefix_first() -> None:
    cache = make_cache(REUSING[0], CacheConfig(64 * PAGE, PAGE)) if REUSING else None
    if cache is None:
        pytest.skip("no reusing backend registered yet")
    engine = Engine(cache, "fcfs", token_budget=64)
    cached = tokens(24, seed=1)
    engine.run([Request("warm", cached, max_new_tokens=0)])
    cold = Request("cold", tokens(30, seed=9))
    warm = Request("warm2", cached + tokens(6, seed=3))
    plan = make_scheduler("lpm").schedule([cold, warm], cache.lookup)
    assert [r.request_id for r in plan.order] == ["warm2", "cold"]
    assert make_scheduler("fcfs").schedule([cold, warm], cache.lookup).order == [cold, warm]


def test_lpm_holds_back_a_request_sharing_32_tokens_with_an_earlier_waiting_one() -> None:
    base = tokens(40, seed=4)
    a, b = Request("a", base + [1]), Request("b", base + [2])
    c = Request("c", tokens(40, seed=8))
    plan = make_scheduler("lpm").schedule([a, b, c], matching(lambda r: 0))
    assert plan.held_back == {"b"}
    assert [r.request_id for r in plan.order] == ["a", "c", "b"]
    short = [Request("x", base[:31] + [1]), Request("y", base[:31] + [2])]
    assert not make_scheduler("lpm").schedule(short, matching(lambda r: 0)).held_back


def test_lpm_falls_back_to_fcfs_above_128_waiting() -> None:
    reqs = [Request(f"r{i}", tokens(4, seed=i)) for i in range(129)]
    calls = []
    plan = make_scheduler("lpm").schedule(reqs, matching(lambda r: calls.append(r) or 0))
    assert plan.order == reqs and not calls


def test_dfs_weight_puts_the_heavier_subtree_first() -> None:
    x, y = tokens(8, seed=1), tokens(8, seed=2)
    reqs = [Request("y0", y + [0]), Request("x0", x + [0]), Request("x1", x + [1]), Request("x2", x + [2])]
    order = [r.request_id for r in dfs_weight_order(reqs)]
    assert order[:3] == ["x0", "x1", "x2"] and order[3] == "y0"


def test_offline_dfs_order_puts_a_request_before_the_ones_that_extend_it() -> None:
    """A chat turn is the prefix of the next: in the offline order it comes first, however many
    requests extend it (else the optimum would count hits on KV not yet computed)."""
    base = tokens(8, seed=1)
    turn1 = Request("turn1", base)
    deeper = [Request(f"turn2-{i}", base + tokens(4, seed=10 + i)) for i in range(3)]
    other = Request("other", tokens(8, seed=2))
    order = [r.request_id for r in dfs_weight_order([*deeper, other, turn1])]
    assert order == ["turn1", "turn2-0", "turn2-1", "turn2-2", "other"]


def test_dfs_weight_walks_the_cached_tree_heavier_subtree_first_unmatched_last() -> None:
    """SGLang's dfs-weight: requests hang where their cached prefix ends; a node's subtree runs
    before its own requests, and requests with no hit (at the root) come last in queue order."""
    x, y = tokens(8, seed=1), tokens(8, seed=2)
    reqs = [
        Request("new0", tokens(6, seed=3)),
        Request("y0", y + [0]),
        Request("x_node", x[:4] + [9, 9]),  # cached only up to x[:4]: the parent of the x group
        Request("x0", x + [0]),
        Request("x1", x + [1]),
        Request("new1", tokens(6, seed=4)),
    ]
    hits = {"new0": 0, "new1": 0, "y0": 8, "x_node": 4, "x0": 8, "x1": 8}
    plan = make_scheduler("dfs-weight").schedule(reqs, matching(lambda r: hits[r.request_id]))
    assert [r.request_id for r in plan.order] == ["x0", "x1", "x_node", "y0", "new0", "new1"]


def test_request_that_can_never_fit_is_rejected_not_crashed() -> None:
    cache = make_cache("none", CacheConfig(4 * PAGE, PAGE))
    records = Engine(cache, "fcfs", 64).run(
        [Request("big", tokens(40)), Request("ok", tokens(4), max_new_tokens=1)]
    )
    assert records[0].rejected and records[0].finish_step is None
    assert not records[1].rejected and records[1].finish_step is not None


def test_bad_engine_arguments_are_clear_errors() -> None:
    cache = make_cache("none", CacheConfig(64, 16))
    with pytest.raises(ValueError, match="token_budget"):
        Engine(cache, "fcfs", 0)
    with pytest.raises(ValueError, match="valid: dfs-weight, fcfs, lpm"):
        Engine(cache, "random", 16)


@pytest.mark.skipif(not REUSING, reason="no reusing backend registered yet")
@pytest.mark.parametrize("backend", REUSING)
def test_model_mode_greedy_tokens_do_not_depend_on_cache_hits(backend: str) -> None:
    torch = pytest.importorskip("torch")
    from prefixcache.model import Model, ModelConfig

    def generate(name: str) -> list[list[int]]:
        torch.manual_seed(0)
        config = CacheConfig(48 * PAGE, PAGE)
        model = Model(ModelConfig(vocab_size=97), config.num_pages, PAGE, attention_impl="reference")
        reqs = [Request(f"r{i}", r.prompt_token_ids, max_new_tokens=4) for i, r in enumerate(small_shared())]
        InvariantEngine(make_cache(name, config), "fcfs", 16, model=model).run(reqs)
        return [list(r.output_token_ids) for r in reqs]

    assert generate(backend) == generate("none")


def small_shared() -> list[Request]:
    base = tokens(14, seed=1, vocab=97)
    return [Request(f"s{i}", base + tokens(5, seed=20 + i, vocab=97)) for i in range(3)]


@pytest.mark.parametrize("seed", [0, 7, -5, 2**70 + 3])
def test_vectorised_simulated_tokens_equal_the_scalar_splitmix(seed: int) -> None:
    mask = (1 << 64) - 1

    def scalar(request_id: str, k: int, vocab: int) -> int:
        base = zlib.crc32(request_id.encode()) << 32
        x = (base ^ (seed + (k + 1) * 0x9E3779B97F4A7C15)) & mask
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
        return (x ^ (x >> 31)) % vocab

    for rid, vocab in (("r0", 32_000), ("trace-123", 7), ("x" * 40, 151_936)):
        assert simulated_tokens(seed, rid, 300, vocab) == [scalar(rid, k, vocab) for k in range(300)]


# ---------------------------------------------------------------- decode stretches
def _rows(records: list[RequestRecord]) -> list[dict[str, object]]:
    """The records as data, without the measured wall time of the cache calls."""
    return [{f.name: getattr(r, f.name) for f in fields(r) if f.name != "cache_op_ns"} for r in records]


def _cache_state(cache: PrefixCache[Any], probes: list[Request]) -> list[object]:
    """What a later request would see, ids included: each probe's match (tokens and the pages
    it would pin) and, for hashchain, the free queue's eviction order."""
    state: list[object] = [cache.usage(), cache.stats]
    for probe in probes:
        m: Any = cache.lookup(probe)
        if hasattr(m, "blocks"):
            pages = [b.block_id for b in m.blocks[0]]
        else:  # (the no-cache baseline's match holds nothing)
            pages = m.indices.tolist() if hasattr(m, "indices") else []
        state.append((m.tokens, pages))
    pool = getattr(cache, "block_pool", None)
    if pool is not None:
        state.append([b.block_id for b in pool.free_block_queue.get_all_free_blocks()])
    return state


def _run_workload(
    name: str, backend: str, page: int, capacity: int, multi_step: bool, clock: Clock | None = None,
    layout: str | None = None, **options: Any,
) -> tuple[Engine, list[object]]:
    cache = make_cache(backend, CacheConfig(capacity // page, page, layout=layout), **options)
    engine = Engine(cache, "fcfs", token_budget=512, multi_step=multi_step, cost_model=clock)
    records = engine.run(make_workload(name, seed=1).generate())
    prompts = [r.prompt_token_ids for r in make_workload(name, seed=1).generate()]
    probes = [Request(f"probe{i}", list(p)) for i, p in enumerate(prompts)]
    totals = (engine.clock, engine.step_count, engine.prefill_tokens, engine.decode_tokens)
    totals += (engine.peak_pages_in_use,)
    return engine, [_rows(records), totals, _cache_state(cache, probes)]


@pytest.mark.parametrize("capacity", [1 << 17, 12_288], ids=["ample", "tight"])
@pytest.mark.parametrize(("backend", "page"), [("hashchain", 16), ("radix", 16), ("radix", 1)])
@pytest.mark.parametrize("name", available_workloads())
def test_decode_stretches_change_no_record_and_no_cache_state(
    name: str, backend: str, page: int, capacity: int
) -> None:
    """Item 6 of issue 12: taking decode-only steps at once gives the step-by-step engine's
    records, clock, totals and cache state (pages and eviction order included)."""
    stepped, expected = _run_workload(name, backend, page, capacity, multi_step=False)
    stretched, got = _run_workload(name, backend, page, capacity, multi_step=True)
    assert got == expected
    assert stepped.stretched_steps == stepped.deferred_decode_steps == 0
    if page == 1:  # every decode step takes a page: no stretch, but runs take theirs at once
        assert stretched.stretched_steps == 0
    if stepped.decode_tokens:  # deferred decode steps, taken up exactly
        assert stretched.deferred_decode_steps > 0  # (rag's prompts exceed the tight p16 pool)


@pytest.mark.parametrize("capacity", [1 << 17, 24_576], ids=["ample", "tight"])  # (one window must fit)
@pytest.mark.parametrize(("layout", "page"), [("mamba-hybrid", 1), ("gemma3-like", 16)])
@pytest.mark.parametrize("name", available_workloads())
def test_hybrid_radix_decode_runs_change_no_record_and_no_cache_state(
    name: str, layout: str, page: int, capacity: int
) -> None:
    """A Mamba decode step takes only its KV slot, so a run of deferred decoders takes its
    slots at once as FULL's does; an SWA step may first free what slid out of its window, so
    SWA decoders are not deferred. Either way: the step-by-step engine's records, clock,
    totals and cache state."""
    stepped, expected = _run_workload(name, "radix", page, capacity, False, layout=layout)
    deferred, got = _run_workload(name, "radix", page, capacity, True, layout=layout)
    assert got == expected
    assert stepped.deferred_decode_steps == 0
    if layout == "gemma3-like":
        assert deferred.deferred_decode_steps == 0
    elif stepped.decode_tokens:
        assert deferred.deferred_decode_steps > 0


@pytest.mark.parametrize("capacity", [1 << 17, 12_288], ids=["ample", "tight"])
@pytest.mark.parametrize("backend", ["hashchain", "radix"])
@pytest.mark.parametrize("name", available_workloads())
def test_deferral_charges_a_context_reading_clock_as_step_by_step(
    name: str, backend: str, capacity: int
) -> None:
    """Under the GPU roofline clock each step costs its requests' context: deferred decoders
    (counted, not stepped) and decode stretches are charged the contexts the step-by-step
    engine sums request by request, so records, clock and cache state agree."""
    clock = named_clock("h100-llama3-8b")
    stepped, expected = _run_workload(name, backend, 16, capacity, False, clock)
    deferred, got = _run_workload(name, backend, 16, capacity, True, clock)
    assert got == expected
    if stepped.decode_tokens:
        assert deferred.deferred_decode_steps > 0


TIERS = {
    "hashchain-lru": ("hashchain", {"eviction_policy": "lru"}),
    "hashchain-arc": ("hashchain", {"eviction_policy": "arc", "block_size": 32}),
    "radix-write-through": ("radix", {"write_policy": "write_through"}),
    "radix-write-back": ("radix", {"write_policy": "write_back"}),
}


@pytest.mark.filterwarnings("ignore:HiCache host pool")
@pytest.mark.parametrize(("tier", "page"), [(t, 16) for t in sorted(TIERS)]
                         + [(t, 1) for t in sorted(TIERS) if t.startswith("radix")])
@pytest.mark.parametrize(
    "name", ["generated-shared-prefix", "multi-turn-chat", "react-agent", "tree-of-thought"]
)
def test_deferred_decode_steps_change_nothing_with_a_host_tier(name: str, tier: str, page: int) -> None:
    """The same with a host tier (stores in flight make the cache say no step is in place:
    the deferred decoders are then taken up and stepped one by one; at page size 1 a run's
    pages are taken at once while the pool is calm, copies in flight or not, as the decode
    batch takes them), in a pool tight enough to evict."""
    from prefixcache.tiers import HostTierConfig

    backend, fields_ = TIERS[tier]
    host = HostTierConfig(capacity_tokens=1 << 15, **fields_)  # type: ignore[arg-type]
    stepped, expected = _run_workload(name, backend, page, 12_288, False, host_tier=host)
    deferred, got = _run_workload(name, backend, page, 12_288, True, host_tier=host)
    assert got == expected
    assert deferred.deferred_decode_steps > 0


@pytest.mark.parametrize("name", ["prefix-repetition", "react-agent", "tree-of-thought"])
def test_no_decode_step_is_deferred_while_the_cache_says_none_is_in_place(name: str) -> None:
    """vLLM's offload of output blocks (``offload_prompt_only=False``) keeps its tier busy at
    every step, so hashchain never says a decode step is in place: the engine, which may defer
    a decoder only while the cache says so (``decode_in_place_now``), must step every decoder
    one by one, and give the step-by-step records. (Deferring them anyway happens to leave the
    same records here: the in-place steps store nothing. The count is what tells.)"""
    from prefixcache.tiers import HostTierConfig

    host = HostTierConfig(capacity_tokens=1 << 15, offload_prompt_only=False)
    stepped, expected = _run_workload(name, "hashchain", 16, 12_288, False, host_tier=host)
    deferred, got = _run_workload(name, "hashchain", 16, 12_288, True, host_tier=host)
    assert got == expected
    assert stepped.decode_tokens > 0
    assert deferred.deferred_decode_steps == 0


@pytest.mark.parametrize("rest", [5, 40], ids=["some-starve", "all-starve"])
def test_deferred_decoders_past_the_budget_wait_as_one_by_one(rest: int) -> None:
    """A step whose budget runs out before every decoder is served: the decoders past it
    decode nothing that step (deferred ones are taken up and stepped one by one). vLLM's
    async host load gets there: B, admitted first, computes nothing while its load is in
    flight, so the four requests admitted after it decode (deferred) under the budget of 8;
    once loaded, B's ``rest`` prompt tokens take part or all of it."""
    from prefixcache.tiers import HostLink, HostTierConfig

    def requests() -> list[Request]:
        flush = [Request(f"x{i}", tokens(96, seed=50 + i), max_new_tokens=2, arrival_time=1.0)
                 for i in range(3)]  # push A out of the device pool (its host copy stays)
        late = [Request(f"c{i}", tokens(3, seed=90 + i), max_new_tokens=60, arrival_time=2.0)
                for i in range(4)]
        b = Request("b", tokens(160, seed=1) + tokens(rest, seed=2), max_new_tokens=4, arrival_time=2.0)
        return [Request("a", tokens(160, seed=1), max_new_tokens=2), *flush, b, *late]

    runs = []
    for multi_step in (False, True):
        cache = make_cache("hashchain", CacheConfig(16 * 24, 16),
                           host_tier=HostTierConfig(capacity_tokens=16 * 200))
        engine = Engine(cache, "fcfs", token_budget=8, multi_step=multi_step,
                        host_link=HostLink(bandwidth_bytes_per_s=1e9, latency_s=0.05))
        runs.append((_rows(engine.run(requests())), engine.clock, engine.step_count))
        assert engine.records["b"].hit_tokens == 160 and cache.stats.host_hits > 0
        assert (engine.deferred_decode_steps > 0) == multi_step
    assert runs[0] == runs[1]


@pytest.mark.parametrize("page", [1, 16])
@pytest.mark.parametrize("name", ["multi-turn-chat", "tree-of-thought"])
def test_deferred_decode_steps_change_nothing_without_a_cache(name: str, page: int) -> None:
    """At page size 16 the deferred steps lie inside held pages; at 1 each run of them takes
    its pages at once (``take_decode_pages``), as the baseline's allocations one by one would."""
    stepped, expected = _run_workload(name, "none", page, 12_288, multi_step=False)
    deferred, got = _run_workload(name, "none", page, 12_288, multi_step=True)
    assert got == expected and deferred.deferred_decode_steps > 0


@pytest.mark.parametrize("backend", ["hashchain", "radix"])
@pytest.mark.parametrize("name", ["multi-turn-chat", "react-agent", "tree-of-thought"])
def test_decode_stretches_are_taken_where_arrivals_leave_gaps(name: str, backend: str) -> None:
    """The equivalence above is not vacuous: with arrivals spread out, most steps are skipped."""
    engine, _ = _run_workload(name, backend, 16, 1 << 17, multi_step=True)
    assert engine.stretched_steps > engine.step_count / 4


def _observable(cache: PrefixCache[Any], req: Request) -> tuple[object, ...]:
    return (cache.usage(), cache.stats, cache._index_version(), cache.page_table(req))


@pytest.mark.parametrize("crowded", [False, True], ids=["room", "no-free-page"])
@pytest.mark.parametrize("prompt_len", range(5, 13))
@pytest.mark.parametrize("backend", ["hashchain", "radix"])
def test_decode_steps_in_place_is_exact_and_tight(backend: str, prompt_len: int, crowded: bool) -> None:
    """``decode_steps_in_place`` single steps change nothing observable but the reservation;
    the step after them does (a page taken, or a full block published). ``no-free-page``: the
    rest of the pool holds evictable cache, so radix's in-page decode evicts (SGLang's
    alloc_decode) until a page is free."""
    cache = make_cache(backend, CacheConfig(64, PAGE))
    for i in range(cache.config.num_usable_pages if crowded else 0):  # one cached page each
        filler = Request(f"filler{i}", tokens(PAGE, seed=100 + i), max_new_tokens=1)
        assert cache.allocate(filler, PAGE)
        filler.num_computed_tokens = PAGE
        cache.commit(filler)
        cache.release(filler)
    saw_no_free_page = False
    req = Request("r", tokens(prompt_len), max_new_tokens=14)
    assert cache.decode_steps_in_place(req) == 0  # not live
    assert cache.allocate(req, prompt_len)
    assert cache.decode_steps_in_place(req) == 0  # reserved ahead of what is computed
    req.num_computed_tokens = prompt_len
    cache.commit(req)
    req.append_output_token_ids(1)
    taken = 0
    while req.num_output_tokens < 12:
        steps = cache.decode_steps_in_place(req)
        assert steps <= PAGE - 1
        saw_no_free_page |= cache.usage().free == 0
        before = _observable(cache, req)
        for _ in range(steps):
            assert cache.allocate(req, 1)
            req.num_computed_tokens += 1
            cache.commit(req)
            req.append_output_token_ids(1)
            assert _observable(cache, req) == before
        taken += steps
        assert cache.allocate(req, 1)
        req.num_computed_tokens += 1
        cache.commit(req)
        req.append_output_token_ids(1)
        if steps:
            assert _observable(cache, req) != before, "a step past the count changed nothing: not tight"
    assert taken > 0
    assert saw_no_free_page == crowded
    with pytest.raises(ValueError, match="change nothing"):
        cache.advance_in_place(req, PAGE)


@pytest.mark.parametrize("backend", ["hashchain", "radix"])
def test_decode_stretch_stops_where_a_request_arrives(backend: str) -> None:
    """A request arriving mid-decode is admitted at the step it would be without stretches."""
    dt = CostModel.measured().step_time(0, 1)  # the engine's default clock

    def requests() -> list[Request]:
        late = [
            Request(f"late{i}", tokens(6, seed=i), max_new_tokens=20, arrival_time=t * dt)
            for i, t in enumerate((9.5, 23.2, 40))
        ]
        return [Request("long", tokens(10), max_new_tokens=60), *late]

    runs = []
    for multi_step in (False, True):
        cache = make_cache(backend, CacheConfig(64, PAGE))
        engine = Engine(cache, "fcfs", token_budget=64, multi_step=multi_step)
        runs.append(_rows(engine.run(requests())))
        assert (engine.stretched_steps > 0) == multi_step
    assert runs[0] == runs[1]


def test_advance_in_place_refuses_what_it_may_not_take() -> None:
    cache = make_cache("hashchain", CacheConfig(64, PAGE))
    req = Request("r", tokens(6), max_new_tokens=8)
    with pytest.raises(ValueError, match="not live"):
        cache.advance_in_place(req, 1)
    assert cache.allocate(req, 6)
    req.num_computed_tokens = 6
    cache.commit(req)
    req.append_output_token_ids(1)
    assert cache.decode_steps_in_place(req) == 1  # token 6 fits block 1; token 7 would fill it
    with pytest.raises(ValueError, match=">= 1"):
        cache.advance_in_place(req, 0)
    with pytest.raises(ValueError, match="change nothing"):
        cache.advance_in_place(req, 2)
    cache.advance_in_place(req, 1)
    assert cache.reserved_tokens(req) == 7


@pytest.mark.parametrize("backend", ["hashchain", "radix"])
def test_num_tokens_now_is_the_length_stepping_one_by_one_gives(backend: str) -> None:
    """A caller stepping an engine by hand with deferral on (``defer_decoders``, as the cluster
    does) reads each running request's length through ``num_tokens_now``: at every step it is
    what a twin stepping every request one by one has, though the deferred requests' own
    ``num_tokens`` lag behind."""
    engines = []
    for defer in (True, False):
        reqs = make_workload("multi-turn-chat", seed=1, conversations=6, turns=3).generate()
        for r in reqs:
            r.max_new_tokens = 50
        engine = Engine(make_cache(backend, CacheConfig(1 << 15, 16)), "fcfs", 256, check_invariants=True)
        engine.defer_decoders(defer)
        for r in reqs:
            engine.add_request(r)
        engines.append(engine)
    deferring, stepping = engines
    lagged = 0
    while stepping.has_unfinished():
        now = {r.request_id: deferring.num_tokens_now(r) for r in deferring.running}
        assert now == {r.request_id: r.num_tokens for r in stepping.running}
        lagged += sum(deferring.num_tokens_now(r) != r.num_tokens for r in deferring.running)
        deferring.step()
        stepping.step()
    assert not deferring.has_unfinished() and lagged > 0
    deferring.defer_decoders(False)  # nothing left to take up; the records agree
    assert [_rows(deferring.records.values())] == [_rows(stepping.records.values())]


def test_cache_calls_are_timed_only_when_asked() -> None:
    """``time_cache_ops``: the wall time of the cache calls lands in each record's
    ``cache_op_ns`` when asked (the replay bench does); a plain run reads no clock for them and
    its records say 0 there, every other field unchanged."""
    runs = []
    for timed in (False, True):
        reqs = make_workload("multi-turn-chat", seed=0, conversations=3, turns=2).generate()
        engine = Engine(make_cache("radix", CacheConfig(1 << 14, 16)), "fcfs", 512, time_cache_ops=timed)
        runs.append(engine.run(reqs))
    plain, timed_records = runs
    assert all(r.cache_op_ns == 0 for r in plain)
    assert all(r.cache_op_ns > 0 for r in timed_records)
    assert _rows(plain) == _rows(timed_records)


def test_a_run_gives_the_collector_its_thresholds_back() -> None:
    """``run`` raises the collector's thresholds for its loop (millions of long-lived blocks at
    page size 1) and restores the caller's after, also when the run fails."""
    import gc

    before = gc.get_threshold()
    cache = make_cache("hashchain", CacheConfig(64, 1))
    Engine(cache, "fcfs").run([Request("a", list(range(20)), max_new_tokens=3)])
    assert gc.get_threshold() == before

    class Boom(Exception):
        pass

    def fail(_: Request) -> None:
        raise Boom

    broken = make_cache("hashchain", CacheConfig(64, 1))
    broken.lookup = fail  # type: ignore[method-assign]
    with pytest.raises(Boom):
        Engine(broken, "fcfs").run([Request("b", list(range(20)), max_new_tokens=3)])
    assert gc.get_threshold() == before
