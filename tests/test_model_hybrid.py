"""Model mode for a hybrid layout: full and sliding-window layers, each KV group with its own
page tables (``cache.kv_groups()`` / ``cache.page_tables(req)``).

Two layers of proof. (a) A small fake cache with hand-made page tables (a full group and a
sliding-window group in separate pools, as SGLang's full and SWA pools; entries left of the
window 0, as vLLM's null block): cached KV gives the logits of recompute, and a page that left
the window may be freed and overwritten with garbage without changing a bit. (b) The real
backends with a hybrid ``CacheConfig.layout``, cache hit against a no-hit recompute, skipped
while a backend does not yet give hybrid ``kv_groups``.

The window follows vLLM 0.33.0's ``sliding_window`` (a token sees itself and the W - 1 before
it; see tests/test_kernel_window.py). Pools start as NaN: reading a page nobody wrote shows.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from prefixcache import CacheConfig, PrefixCache, Request, make_cache
from prefixcache.interface import KVGroup
from prefixcache.layout import ModelLayout
from prefixcache.model import Model, ModelConfig, SeqChunk
from tests.helpers import tokens

pytestmark = pytest.mark.kernel

CONFIG = ModelConfig(vocab_size=512, n_layers=2, dim=64, n_heads=4, n_kv_heads=2, intermediate_size=172)
LOGITS_TOL = dict(atol=1e-4, rtol=1e-4)  # as tests/test_model.py: only summation order differs
WINDOW = 10  # not a multiple of the page
PAGE = 4
LAYOUT = ModelLayout.parse([("sliding_window", WINDOW), ("full",)])  # gpt-oss's alternation
DENSE = ModelLayout.parse([("full",)] * 2)  # the same model without windows
# Three layers where a group must hold two (the structural tests only: they run no prefill).
CONFIG3 = ModelConfig(vocab_size=512, n_layers=3, dim=64, n_heads=4, n_kv_heads=2, intermediate_size=172)
LAYOUT3 = ModelLayout.parse([("sliding_window", WINDOW), ("full",), ("sliding_window", WINDOW)])
FULL, SWA = 0, 1  # group indices of the fake cache
SHARED, TAIL = 20, 9  # B shares its first 20 tokens (5 pages) with A, then has 9 of its own


class FakeHybridCache:
    """Just the two methods model mode uses, over hand-made page tables: group 0 the full
    attention layers in pool "full", group 1 the sliding-window layers in pool "swa"."""

    def __init__(self, layout: ModelLayout = LAYOUT, full_pages: int = 40, swa_pages: int = 30) -> None:
        self.config = CacheConfig(full_pages * PAGE, PAGE, layout=layout)
        full_layers = tuple(i for i, layer in enumerate(layout.layers) if layer.kind == "full")
        swa_layers = tuple(i for i, layer in enumerate(layout.layers) if layer.kind == "sliding_window")
        self.groups = (KVGroup("full", None, "full", PAGE, full_pages, full_layers),)
        if swa_layers:
            window = layout.layers[swa_layers[0]].window
            self.groups += (KVGroup("sliding_window", window, "swa", PAGE, swa_pages, swa_layers),)
        # Page 0 is the null page; hand out the others from the back, so ids are not in order.
        self.free = {g.pool: list(range(1, g.num_pages)) for g in self.groups}
        self.tables: dict[str, list[list[int]]] = {}

    def kv_groups(self) -> tuple[KVGroup, ...]:
        return self.groups

    def page_tables(self, req: Request) -> list[list[int]]:
        return self.tables[req.request_id]

    def alloc(self, pool: str, n: int) -> list[int]:
        free = self.free[pool]
        assert 0 <= n <= len(free), f"fake pool {pool!r} ran out"
        pages, self.free[pool] = free[len(free) - n :][::-1], free[: len(free) - n]
        return pages

    def grow(self, req: Request, num_tokens: int) -> None:
        """Give ``req`` pages for ``num_tokens`` tokens in every group."""
        tables = self.tables.setdefault(req.request_id, [[] for _ in self.groups])
        for group, table in zip(self.groups, tables, strict=True):
            table += self.alloc(group.pool, -(-num_tokens // PAGE) - len(table))

    def free_left_of_window(self, model: Model, req: Request, next_pos: int) -> int:
        """Free the sliding-window pages wholly left of the window of the query at ``next_pos``
        (as vLLM's remove_skipped_blocks / SGLang's free_swa): table entry 0, the page back in
        the pool and overwritten with NaN, as if reused. Returns how many were freed."""
        freed = 0
        for g, group in enumerate(self.groups):
            if group.window is None:
                continue
            table = self.tables[req.request_id][g]
            for i in range(max(0, next_pos - group.window + 1) // PAGE):
                if table[i] != 0:
                    poison(model, group, table[i])
                    self.free[group.pool].append(table[i])
                    table[i] = 0
                    freed += 1
        return freed


def poison(model: Model, group: KVGroup, page: int) -> None:
    for layer in group.layers:
        model.k_caches[layer][page] = float("nan")
        model.v_caches[layer][page] = float("nan")


def nan_model(cache: object, **kwargs: object) -> Model:
    model = Model.for_cache(CONFIG, cache, seed=0, **kwargs)  # type: ignore[arg-type]
    for k_cache, v_cache in zip(model.k_caches, model.v_caches, strict=True):
        k_cache.fill_(float("nan"))
        v_cache.fill_(float("nan"))
    return model


def run(model: Model, cache: FakeHybridCache, req: Request, start: int, n: int) -> torch.Tensor:
    """Compute ``req``'s tokens [start, start + n) over its tables; logits [vocab] at the last."""
    cache.grow(req, start + n)
    tables = cache.page_tables(req)
    return model.step([SeqChunk(req.all_token_ids[start : start + n], start, tables[0], tables)])[0]


def recompute(prompt: list[int], layout: ModelLayout = LAYOUT, **kwargs: object) -> torch.Tensor:
    """Logits [vocab] at the last token of ``prompt``, one prefill in a fresh model and cache."""
    cache = FakeHybridCache(layout)
    req = Request("recompute", prompt)
    return run(nan_model(cache, **kwargs), cache, req, 0, len(prompt))


def prompts() -> tuple[list[int], list[int]]:
    a = tokens(SHARED + 6, seed=1, vocab=CONFIG.vocab_size)
    return a, a[:SHARED] + tokens(TAIL, seed=2, vocab=CONFIG.vocab_size)


def share_prefix(cache: FakeHybridCache, model: Model, a: Request, b: Request, hit: int) -> None:
    """Give ``b`` the first ``hit`` tokens' pages of ``a`` in every group (a cache hit); the
    sliding-window pages left of b's first new token's window are not handed over (0)."""
    for g, group in enumerate(cache.groups):
        reused = cache.tables[a.request_id][g][: hit // PAGE]
        if group.window is not None:
            skipped = max(0, hit - group.window + 1) // PAGE
            reused = [0] * skipped + reused[skipped:]
        cache.tables.setdefault(b.request_id, [[] for _ in cache.groups])[g] = list(reused)
    cache.free_left_of_window(model, a, hit)  # a is done: its pages left of b's window go


# %%
# (a) The fake cache: hand-made tables
# ------------------------------------


@pytest.mark.parametrize("attention_impl", ["triton", "reference"])
def test_hybrid_cache_hit_gives_the_logits_of_recompute(attention_impl: str) -> None:
    cache = FakeHybridCache()
    model = nan_model(cache, attention_impl=attention_impl)
    prompt_a, prompt_b = prompts()
    a, b = Request("a", prompt_a), Request("b", prompt_b)
    run(model, cache, a, 0, len(prompt_a))
    share_prefix(cache, model, a, b, SHARED)
    assert cache.tables["b"][SWA][:2] == [0, 0], "positions < 11 left b's first window: null pages"
    logits = run(model, cache, b, SHARED, TAIL)
    assert torch.isfinite(logits).all(), "NaN logits: the model read a page left of the window"
    expected = recompute(prompt_b, attention_impl=attention_impl)
    torch.testing.assert_close(logits, expected, **LOGITS_TOL)


def test_hybrid_chunked_prefill_and_decode_free_as_they_go() -> None:
    """Every step first frees the window pages it no longer needs (poisoned, reused); each
    step's logits are a full recompute's, decode steps included."""
    cache = FakeHybridCache()
    model = nan_model(cache)
    prompt = tokens(23, seed=3, vocab=CONFIG.vocab_size)
    req = Request("r", prompt)
    done, freed = 0, 0
    for n in (5, 8, 10, 1, 1):  # prefill in three chunks, then two decode steps
        if done + n > len(req.all_token_ids):
            req.append_output_token_ids(tokens(1, seed=done, vocab=CONFIG.vocab_size)[0])
        if done:
            freed += cache.free_left_of_window(model, req, done)
        logits = run(model, cache, req, done, n)
        done += n
        # The oracle in the reference attention (faster; the same logits, tests/test_model.py).
        expected = recompute(req.all_token_ids[:done], attention_impl="reference")
        torch.testing.assert_close(logits, expected, **LOGITS_TOL)
    assert freed >= 3, "the test should free window pages along the way"


def test_freeing_a_page_that_left_the_window_changes_no_bit() -> None:
    prompt = tokens(26, seed=4, vocab=CONFIG.vocab_size)
    logits = {}
    for free in (False, True):
        cache = FakeHybridCache()
        model = nan_model(cache)
        req = Request("r", prompt)
        run(model, cache, req, 0, 17)
        if free:
            assert cache.free_left_of_window(model, req, 17) == 2  # positions [0, 8): pages 0, 1
        logits[free] = run(model, cache, req, 17, 9)
    assert torch.equal(logits[True], logits[False])


def test_window_layers_change_the_logits() -> None:
    """Not vacuous: without the windows the same weights give other logits; with a window
    longer than the prompt they give the dense model's."""
    _, prompt_b = prompts()
    hybrid, dense = recompute(prompt_b), recompute(prompt_b, DENSE)
    assert (hybrid - dense).abs().max() > 100 * LOGITS_TOL["atol"]
    n = len(prompt_b)
    wide = ModelLayout.parse([("sliding_window", n), ("full",)])
    torch.testing.assert_close(recompute(prompt_b, wide), dense, **LOGITS_TOL)


def test_batch_invariant_hybrid_cache_hit_is_recompute_bit_for_bit() -> None:
    cache = FakeHybridCache()
    model = nan_model(cache, batch_invariant=True)
    prompt_a, prompt_b = prompts()
    a, b = Request("a", prompt_a), Request("b", prompt_b)
    run(model, cache, a, 0, len(prompt_a))
    share_prefix(cache, model, a, b, SHARED)
    run(model, cache, b, SHARED, 4)
    cache.free_left_of_window(model, b, SHARED + 4)
    logits = run(model, cache, b, SHARED + 4, TAIL - 4)
    assert torch.equal(logits, recompute(prompt_b, batch_invariant=True))


def test_groups_of_one_pool_share_its_memory() -> None:
    """vLLM's layout: one block id is one region of memory in one layer of every group."""
    groups = (
        KVGroup("full", None, "blocks", PAGE, 16, (1,)),
        KVGroup("sliding_window", WINDOW, "blocks", PAGE, 16, (0, 2)),
    )
    model = Model(CONFIG3, kv_groups=groups, layout=LAYOUT3)
    assert model.k_caches[1] is model.k_caches[0] and model.v_caches[1] is model.v_caches[0]
    assert model.k_caches[2] is not model.k_caches[0]
    clash = SeqChunk([1, 2, 3], 0, [5], [[5], [5]])  # the same block in both groups: one memory
    with pytest.raises(ValueError, match="same KV slot"):
        model.step([clash])
    separate = Model(CONFIG3, kv_groups=[groups[0], replace(groups[1], pool="swa")], layout=LAYOUT3)
    assert torch.isfinite(separate.step([clash])).all()


def test_dense_cache_gives_the_dense_model() -> None:
    """``for_cache`` on a plain cache is ``Model(config, num_pages, page_size)``, bit for bit."""
    cache = make_cache("none", CacheConfig(64, PAGE))
    built = Model.for_cache(CONFIG, cache, seed=0)
    plain = Model(CONFIG, cache.config.num_pages, PAGE, seed=0)
    assert len(built.layers) == CONFIG.n_layers and built.kv_groups == plain.kv_groups
    chunk = [SeqChunk(tokens(9, seed=5, vocab=CONFIG.vocab_size), 0, [3, 1, 2])]
    assert torch.equal(built.step(chunk), plain.step(chunk))


# %%
# Bad input
# ---------


def test_a_layout_with_mamba_layers_is_a_clear_error() -> None:
    class MambaCache(FakeHybridCache):
        def kv_groups(self) -> tuple[KVGroup, ...]:
            raise AssertionError("the layout alone should be refused")

    cache = MambaCache()
    cache.config = CacheConfig(1024, PAGE, layout="mamba-hybrid")
    with pytest.raises(ValueError, match="model mode does not run an SSM"):
        Model.for_cache(CONFIG, cache)  # type: ignore[arg-type]
    mamba = (KVGroup("full", None, "kv", PAGE, 8, (0, 1)), KVGroup("mamba", None, "state", PAGE, 8, (2,)))
    with pytest.raises(ValueError, match="model mode does not run an SSM"):
        Model(CONFIG3, kv_groups=mamba)


def _groups(*groups: tuple[str, int | None, str, int, tuple[int, ...]]) -> list[KVGroup]:
    return [KVGroup(kind, window, pool, PAGE, pages, layers) for kind, window, pool, pages, layers in groups]


@pytest.mark.parametrize(
    ("groups", "match"),
    [
        (_groups(("full", None, "a", 8, (0, 1))), r"layers \[2\] are in no KV group"),
        (_groups(("full", None, "a", 8, (0, 1, 2)), ("full", None, "b", 8, (2,))), "in KV groups 0 and 1"),
        (_groups(("full", None, "a", 8, (0, 1, 3))), "layer 3 is not in"),
        (_groups(("full", None, "a", 8, (0,)), ("full", None, "a", 9, (1, 2))), "share its pages"),
        (_groups(("sliding_window", None, "a", 8, (0, 1, 2))), "window None"),
        (_groups(("full", None, "a", 8, (0, 2)), ("sliding_window", 5, "b", 8, (1,))), "the layout makes"),
    ],
)
def test_bad_kv_groups_are_clear_errors(groups: list[KVGroup], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Model(CONFIG3, kv_groups=groups, layout=LAYOUT3 if "layout" in match else None)


@pytest.mark.parametrize(
    ("chunk", "match"),
    [
        # Queries at 12..14 with window 10 read positions 3.. : page 0 of the window table too.
        (SeqChunk([1] * 3, 12, [1, 2, 3, 4], [[1, 2, 3, 4], [0, 2, 3, 4]]), "null page"),
        (SeqChunk([1] * 3, 0, [1], [[1], [0]]), "null page"),  # a new token in the null page
        (SeqChunk([1] * 3, 0, [1], [[1]]), "1 page tables for 2 KV groups"),
        (SeqChunk([1] * 3, 0, [1], [[2], [1]]), "page_table must be page_tables"),
        (SeqChunk([1] * 3, 0, [1], [[1], [99]]), r"group 1: page ids must be in \[0, 30\)"),
    ],
)
def test_step_rejects_tables_that_do_not_fit_the_groups(chunk: SeqChunk, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Model.for_cache(CONFIG, FakeHybridCache()).step([chunk])  # type: ignore[arg-type]


# %%
# (b) The real backends with a hybrid layout
# ------------------------------------------


def hybrid_cache(backend: str, page_size: int) -> PrefixCache:
    try:
        cache = make_cache(backend, CacheConfig(256, page_size, layout=LAYOUT))
    except (ImportError, AttributeError, NotImplementedError, ValueError) as e:
        pytest.skip(f"{backend} cannot be made with a hybrid layout yet: {e!r}")
    if not any(g.kind == "sliding_window" for g in cache.kv_groups()):
        pytest.skip(f"{backend} has no hybrid kv_groups yet (one {cache.kv_groups()[0].kind} group)")
    return cache


def prefill(
    model: Model, cache: PrefixCache, req: Request, chunk: int | None = None
) -> tuple[int, torch.Tensor, int]:
    """``req``'s prompt through cache and model as the engine drives them, each step over
    ``cache.page_tables(req)``; (hit, logits [vocab] at the last token, how many null entries
    the sliding-window tables had left of the window at the first step)."""
    hit = cache.lookup(req).tokens
    nulls = -1
    n = req.num_tokens - hit if chunk is None else min(chunk, req.num_tokens - hit)
    assert cache.allocate(req, n)
    while True:
        start = req.num_computed_tokens
        tables = cache.page_tables(req)
        if nulls < 0:
            windowed = [t for g, t in zip(cache.kv_groups(), tables, strict=True) if g.window is not None]
            nulls = sum(t.count(0) for t in windowed)
        logits = model.step([SeqChunk(req.all_token_ids[start : start + n], start, tables[0], tables)])[0]
        req.num_computed_tokens += n
        cache.commit(req)
        cache.check_invariants()
        if req.num_computed_tokens == req.num_tokens:
            return hit, logits, nulls
        n = min(n, req.num_tokens - req.num_computed_tokens)
        assert cache.allocate(req, n)


@pytest.mark.parametrize(
    ("backend", "page_size", "chunk"),
    [("hashchain", 4, None), ("hashchain", 4, 5), ("radix", 1, None), ("radix", 4, 5)],
    ids=["hashchain-p4-one-chunk", "hashchain-p4-chunked", "radix-p1-one-chunk", "radix-p4-chunked"],
)
def test_real_backend_hybrid_cache_hit_gives_the_logits_of_recompute(
    backend: str, page_size: int, chunk: int | None
) -> None:
    cache = hybrid_cache(backend, page_size)
    model = nan_model(cache)
    assert len(model.layers) == LAYOUT.num_layers
    _, prompt_b = prompts()
    # a is b's first SHARED + 1 tokens: its replay boundary (prompt - 1, page-aligned) is SHARED,
    # where a sliding-window group keeps its hashed tail under vLLM's default retention.
    a = Request("a", prompt_b[: SHARED + 1])
    prefill(model, cache, a)
    cache.release(a)
    b = Request("b", prompt_b)
    hit, logits, nulls = prefill(model, cache, b, chunk)
    cache.release(b)
    assert 0 < hit <= a.num_tokens, (
        f"{backend} should reuse part of the {a.num_tokens} shared tokens, hit {hit}"
    )
    # The hit's pages left of the window reach b as 0 (vLLM: skipped blocks are the null
    # block; SGLang: an SWA index freed out of the window maps to 0): the model ran over
    # null entries, and never read their pages.
    assert nulls > 0, f"{backend}: no null entry left of the window in b's sliding-window table"
    fresh = hybrid_cache(backend, page_size)
    miss, expected, _ = prefill(nan_model(fresh), fresh, Request("b", prompt_b))
    assert miss == 0
    assert torch.isfinite(logits).all(), "NaN logits: the model read a page nobody wrote"
    torch.testing.assert_close(logits, expected, **LOGITS_TOL)


@pytest.mark.parametrize("backend, page", [("hashchain", 4), ("radix", 1), ("radix", 4)])
def test_engine_model_mode_over_a_hybrid_layout_decodes_the_same_with_hits(backend: str, page: int) -> None:
    """The engine hands the model every group's table (``page_tables``): greedy outputs of
    requests sharing a 22-token prefix are the same when they hit the cache as when each runs
    alone in a fresh one."""
    from prefixcache.engine import Engine

    layout = [("sliding_window", 10), ("full",), ("sliding_window", 10)]
    config = ModelConfig(vocab_size=97, n_layers=2)
    base = tokens(22, seed=1, vocab=97)
    prompts = [base + tokens(5, seed=20 + i, vocab=97) for i in range(3)]

    def run(shared: bool) -> tuple[list[list[int]], int]:
        outs, cache, model = [], None, None
        for i, prompt in enumerate(prompts):
            if cache is None or not shared:
                cache = make_cache(backend, CacheConfig(256, page, layout=layout))
                model = Model.for_cache(config, cache, attention_impl="reference")
            req = Request(f"r{i}", prompt, max_new_tokens=6)
            Engine(cache, "fcfs", 8, model=model).run([req])
            outs.append(list(req.output_token_ids))
        assert cache is not None
        return outs, cache.stats.hits

    with_hits, hits = run(shared=True)
    alone, _ = run(shared=False)
    assert hits > 0, "the requests never hit: the test proves nothing"
    assert with_hits == alone
