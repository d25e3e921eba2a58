"""The side-channel study: with per-tenant salt a probe's TTFT says nothing about the victim's
secret (right and wrong guesses take exactly the same time), without it the radix tree at
page 1 leaks every guessed token; 16-token pages leak a token guess only where it completes a
block; the bits and confidence-interval arithmetic; and the tiny study, figure and model-mode
smoke run end to end."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prefixcache.experiments.analysis import side_channel_timing
from prefixcache.experiments.analysis.metrics import mean_ci95
from prefixcache.experiments.analysis.side_channel import (
    DESIGNS,
    AttackConfig,
    balanced_accuracy,
    build_scenario,
    channel_bits,
    default_cost_model,
    evaluate,
    fit_threshold,
    make_design_cache,
    poisson_rate,
    salt_cost_hit_rate,
    seed_ci,
    simulate,
)

# Small but complete: the 24-token secret after a 32-token prefix has one block-ending guess.
SMALL = AttackConfig(prefix_len=32, secret_len=24, question_len=8, filler_len=4, whole_victims=4,
                     token_victims=2)


def pairs(probes: pd.DataFrame, attack: str) -> pd.DataFrame:
    """One row per twin pair of the attack phase: the right and the wrong guess side by side."""
    real = probes[(probes["phase"] == "attack") & (probes["attack"] == attack)]
    right = real[real["truth"]].set_index("pair")
    wrong = real[~real["truth"]].set_index("pair")
    assert len(right) == len(wrong) > 0 and right.index.equals(wrong.index.sort_values())
    return right.merge(wrong, left_index=True, right_index=True, suffixes=("_right", "_wrong"))


def score(probes: pd.DataFrame, page_size: int) -> dict[str, dict]:
    return {r["attack"]: r for r in evaluate(probes, page_size)}


# ------------------------------------------------------------------------------ salt and leaks
@pytest.mark.parametrize("design", list(DESIGNS))
def test_with_salt_right_and_wrong_guesses_take_the_same_time(design: str) -> None:
    probes = simulate(design, SMALL, seed=0, salted=True, load=0.0)
    for attack in ("whole", "token"):
        p = pairs(probes, attack)
        assert (p["hit_tokens_right"] == p["hit_tokens_wrong"]).all()
        assert np.abs(p["ttft_s_right"] - p["ttft_s_wrong"]).max() < 1e-9
    scores = score(probes, DESIGNS[design][1])
    assert all(r["accuracy"] == 0.5 for r in scores.values())
    # Not a broken classifier: on its own decoys (its own namespace) the attacker sees every hit.
    assert scores["whole"]["calibration_accuracy"] == 1.0


def test_without_salt_radix_page_one_leaks_every_guessed_token() -> None:
    cost = default_cost_model()
    probes = simulate("radix-p1", SMALL, seed=0, salted=False, load=0.0, cost=cost)
    for attack, saved in (("whole", SMALL.secret_len), ("token", 1)):
        p = pairs(probes, attack)
        assert ((p["hit_tokens_right"] - p["hit_tokens_wrong"]) == saved).all()
        gap = p["ttft_s_wrong"] - p["ttft_s_right"]  # idle: exactly the prefill a hit saves
        assert np.allclose(gap, cost.prefill_token_s * saved, rtol=1e-6, atol=1e-12)
    scores = score(probes, 1)
    assert scores["whole"]["accuracy"] == scores["token"]["accuracy"] == 1.0
    assert scores["token"]["bits"] == 1.0


@pytest.mark.parametrize("design", ["radix-p16", "hashchain-p16"])
def test_sixteen_token_pages_leak_a_token_guess_only_where_it_completes_a_block(design: str) -> None:
    probes = simulate(design, SMALL, seed=1, salted=False, load=0.0)
    p = pairs(probes, "token")
    ends_block = p["guess_end_right"] % 16 == 0
    assert ends_block.any() and not ends_block.all()
    saved = p["hit_tokens_right"] - p["hit_tokens_wrong"]
    assert (saved[ends_block] == 16).all() and (saved[~ends_block] == 0).all()
    assert (p.loc[~ends_block, "ttft_s_right"] - p.loc[~ends_block, "ttft_s_wrong"]).abs().max() < 1e-9
    scores = score(probes, 16)
    assert scores["token-block"]["accuracy"] == 1.0
    assert scores["token"]["accuracy"] < 0.6  # the other guesses say nothing
    whole = pairs(probes, "whole")  # a whole candidate hits the one whole block it fills
    assert ((whole["hit_tokens_right"] - whole["hit_tokens_wrong"]) == 16).all()


def test_under_load_the_radix_token_attack_beats_chance_and_salt_takes_it_to_chance() -> None:
    leak, salted = [], []
    for seed in (0, 1):
        leak.append(score(simulate("radix-p1", SMALL, seed, False, load=0.1), 1)["token"]["accuracy"])
        probes = simulate("radix-p1", SMALL, seed, True, load=0.1)
        p = pairs(probes, "token")
        assert (p["hit_tokens_right"] == p["hit_tokens_wrong"]).all()  # the timing noise is all there is
        salted.append(score(probes, 1)["token"]["accuracy"])
    assert min(leak) > 0.75
    assert max(abs(a - 0.5) for a in salted) < 0.15


def test_probes_never_repeat_a_guess_and_fillers_never_extend_one() -> None:
    scenario = build_scenario(SMALL, seed=3, salted=True)
    prompts = [tuple(p.request.prompt_token_ids) for p in scenario.probes]
    assert len(set(prompts)) == len(prompts)
    half = SMALL.vocab_size // 2
    for p in scenario.probes:
        tokens = p.request.prompt_token_ids
        assert all(t < half for t in tokens[: p.guess_end])
        assert all(t >= half for t in tokens[p.guess_end:])
        assert p.request.cache_salt == "attacker"
    by_pair: dict[int, list[bool]] = {}
    for p in scenario.probes:
        by_pair.setdefault(p.pair, []).append(p.truth)
    assert all(sorted(t) == [False, True] for t in by_pair.values())
    assert {r.cache_salt for r in scenario.plants} == {"attacker", "victim"}
    assert {r.cache_salt for r in build_scenario(SMALL, seed=3, salted=False).plants} == {None}


def test_what_salt_costs_grows_with_the_tenants() -> None:
    for design in ("radix-p1", "hashchain-p16"):
        one = [salt_cost_hit_rate(design, 0, 1, salted, num_requests=24) for salted in (False, True)]
        assert one[0] == one[1] > 0  # one tenant: salt changes nothing
        many = [salt_cost_hit_rate(design, 0, 8, salted, num_requests=24) for salted in (False, True)]
        assert many[0] == one[0] and many[1] < many[0]


def test_bad_inputs_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="secret_len"):
        AttackConfig(secret_len=0)
    with pytest.raises(ValueError, match="vocab_size"):
        AttackConfig(vocab_size=64, whole_victims=8)
    with pytest.raises(ValueError, match="probe_spacing"):
        AttackConfig(probe_spacing=-1.0)
    with pytest.raises(ValueError, match="unknown design"):
        make_design_cache("radix-p4")
    with pytest.raises(ValueError, match="load"):
        poisson_rate(-0.1, 512, default_cost_model())
    with pytest.raises(ValueError, match="tenants"):
        salt_cost_hit_rate("radix-p1", 0, 0, True)
    with pytest.raises(ValueError, match="both classes"):
        fit_threshold([0.1, 0.2], [True, True])
    with pytest.raises(ValueError, match="equal-length"):
        fit_threshold([0.1, 0.2], [True])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        channel_bits(1.5)


# ------------------------------------------------------------------------------ the arithmetic
def h2(p: float) -> float:
    return 0.0 if p in (0.0, 1.0) else -p * math.log2(p) - (1 - p) * math.log2(1 - p)


@given(st.floats(0.0, 1.0))
def test_bits_per_probe_are_one_minus_the_binary_entropy(accuracy: float) -> None:
    bits = channel_bits(accuracy)
    assert bits == pytest.approx(1.0 - h2(accuracy), abs=1e-12)
    assert bits == pytest.approx(channel_bits(1.0 - accuracy), abs=1e-12)  # a flipped call is as good
    assert 0.0 <= bits <= 1.0 + 1e-12
    assert channel_bits(0.5) == 0.0 and channel_bits(1.0) == 1.0


@given(st.floats(0.0, 1.0), st.floats(0.0, 1.0))
def test_bits_bound_the_information_of_an_asymmetric_probe(miss_rate: float, false_alarm: float) -> None:
    """A probe that misses a right guess with probability ``miss_rate`` and calls a wrong one a
    hit with ``false_alarm`` carries, with equiprobable guesses, at least ``channel_bits`` of its
    balanced accuracy (the docstring's claim: symmetrising a channel only loses information)."""
    p_hit = (1 - miss_rate + false_alarm) / 2  # P(call = hit)
    information = h2(p_hit) - (h2(miss_rate) + h2(false_alarm)) / 2
    balanced = ((1 - miss_rate) + (1 - false_alarm)) / 2
    assert information >= channel_bits(balanced) - 1e-9


@given(st.lists(st.booleans(), min_size=2, max_size=40).filter(lambda t: any(t) and not all(t)),
       st.booleans())
def test_a_call_that_ignores_the_truth_scores_exactly_chance(truth: list[bool], call: bool) -> None:
    assert balanced_accuracy([call] * len(truth), truth) == 0.5
    assert balanced_accuracy(truth, truth) == 1.0


@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=20), st.lists(st.floats(1.5, 3.0), min_size=1,
       max_size=20))
def test_the_threshold_separates_calibration_probes_that_can_be_separated(hits: list[float],
                                                                         misses: list[float]) -> None:
    ttft = np.array(hits + misses)
    truth = np.array([True] * len(hits) + [False] * len(misses))
    cut = fit_threshold(ttft, truth)
    assert balanced_accuracy(ttft < cut, truth) == 1.0
    assert max(hits) < cut < min(misses)


def test_the_ci_over_seeds_covers_the_true_mean_95_percent_of_the_time() -> None:
    rng = np.random.default_rng(0)
    covered = 0
    trials = 2000
    for _ in range(trials):
        mean, half = mean_ci95(rng.normal(0.7, 0.1, 5).tolist())
        covered += abs(mean - 0.7) <= half
    assert 0.93 <= covered / trials <= 0.97
    df = pd.DataFrame(dict(design=["a"] * 5 + ["b"] * 5, accuracy=[0.5] * 5 + [0.6, 0.7, 0.8, 0.9, 1.0]))
    table = seed_ci(df, ["design"], "accuracy").set_index("design")
    assert table.loc["a", "ci"] == 0.0 and table.loc["a", "mean"] == 0.5
    assert (table.loc["b", "mean"], table.loc["b", "ci"]) == mean_ci95([0.6, 0.7, 0.8, 0.9, 1.0])
    assert (table["seeds"] == 5).all()


# ------------------------------------------------------------------------------ end to end
def test_the_tiny_study_figure_and_model_mode_run(tmp_path: Path) -> None:
    from prefixcache.experiments.figures import fig_side_channel, study_side_channel

    results, paper = tmp_path / "results", tmp_path / "paper"
    study_side_channel.run(results, "tiny", jobs=1)
    study_side_channel.run(results / "cpu_clock", "tiny", jobs=1, clock="cpu")  # the paper's comparison
    csv = results / "bench" / "side_channel_model_mode.csv"
    assert side_channel_timing.main(["--quick", "--out", str(csv)]) == 0
    probes = pd.read_csv(csv)
    assert set(probes["design"]) == set(DESIGNS) and set(probes["salted"]) == {False, True}
    assert json.loads(csv.with_suffix(".json").read_text())["label"] == side_channel_timing.LABEL

    for p in fig_side_channel.make(results, paper):
        assert p.exists() and p.stat().st_size > 0
    tex = (paper / "generated" / "side_channel.tex").read_text()
    macros = dict(re.findall(r"\\newcommand\{\\([A-Za-z]+)\}\{([^}]*)\}", tex))
    cpu_tex = (paper / "generated" / "side_channel_cpu.tex").read_text()
    cpu = dict(re.findall(r"\\newcommand\{\\([A-Za-z]+)\}\{([^}]*)\}", cpu_tex))
    assert cpu["scCpuClock"] == "measured on a CPU" and macros["scClock"].endswith("(roofline)")
    assert cpu["scCpuIdleTokenRadixOneAcc"] == "1.00"  # an idle server leaks under either clock
    assert "nan" not in " ".join(macros.values()).lower()
    assert macros["scModelMeasured"] == "yes" and macros["scSeeds"] == "2"
    assert macros["scSaltGroupsAtChance"] == macros["scSaltGroups"]  # salted: every CI covers 0.5
    assert macros["scIdleTokenRadixOneAcc"] == "1.00" and macros["scIdleTokenRadixOneSaltAcc"] == "0.50"
    main_tex = (Path(__file__).resolve().parents[1] / "paper" / "main.tex").read_text()
    used = set(re.findall(r"\\(sc[A-Z][A-Za-z]*)", main_tex))  # the section, guarded parts included
    assert used and used <= set(macros) | set(cpu), f"undefined: {sorted(used - set(macros) - set(cpu))}"

    stamps = {p: p.stat().st_mtime_ns for p in results.glob("side_channel/*/summary.json")}
    study_side_channel.run(results, "tiny", jobs=1)  # every cell read back, none rerun
    assert stamps and all(p.stat().st_mtime_ns == t for p, t in stamps.items())
