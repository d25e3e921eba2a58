"""A user's own eviction policy (prefixcache.eviction.register_policy / load_policy_spec): used
by both backends through ``make_cache(..., eviction_policy=name)``, in an order LRU would not
take; clear errors for a taken name, a class that is no policy and a spec that does not load."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest

from prefixcache import CacheConfig, Request, eviction_policies, load_policy_spec, make_cache, register_policy
from prefixcache.eviction import USER_POLICIES, make_policy, unregister_policy
from tests.helpers import Checked, run_to_completion


# The README's example, as pasted there.
class OneOffsNewestFirst:
    """Entries held by one request go first, newest first, so a burst of one-off prompts
    evicts itself; entries held by two or more requests go after them, least recent first."""

    def priority(self, entry: Any) -> tuple[int, float]:  # the sort key: the smallest goes first
        if entry.hit_count < 2:
            return (0, -entry.creation_time)
        return (1, entry.last_access_time)


PAGE = 4
# One page each (4 tokens + 1 computed), run A B C A: A held twice, B and C once. LRU evicts
# B C A; one-offs newest first evicts C B (the one-offs, newest first), then A.
PROMPTS = {"A": [1, 1, 1, 1, 0], "B": [2, 2, 2, 2, 0], "C": [3, 3, 3, 3, 0]}
RUNS = "ABCA"
BACKENDS = ("hashchain", "radix")


@pytest.fixture(autouse=True)
def no_leaked_policies() -> Iterator[None]:
    """Every test starts and ends with no user policy registered."""
    assert not USER_POLICIES
    yield
    for name in list(USER_POLICIES):
        unregister_policy(name)


def eviction_order(backend: str, policy: str) -> str:
    """The prompts in the order the cache evicts them, one page per eviction (probed once per
    fresh run: a radix lookup stamps access times, so probing between evictions would change
    the order it measures)."""
    order, before = "", set(PROMPTS)
    for pages in range(1, len(PROMPTS) + 1):
        cache = Checked(make_cache(backend, CacheConfig(16 * PAGE, PAGE), eviction_policy=policy))
        for i, name in enumerate(RUNS):
            run_to_completion(cache, Request(f"{name}{i}", PROMPTS[name]))
        for _ in range(pages):
            assert cache.evict(PAGE) == PAGE
        after = {n for n, p in PROMPTS.items() if cache.lookup(Request("probe", p)).tokens}
        (gone,) = before - after
        order, before = order + gone, after
    return order


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_registered_policy_is_the_one_both_backends_evict_by(backend: str) -> None:
    assert register_policy("one-offs-newest-first", OneOffsNewestFirst) == "one-offs-newest-first"
    assert eviction_order(backend, "lru") == "BCA"
    assert eviction_order(backend, "one-offs-newest-first") == "CBA"
    assert eviction_order(backend, "One-Offs-Newest-First") == "CBA"  # names are case-insensitive
    assert "one-offs-newest-first" in eviction_policies(backend)


def write_module(tmp_path, monkeypatch, name: str, source: str) -> None:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_policy_named_module_colon_class_is_imported_and_used(tmp_path, monkeypatch, backend: str) -> None:
    write_module(tmp_path, monkeypatch, "my_policies", """
        class NewestFirst:
            def priority(self, entry):
                return -entry.creation_time
    """)
    assert load_policy_spec("my_policies:NewestFirst") == "my_policies:NewestFirst"
    assert eviction_order(backend, "my_policies:NewestFirst") == "CBA"
    assert load_policy_spec("my_policies:NewestFirst") == "my_policies:NewestFirst"  # again: fine


def test_make_policy_loads_a_spec_not_registered_in_this_process(tmp_path, monkeypatch) -> None:
    """A sweep's worker process gets the spec string only: make_cache loads it there."""
    write_module(tmp_path, monkeypatch, "my_policies", """
        class Outer:
            class NewestFirst:
                def priority(self, entry):
                    return -entry.creation_time
    """)
    assert type(make_policy("my_policies:Outer.NewestFirst")).__qualname__ == "Outer.NewestFirst"
    assert eviction_order("radix", "my_policies:Outer.NewestFirst") == "CBA"


class NoPriority:
    def evict(self, entry: Any) -> float:
        return 0.0


class SegmentedWithoutChoose:
    segmented = True

    def priority(self, entry: Any) -> tuple[int, float]:
        return (0, entry.last_access_time)


class HookNotCallable:
    admit = 3

    def priority(self, entry: Any) -> float:
        return 0.0


class NeedsArguments:
    def __init__(self, threshold: int) -> None:
        self.threshold = threshold

    def priority(self, entry: Any) -> float:
        return 0.0


@pytest.mark.parametrize(
    "name, cls, message",
    [
        ("mine", OneOffsNewestFirst(), r"'mine' must be a class \(make_policy calls it\), got <"),
        ("mine", len, "'mine' must be a class"),
        ("mine", NoPriority, "NoPriority must have the method.s. priority "),
        ("mine", SegmentedWithoutChoose, "SegmentedWithoutChoose must have the method.s. choose "),
        ("mine", HookNotCallable, "HookNotCallable must have the method.s. admit "),
        ("mine", NeedsArguments, r"NeedsArguments\(\) must take no arguments .*, but it needs threshold"),
        ("lru", OneOffsNewestFirst, "'lru' is built in and cannot be replaced"),
        ("ARC", OneOffsNewestFirst, "'ARC' is built in and cannot be replaced"),
        ("", OneOffsNewestFirst, "name must be a non-empty string"),
        (None, OneOffsNewestFirst, "name must be a non-empty string, got None"),
    ],
)
def test_a_class_that_is_no_policy_or_a_built_in_name_is_refused(name: Any, cls: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        register_policy(name, cls)
    assert not USER_POLICIES


def test_a_taken_name_is_refused_unless_replace() -> None:
    register_policy("mine", OneOffsNewestFirst)
    register_policy("mine", OneOffsNewestFirst)  # the same class again changes nothing
    with pytest.raises(ValueError, match=r"'MINE' is already registered \(OneOffsNewestFirst\); pass"):
        register_policy("MINE", NoPriority)
    register_policy("mine", type("Other", (OneOffsNewestFirst,), {}), replace=True)
    assert USER_POLICIES["mine"].__name__ == "Other"


@pytest.mark.parametrize(
    "spec, message",
    [
        ("no_such_module_xyz:Policy", r"'no_such_module_xyz:Policy': cannot import 'no_such_module_xyz'"),
        ("my_policies:Missing", r"'my_policies:Missing': module 'my_policies' has no 'Missing'"),
        ("my_policies:", "named 'package.module:Class', got 'my_policies:'"),
        (":NewestFirst", "named 'package.module:Class', got ':NewestFirst'"),
        ("my_policies:helper", r"'my_policies:helper' must be a class"),
        ("broken_policies:X", r"'broken_policies:X': cannot import 'broken_policies': ZeroDivisionError"),
    ],
)
def test_a_spec_that_does_not_load_is_a_value_error_naming_it(tmp_path, monkeypatch, spec, message) -> None:
    write_module(tmp_path, monkeypatch, "my_policies", """
        def helper():
            pass
    """)
    write_module(tmp_path, monkeypatch, "broken_policies", "1 / 0\n")
    with pytest.raises(ValueError, match=message):
        load_policy_spec(spec)
    with pytest.raises(ValueError, match=message):  # and through make_cache, before any run
        make_cache("radix", CacheConfig(16 * PAGE, PAGE), eviction_policy=spec)
    assert not USER_POLICIES


def test_unregistering_a_built_in_or_unknown_name_is_refused() -> None:
    with pytest.raises(ValueError, match="'lru' is not a registered eviction policy .registered: none."):
        unregister_policy("lru")
    register_policy("mine", OneOffsNewestFirst)
    unregister_policy("MINE")
    with pytest.raises(ValueError, match="unknown eviction policy 'mine'"):
        make_cache("hashchain", CacheConfig(16 * PAGE, PAGE), eviction_policy="mine")
