"""A model's layer layout, given once in CacheConfig and read by every backend."""

from __future__ import annotations

import pytest

from prefixcache import LAYOUT_PRESETS, CacheConfig, KVGroup, LayerSpec, ModelLayout, make_cache


def test_presets_parse_to_their_layer_pattern() -> None:
    gemma = ModelLayout.parse("gemma3-like")
    assert [layer.as_tuple() for layer in gemma.layers] == [("sliding_window", 1024)] * 5 + [("full",)]
    assert gemma.name == "gemma3-like" and gemma.count("sliding_window") == 5 and gemma.count("full") == 1
    assert ModelLayout.parse("gpt-oss-like").specs() == {
        LayerSpec("sliding_window", 128): 1,
        LayerSpec("full"): 1,
    }
    assert ModelLayout.parse("mamba-hybrid").count("mamba") == 3
    assert set(LAYOUT_PRESETS) == {"dense", "gemma3-like", "gpt-oss-like", "mamba-hybrid"}


def test_a_list_of_layers_is_a_layout_and_compares_by_value() -> None:
    a = ModelLayout.parse([("sliding_window", 32), "full", ("full",)])
    b = ModelLayout.parse([LayerSpec("sliding_window", 32), LayerSpec("full"), LayerSpec("full")])
    assert a == b and hash(a) == hash(b)
    assert a.num_layers == 3 and not a.is_dense
    assert a.layers[0].window == 32 and a.layers[0].state_tokens is None
    assert ModelLayout.parse([("mamba", 64), ("full",)]).layers[0].state_tokens == 64


def test_config_takes_the_layout_once_and_counts_the_budget_in_layer_tokens() -> None:
    cfg = CacheConfig(4096, 16, layout="gemma3-like")
    assert isinstance(cfg.layout, ModelLayout) and cfg.is_hybrid
    assert cfg.layer_token_budget == 4096 * 6
    spelled_out = CacheConfig(4096, 16, layout=[("sliding_window", 1024)] * 5 + [("full",)])
    assert spelled_out.layout.layers == cfg.layout.layers and spelled_out.layout.name is None
    dense = CacheConfig(4096, 16)
    assert dense.layout is None and not dense.is_hybrid
    assert dense.layer_token_budget == 4096 and dense.model_layout.is_dense
    assert not CacheConfig(4096, 16, layout=[("full",)] * 4).is_hybrid


@pytest.mark.parametrize(
    "layout, message",
    [
        ("llama", "unknown layout"),
        ([], "at least one layer"),
        ([("mamba", 8)], "at least one attention layer"),
        ([("full", 3)], "takes no size"),
        ([("sliding_window",)], "window"),
        ([("sliding_window", 0)], "window"),
        ([("sliding_window", True)], "window"),
        ([("mamba", -1)], "state size"),
        ([("moe",)], "layer kind"),
        ([("full", 1, 2)], "a layer must be"),
        (7, "preset name or a list"),
    ],
)
def test_bad_layouts_are_clear_value_errors(layout: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CacheConfig(4096, 16, layout=layout)


@pytest.mark.parametrize("backend", ["none", "hashchain", "radix"])
def test_a_dense_backend_reports_one_full_group_over_its_pool(backend: str) -> None:
    cache = make_cache(backend, CacheConfig(256, 4))
    groups = cache.kv_groups()
    assert len(groups) == 1 and isinstance(groups[0], KVGroup)
    g = groups[0]
    assert (g.kind, g.window, g.page_size, g.num_pages, g.layers) == ("full", None, 4, 64, (0,))


@pytest.mark.parametrize(
    "backend, page, layout, expected",
    [
        ("hashchain", 16, None, 112),  # 7 pages of 16 in the one layer
        ("radix", 1, None, 100),
        # window 1024 > 100 tokens: every one of the 6 layers still holds every token
        ("hashchain", 16, "gemma3-like", 6 * 112),  # 6 groups of one layer, 7 blocks each
        ("radix", 16, "gemma3-like", 112 * 1 + 112 * 5),  # full pool x 1 layer + SWA pool x 5
        # Mamba: vLLM's block is raised to 528 (one block per group: 1 full + 3 Mamba groups);
        # SGLang holds 100 KV slots of the full layer and the request's own state (3 x 528)
        ("hashchain", 16, "mamba-hybrid", 4 * 528),
        ("radix", 1, "mamba-hybrid", 100 + 3 * 528),
    ],
)
def test_memory_in_use_counts_layer_tokens_of_every_layer_a_request_pins(
    backend: str, page: int, layout: str | None, expected: int
) -> None:
    from prefixcache import Request

    cache = make_cache(backend, CacheConfig(1 << 14, page, layout=layout))
    assert cache.memory_in_use() == 0
    req = Request("r", list(range(1, 101)))
    assert cache.allocate(req, 100, cache.lookup(req))
    assert cache.memory_in_use() == expected
    cache.release(req)
    assert cache.memory_in_use() == 0
