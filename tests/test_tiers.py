"""The host tier's configuration and link model (prefixcache.tiers): clear errors on bad
values, the design's default where a field is left out, and the transfer time the engine
charges (REFERENCE-tiers.md section 6: Llama-3-8B 128 KiB a token, about 50 GB/s one way)."""

from __future__ import annotations

import pytest

from prefixcache.tiers import LLAMA3_8B_BYTES_PER_TOKEN, HostLink, HostTierConfig


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"capacity_tokens": -1}, "must be positive"),
        ({"capacity_tokens": 0}, "must be positive"),
        ({"capacity_tokens": 1.5}, "must be an int"),
        ({"capacity_tokens": 64, "ratio": 2.0}, "not both"),
        ({"ratio": 0}, "positive number"),
        ({"ratio": -2.0}, "positive number"),
        ({"eviction_policy": "fifo"}, "unknown host eviction_policy 'fifo'; valid: lru, arc"),
        ({"write_policy": "write_around"}, "unknown write_policy 'write_around'"),
        ({"block_size": 0}, "must be positive"),
        ({"store_threshold": -1}, "store_threshold must be an int >= 0"),
        ({"load_back_threshold": True}, "load_back_threshold must be an int >= 0"),
    ],
)
def test_bad_host_tier_values_are_clear_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        HostTierConfig(**kwargs)


def test_host_size_is_the_given_tokens_or_a_ratio_of_the_device_pool() -> None:
    assert HostTierConfig(capacity_tokens=5000).host_tokens(1000, default_ratio=2.0) == 5000
    assert HostTierConfig().host_tokens(1000, default_ratio=2.0) == 2000  # SGLang's hicache_ratio
    assert HostTierConfig(ratio=3.5).host_tokens(1000, default_ratio=2.0) == 3500


def test_a_field_of_the_other_design_is_refused_by_name() -> None:
    cfg = HostTierConfig(write_policy="write_back", load_back_threshold=4)
    with pytest.raises(ValueError, match="hashchain host tier has no write_policy, load_back_threshold"):
        cfg.reject_fields("hashchain", ("write_policy", "load_back_threshold", "ratio"))
    HostTierConfig(block_size=64).reject_fields("hashchain", ("write_policy",))  # nothing given: fine


def test_transfer_time_is_latency_plus_bytes_over_bandwidth() -> None:
    assert LLAMA3_8B_BYTES_PER_TOKEN == 131_072  # 2 x 32 layers x 8 heads x 128 x 2 bytes
    link = HostLink()
    assert link.transfer_time(0) == 0.0
    # 16 tokens of Llama-3-8B = 2 MiB; at 50 GB/s about 42 us, plus the 10 us launch.
    assert link.transfer_time(16) == pytest.approx(10e-6 + 2 * 2**20 / 50e9)
    fast = HostLink(bandwidth_bytes_per_s=450e9, latency_s=0.0)  # GH200 C2C one way
    assert fast.transfer_time(1000) == pytest.approx(1000 * 131_072 / 450e9)
    for bad in ({"bytes_per_token": 0}, {"bandwidth_bytes_per_s": 0.0}, {"latency_s": -1.0}):
        with pytest.raises(ValueError):
            HostLink(**bad)
