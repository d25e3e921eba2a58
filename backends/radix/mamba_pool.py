"""SGLang 0.5.23's split of the memory budget between the Mamba state pool and the full KV pool.

Pool sizes (``kv_cache_configurator.py``, ratio path): of the budget B, the state pool gets
``B * r / (1 + r)`` (r = ``--mamba-full-memory-ratio``, default 0.9) and holds
``K = (that - per_slot) // per_slot`` states plus a padding slot; the full KV pool gets the rest,
``(B - (K + 1) * per_slot) // cell`` tokens. SGLang counts bytes: per_slot = one request's
state over every mamba layer, cell = one token's KV over the full layers. We count
layer-token units (prefixcache/layout.py): B = ``config.layer_token_budget``, per_slot = the
sum of the mamba layers' S, cell = the number of full layers.
"""

from __future__ import annotations

from typing import NamedTuple

from prefixcache.config import CacheConfig

DEFAULT_MAMBA_FULL_MEMORY_RATIO = 0.9  # SGLang's --mamba-full-memory-ratio fallback


class MambaPoolSizes(NamedTuple):
    states: int  # usable state slots (slot 0, SGLang's padding slot, not counted)
    kv_tokens: int  # usable full-attention KV slots (slot 0 not counted)


def mamba_pool_sizes(
    config: CacheConfig, ratio: float = DEFAULT_MAMBA_FULL_MEMORY_RATIO, max_states: int | None = None
) -> MambaPoolSizes:
    """SGLang 0.5.23's split of the budget between the state pool and the full KV pool
    (module docstring); ``max_states`` is ``--max-mamba-cache-size`` (the rest goes to KV)."""
    layout = config.model_layout
    per_slot = sum(layer.size or 0 for layer in layout.layers if layer.kind == "mamba")
    cell = layout.count("full")
    budget = config.layer_token_budget
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not ratio > 0:
        raise ValueError(f"mamba_full_memory_ratio must be a positive number, got {ratio!r}")
    if max_states is None:
        states = int((budget * ratio / (1 + ratio) - per_slot) // per_slot)
    else:
        if isinstance(max_states, bool) or not isinstance(max_states, int) or max_states < 1:
            raise ValueError(f"max_mamba_cache_size must be a positive int, got {max_states!r}")
        states = max_states
    if states < 1:
        raise ValueError(
            f"radix (Mamba): the budget of {budget} layer-token units leaves {states} state slots "
            f"of {per_slot} units (SGLang: 'Not enough GPU memory for hybrid state cache')"
        )
    kv_tokens = (budget - (states + 1) * per_slot) // cell
    if kv_tokens < 1:
        raise ValueError(f"radix (Mamba): {states} state slots of {per_slot} units leave no full KV")
    return MambaPoolSizes(states, kv_tokens)
