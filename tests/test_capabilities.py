"""The capability table (prefixcache/capabilities.py) walked whole: every backend x layout x
host tier x eviction policy x kv_events x EAGLE. Each combination the table accepts is built by
``make_cache`` and serves a short workload through the Engine (shared prefixes, so something
is cached, evicted and hit) with its invariants holding; each it refuses raises the table's one
message, naming what that mix takes. The README and ``prefixcache run --help`` print the table.
"""

from __future__ import annotations

import itertools
import re
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from prefixcache import CacheConfig, Engine, Request, capabilities, eviction_policies, make_cache
from prefixcache.capabilities import BACKENDS, EAGLE_OPTION, LAYOUTS, REFUSED, TABLE, Mix
from prefixcache.eviction import USER_POLICIES, unregister_policy
from prefixcache.tiers import HostTierConfig

ROOT = Path(__file__).resolve().parents[1]
CAPACITY = 64  # tokens: every caching mix evicts serving the workload

LAYERS = {
    "dense": None,
    "swa": [("sliding_window", 8), ("full",)],
    "mamba": [("mamba", 4), ("full",)],
    "hybrid": [("mamba", 4), ("full",), ("sliding_window", 8)],
}
# every name some mix takes, one no mix takes, and a registered class
NAMES = [*dict.fromkeys(p for mix in TABLE.values() for p in mix.policies), "clock"]
NAMES.append(f"{__name__}:NewestFirst")


class NewestFirst:
    """A user's own policy (``package.module:Class``)."""

    def priority(self, entry: object) -> float:
        return -entry.creation_time  # type: ignore[attr-defined]


def combinations() -> list[tuple[str, str, bool, str | None, bool, bool]]:
    """(backend, layout, host tier, eviction_policy or None, kv_events, EAGLE), all of them
    (EAGLE where the backend has an option for it)."""
    every = itertools.product(BACKENDS, LAYOUTS, (False, True), [None, *NAMES], (False, True), (False, True))
    return [c for c in every if c[0] in EAGLE_OPTION or not c[5]]


def expected(backend: str, layout: str, tier: bool, policy: str | None, events: bool, eagle: bool) -> bool:
    """Whether the table accepts it, read cell by cell (the test's own reading of the table)."""
    mix = TABLE.get((backend, layout, tier))
    if mix is None:
        return False
    policy_ok = policy is None or policy in mix.policies or (mix.registered and ":" in policy)
    eagle_ok = not eagle or (mix.eagle and (mix.events_with_eagle or not events))
    return policy_ok and (not events or mix.kv_events) and eagle_ok


def build(backend: str, layout: str, tier: bool, policy: str | None, events: bool, eagle: bool):  # type: ignore[no-untyped-def]
    mix = TABLE.get((backend, layout, tier), Mix())
    config = CacheConfig(CAPACITY, mix.page_size or 4, layout=LAYERS[layout])
    options: dict[str, object] = {}
    if tier:
        options["host_tier"] = HostTierConfig()
    if policy is not None:
        options["eviction_policy"] = policy
    if events:
        options["kv_events"] = True
    if eagle:
        options[EAGLE_OPTION[backend]] = True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a host pool smaller than its default ratio asks for
        return make_cache(backend, config, **options)


def workload() -> list[Request]:
    """Eight requests over two shared prefixes, in a pool that holds about two of them."""
    prefixes = [list(range(1, 25)), list(range(100, 116))]
    return [
        Request(f"r{i}", [*prefixes[i % 2], *range(200 + 10 * i, 204 + 10 * i)], max_new_tokens=3)
        for i in range(8)
    ]


@pytest.fixture(autouse=True)
def no_leaked_policies() -> Iterator[None]:
    """The class a test loads by its name stays registered in this process only for that test."""
    before = set(USER_POLICIES)
    yield
    for name in set(USER_POLICIES) - before:
        unregister_policy(name)


class CheckedEngine(Engine):
    def step(self) -> int:
        n = super().step()
        self.cache.check_invariants()
        return n


@pytest.mark.parametrize("combo", combinations(), ids=lambda c: "-".join(map(str, c)))
def test_every_combination_is_served_or_refused_with_the_tables_message(combo: tuple) -> None:
    backend, layout, tier, policy, events, eagle = combo
    if expected(*combo):
        cache = build(*combo)
        records = CheckedEngine(cache, "fcfs", token_budget=32).run(workload())
        assert len(records) == 8 and all(r.output_tokens == 3 for r in records)
        if backend != "none":  # the mix was exercised: it cached, hit and evicted
            assert any(r.hit_tokens for r in records) and cache.stats.evicted_tokens
        return
    with pytest.raises(ValueError, match=re.escape(f"make_cache({backend!r}): ")) as refusal:
        build(*combo)
    message = str(refusal.value)
    assert message.endswith("(prefixcache/capabilities.py)")
    where = f"{backend} over a {layout} layout" + (" with a host tier" if tier else "")
    assert where in message
    mix = TABLE.get((backend, layout, tier))
    if mix is None:
        assert f"is not supported ({REFUSED[(backend, layout, tier)]})" in message
    else:
        assert capabilities.accepted(mix, backend) in message


def test_every_mix_is_accepted_or_refused_with_a_reason() -> None:
    every = set(itertools.product(BACKENDS, LAYOUTS, (False, True)))
    assert every == TABLE.keys() | REFUSED.keys()
    assert not TABLE.keys() & REFUSED.keys()


def test_eviction_policies_lists_what_the_mix_accepts() -> None:
    assert "lrp" in eviction_policies("radix") and "lrp" not in eviction_policies("radix", host_tier=True)
    assert eviction_policies("radix", "swa") == ["lru"]
    assert eviction_policies("radix", "mamba") == ["lru", "marconi"]
    with pytest.raises(ValueError, match="takes no eviction_policy"):
        eviction_policies("radix", "hybrid")


def test_the_readme_and_the_cli_help_print_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    readme = (ROOT / "README.md").read_text()
    assert capabilities.markdown() in readme, "README's table is stale: paste capabilities.markdown()"
    from prefixcache.experiments.cli import main

    with pytest.raises(SystemExit):
        main(["run", "--help"])
    assert capabilities.summary() in capsys.readouterr().out
