"""The offloading spec: chunk size and host capacity from a ``HostTierConfig`` (vLLM 0.33
``kv_offload/cpu/spec.py`` and the connector's ``build_offloading_config``).

A chunk is ``blocks_per_chunk`` GPU blocks (extra_config ``block_size``, which must be a
multiple of the GPU block), keyed by the chained hash at its last hash unit. vLLM sizes the
CPU pool in bytes (``cpu_bytes_to_use // bytes_per_chunk``); we size it in tokens of KV in
every layer, the unit of ``CacheConfig.capacity_tokens``, so it is
``host_tokens // tokens_per_chunk`` chunks.
"""

from __future__ import annotations

from dataclasses import dataclass

from prefixcache.tiers import STORAGE_FIELDS, HostTierConfig

# SGLang's hicache_ratio default. vLLM has no default size (kv_offloading_size is required);
# both designs get the same host memory when the caller names none.
DEFAULT_HOST_RATIO = 2.0
RADIX_ONLY_FIELDS = ("write_policy", "load_back_threshold", "storage", *STORAGE_FIELDS)


@dataclass(frozen=True, slots=True)
class OffloadSpec:
    tokens_per_block: int  # the GPU block
    blocks_per_chunk: int
    tokens_per_hash: int  # vLLM's hash_block_size (prefix_match_unit)
    num_chunks: int
    eviction_policy: str = "lru"
    store_threshold: int = 0  # offers before a chunk is stored; < 2: off (vLLM default 0)
    offload_prompt_only: bool = True  # vLLM 0.33's default

    @property
    def tokens_per_chunk(self) -> int:
        return self.tokens_per_block * self.blocks_per_chunk

    @property
    def hashes_per_chunk(self) -> int:
        return self.tokens_per_chunk // self.tokens_per_hash

    @classmethod
    def from_config(
        cls, tier: HostTierConfig, device_tokens: int, tokens_per_block: int, tokens_per_hash: int
    ) -> OffloadSpec:
        """ValueError on anything vLLM refuses, and on a radix-only field."""
        if not isinstance(tier, HostTierConfig):
            raise ValueError(f"host_tier must be a HostTierConfig, got {type(tier).__name__}")
        tier.reject_fields("hashchain", RADIX_ONLY_FIELDS)
        chunk = tier.block_size if tier.block_size is not None else tokens_per_block
        if chunk % tokens_per_block:
            # vLLM 0.33 build_offloading_config's check, in its words.
            up = -(-chunk // tokens_per_block) * tokens_per_block
            raise ValueError(
                f"host_tier.block_size={chunk} must be a multiple of the GPU KV cache block size "
                f"({tokens_per_block} tokens); use {up} instead"
            )
        host_tokens = tier.host_tokens(device_tokens, DEFAULT_HOST_RATIO)
        num_chunks = host_tokens // chunk
        if num_chunks < 1:
            raise ValueError(f"a host tier of {host_tokens} tokens holds no chunk of {chunk} tokens")
        if tier.offload_prompt_only is not None and not isinstance(tier.offload_prompt_only, bool):
            raise ValueError(
                f"host_tier.offload_prompt_only must be a bool, got {tier.offload_prompt_only!r}"
            )
        return cls(
            tokens_per_block=tokens_per_block,
            blocks_per_chunk=chunk // tokens_per_block,
            tokens_per_hash=tokens_per_hash,
            num_chunks=num_chunks,
            eviction_policy=tier.eviction_policy or "lru",
            store_threshold=tier.store_threshold or 0,
            offload_prompt_only=True if tier.offload_prompt_only is None else tier.offload_prompt_only,
        )
