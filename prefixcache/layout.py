"""A model's layer layout: which layers attend fully, which through a sliding window, and which
keep a recurrent (Mamba / linear-attention) state instead of KV.

Given once in ``CacheConfig(layout=...)``, it is read by both backends, so that both get the
same memory in bytes: the budget is ``capacity_tokens`` tokens of KV in *every* layer, i.e.
``capacity_tokens * num_layers`` layer-token units (one unit = one token of one attention
layer's KV). Each backend then lays that budget out the way its upstream does (vLLM: KV-cache
groups over one block pool; SGLang: a full pool and a sliding-window pool sized by a ratio).

A Mamba layer's state is given in the same unit: ``("mamba", S)`` means one state of that layer
costs as much as S tokens of one attention layer's KV.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

LAYER_KINDS = ("full", "sliding_window", "mamba")


def _positive_int(what: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} must be a positive int, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class LayerSpec:
    """One layer: ``("full",)``, ``("sliding_window", W)`` or ``("mamba", S)``.

    W: the window in tokens, the current token included (vLLM's ``sliding_window``; a token
       attends to itself and the W - 1 before it).
    S: the size of one recurrent state in layer-token units (see the module docstring).
    """

    kind: str
    size: int | None = None  # W for sliding_window, S for mamba

    def __post_init__(self) -> None:
        if self.kind not in LAYER_KINDS:
            raise ValueError(f"layer kind must be one of {LAYER_KINDS}, got {self.kind!r}")
        if self.kind == "full":
            if self.size is not None:
                raise ValueError("a full-attention layer takes no size: write ('full',)")
        elif self.kind == "sliding_window":
            _positive_int("a sliding-window layer's window (tokens)", self.size)
        else:
            _positive_int("a mamba layer's state size (layer-token units)", self.size)

    @property
    def window(self) -> int | None:
        return self.size if self.kind == "sliding_window" else None

    @property
    def state_tokens(self) -> int | None:
        return self.size if self.kind == "mamba" else None

    @classmethod
    def parse(cls, layer: object) -> LayerSpec:
        if isinstance(layer, LayerSpec):
            return layer
        if isinstance(layer, str):
            layer = (layer,)
        if not isinstance(layer, (tuple, list)) or not 1 <= len(layer) <= 2:
            raise ValueError(
                f"a layer must be ('full',), ('sliding_window', W) or ('mamba', S), got {layer!r}"
            )
        return cls(*layer)

    def as_tuple(self) -> tuple[str] | tuple[str, int]:
        return (self.kind,) if self.size is None else (self.kind, self.size)


# Named layouts. Each is one repeating unit of the model's layer pattern: the budget scales with
# the layer count, so a unit gives the same pool shape as the whole model (up to padding).
PRESETS: dict[str, tuple[tuple[str] | tuple[str, int], ...]] = {
    # One full-attention layer: every plain model (the default).
    "dense": (("full",),),
    # Gemma 3: five local (sliding window 1024) layers per global layer (Gemma 3 technical
    # report, arXiv 2503.19786, section 2.1).
    "gemma3-like": (("sliding_window", 1024),) * 5 + (("full",),),
    # gpt-oss: layers alternate between banded (window 128) and dense attention (OpenAI gpt-oss
    # model card, 2025).
    "gpt-oss-like": (("sliding_window", 128), ("full",)),
    # Qwen3-Next / Qwen3.5-style: three linear-attention (Gated DeltaNet) layers per full layer.
    # The state size is set so that vLLM raises its attention block to 528 tokens, the size
    # reported for such a model in vLLM issue #40696.
    "mamba-hybrid": (("mamba", 528),) * 3 + (("full",),),
}


@dataclass(frozen=True, slots=True)
class ModelLayout:
    """The layers of a model, in order, and the name of the preset they came from (if any)."""

    layers: tuple[LayerSpec, ...]
    name: str | None = None

    def __post_init__(self) -> None:
        if not self.layers:
            raise ValueError("a layout needs at least one layer")
        if all(layer.kind == "mamba" for layer in self.layers):
            raise ValueError("a layout needs at least one attention layer (full or sliding_window)")

    @classmethod
    def parse(cls, layout: object) -> ModelLayout:
        """A preset name, a ModelLayout, or a sequence of layers (tuples or LayerSpec)."""
        if isinstance(layout, ModelLayout):
            return layout
        if isinstance(layout, str):
            try:
                layers = PRESETS[layout]
            except KeyError:
                raise ValueError(f"unknown layout {layout!r}; presets: {', '.join(PRESETS)}") from None
            return cls(tuple(LayerSpec.parse(layer) for layer in layers), name=layout)
        if not isinstance(layout, Sequence):
            raise ValueError(f"layout must be a preset name or a list of layers, got {layout!r}")
        return cls(tuple(LayerSpec.parse(layer) for layer in layout))

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def is_dense(self) -> bool:
        """Every layer attends fully: the layout changes nothing in any backend."""
        return all(layer.kind == "full" for layer in self.layers)

    def count(self, kind: str) -> int:
        return sum(1 for layer in self.layers if layer.kind == kind)

    def specs(self) -> Counter[LayerSpec]:
        """How many layers share each distinct spec (vLLM buckets layers by identical spec)."""
        return Counter(self.layers)

    def describe(self) -> str:
        if self.name is not None:
            return self.name
        return ", ".join(f"{n}x{spec.as_tuple()}" for spec, n in self.specs().items())
