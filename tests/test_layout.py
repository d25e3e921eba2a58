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
