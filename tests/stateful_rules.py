"""The rules of the lifecycle machines (tests/stateful_lifecycle.py) whose drawn ranges differ
per design, and how the machines run: a design takes ``new_request = new_request_rule(...)``
with its own ranges, and collects its machines' unittest cases with ``machine_tests``.

Hypothesis picks rules from those a class has, ordered by targets, arguments and name, and
draws with constants it finds in the test sources: a machine's counts of what it exercised
(its not-vacuous checks) change with its rule set and with edits to these files, not by luck.
"""

from __future__ import annotations

import os
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, precondition, rule

from prefixcache import Request

VOCAB = 3
Namespace = tuple[str | None, str | None]  # (salt, LoRA)
SALTED: list[Namespace] = [(None, None), ("s", None)]
WAITING = Bundle("waiting")
MATCHED = Bundle("matched")  # (a waiting request, the match taken for it back then)


def suffixes(max_size: int) -> st.SearchStrategy[list[int]]:
    return st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=max_size)


def profile_settings(runs: int, steps: int, thorough_runs: int, thorough_steps: int = 100) -> settings:
    """A machine's settings: ``thorough_runs`` runs of up to ``thorough_steps`` steps in the
    thorough profile; else ``runs`` of up to ``steps``, derandomized (its not-vacuous counters
    are then the same in every run)."""
    if os.environ.get("HYPOTHESIS_PROFILE") == "thorough":
        return settings(max_examples=thorough_runs, stateful_step_count=thorough_steps)
    return settings(max_examples=runs, stateful_step_count=steps, derandomize=True)


def machine_tests(
    *machines: type[RuleBasedStateMachine], runs: int, steps: int, thorough_runs: int
) -> list[type]:
    """Each machine's unittest case (collect them as ``Test...`` names), run under
    ``profile_settings(runs, steps, thorough_runs)``."""
    cases = [machine.TestCase for machine in machines]
    for case in cases:
        case.settings = profile_settings(runs, steps, thorough_runs)
    return cases


def new_request_rule(share: int, suffix: int, namespaces: list[Namespace] | None = None) -> Any:
    """The rule adding a request that shares up to ``share`` tokens with an earlier one, then up
    to ``suffix`` new ones, under one of ``namespaces`` (none given: none drawn)."""
    drawn = {"share": st.integers(0, share), "suffix": suffixes(suffix)}
    if namespaces is not None:
        drawn["ns"] = st.sampled_from(namespaces)

    @rule(target=WAITING, **drawn)
    def new_request(self: Any, share: int, suffix: list[int], ns: Namespace = (None, None)) -> Request:
        return self._new_request(share, suffix, ns)

    return new_request


def step_rule(chunk: int, decode: int | None = None) -> Any:
    """The rule computing a live request's next prefill chunk (up to ``chunk`` tokens), or once
    its prompt is done one decode token (up to ``decode`` at once, given)."""
    drawn = {"chunk": st.integers(1, chunk)} | ({} if decode is None else {"decode": st.integers(1, decode)})

    @precondition(lambda self: self.live_reqs)
    @rule(data=st.data(), **drawn)
    def step(self: Any, data: st.DataObject, chunk: int, decode: int = 1) -> None:
        self._step(self._pick(data), chunk, decode)

    return step


def evict_rule(num_tokens: int) -> Any:
    """The rule evicting up to ``num_tokens`` tokens: pinned pages stay."""

    @rule(num_tokens=st.integers(0, num_tokens))
    def evict(self: Any, num_tokens: int) -> None:
        self._evict(num_tokens)

    return evict
