"""Cache configuration shared by every backend.

Both designs get the same pool: ``capacity_tokens // page_size`` pages, of which page 0 is
reserved (vLLM's null block, SGLang's padding slot), so equal configs give equal usable memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from prefixcache.layout import ModelLayout


def check_positive_int(name: str, value: object) -> int:
    """Return ``value`` if it is a positive int (bool excluded), else raise a ValueError."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value}")
    return value


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """What every backend is given: KV capacity in tokens and the page (block) size.

    capacity_tokens: KV slots in the pool, page 0 included. With a layout: the memory of
                     ``capacity_tokens`` tokens of KV in every layer of the model.
    page_size:       tokens per page; vLLM's ``block_size``, SGLang's ``page_size``.
    layout:          the model's layers (``prefixcache.layout``): None (one full-attention
                     layer, every plain model), a preset name such as "gemma3-like", or a list
                     such as ``[("sliding_window", 1024)] * 5 + [("full",)]``.
    """

    capacity_tokens: int
    page_size: int = 16
    layout: ModelLayout | None = None

    def __post_init__(self) -> None:
        check_positive_int("capacity_tokens", self.capacity_tokens)
        check_positive_int("page_size", self.page_size)
        if self.layout is not None:
            object.__setattr__(self, "layout", ModelLayout.parse(self.layout))
        if self.num_pages < 2:
            raise ValueError(
                f"capacity_tokens={self.capacity_tokens} holds {self.num_pages} page(s) of "
                f"{self.page_size} tokens; at least 2 are needed because page 0 is reserved "
                f"(need capacity_tokens >= {2 * self.page_size})"
            )

    @property
    def num_pages(self) -> int:
        """Pages in the pool, the reserved page 0 included."""
        return self.capacity_tokens // self.page_size

    @property
    def num_usable_pages(self) -> int:
        """Pages a backend may hand out: all but page 0."""
        return self.num_pages - 1

    @property
    def usable_tokens(self) -> int:
        return self.num_usable_pages * self.page_size

    @property
    def model_layout(self) -> ModelLayout:
        """The layout, one full-attention layer when none was given."""
        return self.layout if self.layout is not None else ModelLayout.parse("dense")

    @property
    def is_hybrid(self) -> bool:
        """Some layer does not attend fully (the backends lay their pools out per layer kind)."""
        return self.layout is not None and not self.layout.is_dense

    @property
    def layer_token_budget(self) -> int:
        """The memory both backends share, in layer-token units (one token of one attention
        layer's KV): ``capacity_tokens`` in every layer."""
        return self.capacity_tokens * self.model_layout.num_layers
