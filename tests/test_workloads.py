"""Each built-in workload: shape, sharing and determinism."""

from __future__ import annotations

import pytest
from prefixcache.experiments.inputs.workloads import available_workloads, make_workload


@pytest.mark.parametrize("name", available_workloads())
def test_workload_is_deterministic_for_a_seed_and_changes_with_it(name: str) -> None:
    a, b, c = (make_workload(name, seed=s).generate() for s in (3, 3, 4))
    assert [r.prompt_token_ids for r in a] == [r.prompt_token_ids for r in b]
    assert [(r.arrival_time, r.max_new_tokens) for r in a] == [(r.arrival_time, r.max_new_tokens) for r in b]
    assert [r.prompt_token_ids for r in a] != [r.prompt_token_ids for r in c]
    assert len({r.request_id for r in a}) == len(a)
    assert [r.arrival_time for r in a] == sorted(r.arrival_time for r in a)


def test_multi_turn_chat_turn_repeats_previous_prompt_and_answer() -> None:
    w = make_workload("multi-turn-chat", conversations=1, turns=3, question_len=5, answer_len=4)
    reqs = w.generate()
    for prev, cur in zip(reqs, reqs[1:], strict=False):
        context = prev.prompt_token_ids + prev.planned_output_ids
        assert cur.prompt_token_ids[: len(context)] == context
        assert cur.num_prompt_tokens == len(context) + 5
        assert cur.arrival_time > prev.arrival_time


def test_generated_shared_prefix_groups_share_exactly_the_system_prompt() -> None:
    reqs = make_workload(
        "generated-shared-prefix",
        num_groups=2,
        prompts_per_group=3,
        system_prompt_len=20,
        question_len=7,
        output_len=5,
    ).generate()
    assert len(reqs) == 6 and all(r.num_prompt_tokens == 27 and r.max_new_tokens == 5 for r in reqs)
    assert len({r.prompt_token_ids[:20] for r in reqs}) == 2


def test_prefix_repetition_uses_num_prefixes_distinct_prefixes() -> None:
    reqs = make_workload(
        "prefix-repetition", num_requests=20, num_prefixes=4, prefix_len=8, suffix_len=3
    ).generate()
    assert len(reqs) == 20 and len({r.prompt_token_ids[:8] for r in reqs}) == 4


def test_tree_of_thought_has_branching_power_nodes_and_children_extend_parents() -> None:
    reqs = make_workload(
        "tree-of-thought", trees=1, branching=2, depth=3, root_len=10, thought_len=3
    ).generate()
    assert len(reqs) == 2 + 4 + 8
    assert sorted({r.num_prompt_tokens for r in reqs}) == [10, 13, 16]


def test_react_agent_context_grows_every_step() -> None:
    reqs = make_workload(
        "react-agent", agents=1, steps=3, system_len=8, task_len=2, action_len=2, observation_len=3
    ).generate()
    assert [r.num_prompt_tokens for r in reqs] == [10, 15, 20]


@pytest.mark.parametrize("name", ["few-shot", "shared-doc-qa", "rag"])
def test_document_workloads_share_long_prefixes(name: str) -> None:
    reqs = make_workload(name).generate()
    firsts = [r.prompt_token_ids[:64] for r in reqs]
    assert len(set(firsts)) < len(firsts)


def test_unknown_workload_or_parameter_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="valid: few-shot"):
        make_workload("nope")
    with pytest.raises(ValueError, match="no parameter"):
        make_workload("rag", turns=3)


def test_arrivals_are_common_random_numbers_across_sweep_points() -> None:
    """The TTFT sweep's fairness: one arrival sample per seed, whatever the prompts share."""
    def times(**kw: object) -> list[float]:
        reqs = make_workload("generated-shared-prefix", seed=3, request_rate=10.0, **kw).generate()
        return [r.arrival_time for r in reqs]

    base = times(system_prompt_len=16)
    assert base == times(system_prompt_len=200, question_len=8)
    assert base != [r.arrival_time for r in make_workload(
        "generated-shared-prefix", seed=4, request_rate=10.0, system_prompt_len=16).generate()]
    faster = [r.arrival_time for r in make_workload(
        "generated-shared-prefix", seed=3, request_rate=20.0, system_prompt_len=16).generate()]
    assert faster == pytest.approx([t / 2 for t in base])
    assert base == sorted(base) and base[0] > 0
