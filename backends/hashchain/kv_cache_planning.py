"""KV-cache groups from a model's layer layout, and the pool they share (vLLM 0.33
``v1/core/kv_cache_planning.py`` ``_get_kv_cache_groups_uniform_page_size`` and
``kv_cache_utils.py`` ``resolve_kv_cache_block_sizes``).

vLLM buckets the layers by identical spec (each window size is its own spec), picks one group
size for every bucket (the smallest bucket, or the largest if it is below 1.5x the smallest),
splits each bucket into cdiv(n, group_size) groups by stride (``layers[i::num_groups]``) and
pads short groups with padding layers. Every group then holds group_size layers, so one block
id addresses one page in each of them: the pool holds memory // (page bytes x group_size)
blocks, here ``layer_token_budget // (block_size x group_size)``.

With Mamba layers the page must hold one state: vLLM raises the attention block size to the
smallest multiple of the block size whose page (block_size units per layer) holds the largest
state (``Platform._align_hybrid_block_size``; the kernel alignment is 1 here, our kernel takes
any page size) and pads the Mamba page to it. ``("mamba", 528)`` and block size 16 give 528,
the block of vLLM issue #40696.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from prefixcache.backends.hashchain.single_type_kv_cache_manager import AttentionGroupSpec

from prefixcache.layout import LayerSpec, ModelLayout


@dataclass(frozen=True, slots=True)
class KVCacheGroupPlan:
    """One vLLM KV-cache group: its spec and the model layers in it (padding not listed)."""

    spec: AttentionGroupSpec
    layers: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class KVCachePlan:
    groups: tuple[KVCacheGroupPlan, ...]
    group_size: int  # layers per group, padding included

    @property
    def num_padding_layers(self) -> int:
        return sum(self.group_size - len(g.layers) for g in self.groups)

    def num_blocks(self, layer_token_budget: int, block_size: int) -> int:
        """vLLM: available memory // (page bytes x layers per group), the null block included."""
        return layer_token_budget // (block_size * self.group_size)


def _group_spec(layer: LayerSpec) -> AttentionGroupSpec:
    return AttentionGroupSpec(layer.kind, layer.window, layer.state_tokens)


def hybrid_block_size(layout: ModelLayout, block_size: int) -> int:
    """The block size vLLM runs a layout with: raised so one page holds a Mamba state."""
    states = [layer.state_tokens for layer in layout.layers if layer.state_tokens is not None]
    if not states:
        return block_size
    return max(block_size, block_size * -(-max(states) // block_size))


def plan_kv_cache_groups(layout: ModelLayout) -> KVCachePlan:
    """vLLM's grouping rule for a uniform page size (every layer's page costs block_size units)."""
    buckets: dict[LayerSpec, list[int]] = {}  # first appearance order, as vLLM's defaultdict
    for index, layer in enumerate(layout.layers):
        buckets.setdefault(layer, []).append(index)
    sizes = [len(layers) for layers in buckets.values()]
    group_size = min(sizes)
    if max(sizes) < group_size * 1.5:  # vLLM: few padding layers (gpt-oss 12 SW / 13 full -> 13)
        group_size = max(sizes)
    groups: list[KVCacheGroupPlan] = []
    for layer, layers in buckets.items():
        spec = _group_spec(layer)
        num_groups = -(-len(layers) // group_size)
        # Stride, not runs: each pipeline stage then pads as little as the whole model.
        groups.extend(KVCacheGroupPlan(spec, tuple(layers[i::num_groups])) for i in range(num_groups))
    return KVCachePlan(tuple(groups), group_size)


def resolve_hash_block_size(block_sizes: list[int], prefix_match_unit: int | None) -> tuple[int, int]:
    """(scheduler_block_size, hash_block_size) as vLLM 0.33 resolves them with prefix caching on.

    One group: both the block size; a ``prefix_match_unit`` other than it is a ValueError.
    Several: the LCM of the block sizes, and the unit (default: their GCD), which must divide
    every block size.
    """
    if prefix_match_unit is not None and (
        isinstance(prefix_match_unit, bool) or not isinstance(prefix_match_unit, int) or prefix_match_unit < 1
    ):
        raise ValueError(f"prefix_match_unit must be a positive int or None, got {prefix_match_unit!r}")
    if len(block_sizes) <= 1:
        size = block_sizes[0]
        if prefix_match_unit not in (None, size):
            raise ValueError(
                f"Invalid prefix_match_unit={prefix_match_unit}; with a single KV cache group, "
                f"prefix-cache hits land on the block size ({size}). Unset it or set it to {size}."
            )
        return size, size
    scheduler_block_size = math.lcm(*block_sizes)
    unit = prefix_match_unit if prefix_match_unit is not None else math.gcd(*block_sizes)
    if any(size % unit for size in block_sizes):
        raise ValueError(
            f"Invalid prefix_match_unit={unit}; KV cache group block sizes must be divisible by "
            f"it. Got group block sizes={block_sizes}."
        )
    return scheduler_block_size, unit


def partial_hash_hits_enabled(kinds: list[str], block_size: int, hash_block_size: int) -> bool:
    """vLLM 0.33 ``partial_hash_hits_enabled`` (one block size, no DCP): sub-block hits need a
    Mamba "align" group with a block larger than the hash unit, and every other group able to
    look up at the unit (full attention can; a sliding window cannot)."""
    return "mamba" in kinds and block_size > hash_block_size and "sliding_window" not in kinds
