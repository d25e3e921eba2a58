"""Figure: the prefix-cache timing side channel per design, with and without per-tenant salt,
in simulation (the study's clock, by default the GPU roofline, background tenants) and in model
mode (wall-clock CPU timing, if ``make side-channel-timing`` left its file), and the hit rate
salt costs. Means over seeds with 95% confidence intervals. Reads ``results/side_channel``,
``results/bench/side_channel_model_mode.csv`` and, if present, ``results/cpu_clock/side_channel``
(the same study under the CPU-measured clock); writes ``figures/side_channel``,
``generated/side_channel.tex`` and ``generated/side_channel_cpu.tex`` (its macros as
``scCpu...``)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from prefixcache.experiments.analysis.side_channel import (
    DESIGNS,
    TOKEN_BUDGET,
    AttackConfig,
    channel_bits,
    evaluate,
    seed_ci,
)
from prefixcache.experiments.figures.common import (
    CPU_CLOCK_RESULTS,
    clock_label,
    clock_text,
    other_clock_macros,
)
from prefixcache.experiments.figures.plotting import PALETTE, figure_main, fmt, load, save, write_macros
from prefixcache.experiments.figures.study_side_channel import STUDY

from prefixcache.cost_model import clock_from_constants

MODEL_MODE = Path("bench") / "side_channel_model_mode.csv"
ATTACKS = ("whole", "token", "token-block")
ATTACK_LABEL = {"whole": "whole candidate", "token": "token by token", "token-block": "token, block-ending"}
COLOR = {"radix-p1": PALETTE["radix"], "radix-p16": "#ff9896", "hashchain-p16": PALETTE["hashchain"]}
LABEL = {"radix-p1": "radix p1", "radix-p16": "radix p16", "hashchain-p16": "hashchain B16"}
# Macro-name pieces (letters only).
DESIGN_KEY = {"radix-p1": "RadixOne", "radix-p16": "RadixSixteen", "hashchain-p16": "Hashchain"}
ATTACK_KEY = {"whole": "Whole", "token": "Token", "token-block": "TokenBlock"}


def ci_text(value: float, digits: int = 2) -> str:
    return "n/a" if math.isnan(value) else fmt(value, digits)


def accuracy_table(rows: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Per group of ``by``: mean accuracy over seeds with its 95% CI (``mean``, ``ci``), the
    bits per probe at that mean (``bits``; a mean of per-seed bits would count every seed's
    noise as information) and at the end of the CI farthest from chance (``bits_high``)."""
    table = seed_ci(rows, by, "accuracy")
    def bits(accuracy: float) -> float:
        return channel_bits(float(np.clip(accuracy, 0.0, 1.0)))

    half = table["ci"].fillna(0.0)
    table["bits"] = [bits(m) for m in table["mean"]]
    table["bits_high"] = [max(bits(m - h), bits(m + h)) for m, h in zip(table["mean"], half, strict=True)]
    return table


def model_mode_rows(probes: pd.DataFrame) -> pd.DataFrame:
    """``evaluate`` of every (design, salt, seed) cell of the model-mode probes."""
    rows = []
    for (design, salted, seed), g in probes.groupby(["design", "salted", "seed"], sort=True):
        for r in evaluate(g, DESIGNS[str(design)][1]):
            rows.append(dict(design=design, salted=bool(salted), seed=seed, **r))
    return pd.DataFrame(rows)


def bars(ax: plt.Axes, table: pd.DataFrame, column: str, groups: list, labels: list[str],
         scale: float = 1.0) -> None:
    """``table``'s ``mean`` (x ``scale``, CI as error bars) per ``column`` value (groups) x
    design x salt (hatched: salted)."""
    width = 0.13
    for a, group in enumerate(groups):
        for d, design in enumerate(DESIGNS):
            for s, salted in enumerate((False, True)):
                row = table[(table[column] == group) & (table["design"] == design)
                            & (table["salted"] == salted)]
                if row.empty:
                    continue
                ax.bar(a + (2 * d + s - 2.5) * width, row["mean"].iloc[0] * scale, width,
                       yerr=np.nan_to_num(row["ci"].iloc[0]) * scale, capsize=1.5, color=COLOR[design],
                       alpha=0.45 if salted else 1.0, hatch="///" if salted else None,
                       edgecolor=COLOR[design] if salted else "white", lw=0.3,
                       error_kw=dict(lw=0.6), label=None if a else f"{LABEL[design]}{' + salt' * salted}")
    ax.set_xticks(range(len(groups)), labels, fontsize=6)


def accuracy_bars(ax: plt.Axes, table: pd.DataFrame, title: str) -> None:
    bars(ax, table, "attack", list(ATTACKS), [ATTACK_LABEL[a] for a in ATTACKS])
    ax.axhline(0.5, color="0.3", ls="--", lw=0.8)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("balanced accuracy (chance 0.5)")
    ax.set_title(title, fontsize=8)


def macros_for(table: pd.DataFrame, prefix: str) -> dict[str, str]:
    values = {}
    for _, r in table.iterrows():
        key = f"{prefix}{ATTACK_KEY[r['attack']]}{DESIGN_KEY[r['design']]}{'Salt' if r['salted'] else ''}"
        values[f"{key}Acc"] = fmt(float(r["mean"]), 2)
        values[f"{key}CI"] = ci_text(float(r["ci"]))
        values[f"{key}Bits"] = fmt(float(r["bits"]), 2)
    return values


def read_study(results: Path) -> tuple[pd.DataFrame, dict, pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(attack rows, the study's config, accuracy by load, accuracy at the headline load, salt
    rows) of the study stored under ``results``."""
    rows = load(results, STUDY)
    meta = json.loads((results / STUDY / "config.json").read_text())
    rows["salted"] = rows["salted"].astype(bool)
    by_load = accuracy_table(rows, ["load", "attack", "design", "salted"])
    at_head = by_load[by_load["load"] == float(meta["headline_load"])]
    salt = load(results, STUDY, "salt_cost")
    salt["salted"] = salt["salted"].astype(bool)
    return rows, meta, by_load, at_head, salt


def make(results: Path, paper: Path) -> list[Path]:
    rows, meta, by_load, at_head, salt = read_study(results)
    headline = float(meta["headline_load"])
    clock = clock_label(meta["cost_model"])
    model_path = results / MODEL_MODE
    model = model_mode_rows(pd.read_csv(model_path)) if model_path.exists() else None

    fig, axes = plt.subplots(2, 2, figsize=(7.0, 5.0))
    accuracy_bars(axes[0, 0], at_head, f"simulation ({clock} clock), load {headline:.0%}")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=6, fontsize=6, frameon=False)
    ax = axes[0, 1]
    span = float(by_load["load"].max()) * 100 or 1.0
    for d, design in enumerate(DESIGNS):
        for attack, marker, ls in (("whole", "o", "-"), ("token", "s", "--")):
            for salted in (False, True):
                g = by_load[(by_load["design"] == design) & (by_load["attack"] == attack)
                            & (by_load["salted"] == salted)].sort_values("load")
                x = g["load"] * 100 + (d - 1) * 0.012 * span  # apart, so equal designs both show
                ax.errorbar(x, g["mean"], yerr=np.nan_to_num(g["ci"]), marker=marker, ms=3,
                            lw=0.6 if salted else 1.0, ls=":" if salted else ls, capsize=1.5,
                            color="0.65" if salted else COLOR[design], zorder=1 if salted else 2,
                            label=None if salted or d else ATTACK_LABEL[attack])
    ax.axhline(0.5, color="0.3", ls="--", lw=0.8)
    ax.set_xlabel("background load (% of no-cache prefill capacity)")
    ax.set_ylabel("balanced accuracy")
    ax.set_ylim(0.3, 1.05)
    ax.set_title(f"against load ({clock}; grey dotted: with salt)", fontsize=8)
    ax.legend(fontsize=6)
    if model is not None:
        model_table = accuracy_table(model, ["attack", "design", "salted"])
        accuracy_bars(axes[1, 0], model_table, "model mode: wall-clock CPU timing, no background")
    else:
        model_table = None
        axes[1, 0].axis("off")
        axes[1, 0].text(0.5, 0.5, "model mode not measured:\nrun make side-channel-timing",
                        ha="center", va="center", fontsize=8)
    ax = axes[1, 1]
    hit = seed_ci(salt, ["design", "tenants", "salted"], "hit_rate")
    tenants = sorted(hit["tenants"].unique())
    bars(ax, hit, "tenants", tenants, [f"{t} tenants" for t in tenants], scale=100)
    ax.set_ylabel("token hit rate (%)")
    ax.set_ylim(0, 100)
    ax.set_title("what per-tenant salt costs (shared-document QA)", fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    out = [save(fig, "side_channel", paper)]
    macros = values(rows, meta, by_load, at_head, salt, model, model_table, model_path.with_suffix(".json"))
    out.append(write_macros(paper, "side_channel", macros))
    cpu: dict[str, str] = {"scMeasured": "no"}  # the paper guards the comparison with \ifx
    if (results / CPU_CLOCK_RESULTS / STUDY / "config.json").exists():  # the study on the CPU clock
        cpu = values(*read_study(results / CPU_CLOCK_RESULTS), None, None, model_path)
        del cpu["scModelMeasured"]
        cpu["scMeasured"] = "yes"
    out.append(write_macros(paper, "side_channel_cpu", other_clock_macros(cpu, "sc")))
    return out


def salt_drop(salt: pd.DataFrame) -> pd.DataFrame:
    """Per (design, tenants): the hit rate without salt minus with it, paired by seed, as a
    mean over seeds with its 95% CI (``mean``, ``ci``), in hit-rate units."""
    wide = salt.pivot_table(index=["design", "tenants", "seed"], columns="salted", values="hit_rate")
    wide = wide.reset_index()
    wide["drop"] = wide[False] - wide[True]
    return seed_ci(wide, ["design", "tenants"], "drop")


def model_values(model: pd.DataFrame, table: pd.DataFrame, meta_path: Path) -> dict[str, str]:
    """Macros of the model-mode run: accuracies, its machine and the per-token wall cost (the
    whole-candidate gap between wrong and right guesses over the tokens a hit saves)."""
    v = {"scModelMeasured": "yes", **macros_for(table, "scModel"),
         "scModelSeeds": str(model["seed"].nunique())}
    whole = model[(model["design"] == "radix-p1") & ~model["salted"] & (model["attack"] == "whole")]
    per_token = (whole["wrong_ttft_median_s"] - whole["right_ttft_median_s"]) / (
        whole["right_hit_tokens"] - whole["wrong_hit_tokens"])
    v["scModelTokenCostMs"] = fmt(float(per_token.median()) * 1e3, 2)
    v["scModelMissMs"] = fmt(float(whole["wrong_ttft_median_s"].median()) * 1e3, 1)
    if meta_path.exists():
        meta = json.loads(meta_path.read_text())
        m = meta["model"]
        machine, attack = meta["machine"], meta["attack"]
        v.update(scModelLayers=str(m["n_layers"]), scModelDim=str(m["dim"]),
                 scModelVocab=str(m["vocab_size"]), scModelCPUs=str(machine["cpu_count"]),
                 scModelDate=meta["date"][:10], scModelLoadAvg=fmt(float(machine["load_average"][0]), 1),
                 scModelWallS=fmt(float(meta["wall_s"]), 0), scModelSecretLen=str(attack["secret_len"]),
                 scModelWholeVictims=str(attack["whole_victims"]))
    return v


def values(rows: pd.DataFrame, meta: dict, by_load: pd.DataFrame, at_head: pd.DataFrame, salt: pd.DataFrame,
           model: pd.DataFrame | None, model_table: pd.DataFrame | None, model_meta: Path) -> dict[str, str]:
    cfg = json.loads(rows["attack_config"].iloc[0])
    clock = meta["cost_model"]  # the linear clock's three constants, or the roofline's
    loads = sorted(by_load["load"].unique())
    v = {
        "scSeeds": str(rows["seed"].nunique()),
        "scHeadlineLoad": fmt(float(meta["headline_load"]) * 100, 0),
        "scLoadMax": fmt(float(loads[-1]) * 100, 0),
        "scPrefixLen": str(cfg["prefix_len"]), "scSecretLen": str(cfg["secret_len"]),
        "scQuestionLen": str(cfg["question_len"]), "scFillerLen": str(cfg["filler_len"]),
        "scWholeVictims": str(cfg["whole_victims"]), "scTokenVictims": str(cfg["token_victims"]),
        "scWholeProbes": str(2 * cfg["whole_victims"]),
        "scTokenProbes": str(2 * cfg["secret_len"] * cfg["token_victims"]),
        "scProbeSpacing": fmt(float(cfg["probe_spacing"]), 0),
        "scClock": clock_text(clock),
        "scStepOverheadMs": fmt(clock["step_overhead_s"] * 1e3, 1),
    }
    if "prefill_token_s" in clock:  # the linear clock's per-token costs
        v.update(scPrefillTokenMs=fmt(clock["prefill_token_s"] * 1e3, 2),
                 scDecodeTokenMs=fmt(clock["decode_token_s"] * 1e3, 2))
    # What a hit is worth against what a probe waits for, on this clock: a probe's prefill after
    # the public prompt alone, the time one more cached token saves it, and a full step of
    # others' prefill (what a probe may queue behind).
    cost, probe, public = clock_from_constants(clock), AttackConfig(**cfg).probe_len, cfg["prefix_len"]
    saved = cost.isolated_prefill_s(probe, public) - cost.isolated_prefill_s(probe, public + 1)
    full = TOKEN_BUDGET * (TOKEN_BUDGET + 1) // 2
    v.update(scProbeMs=fmt(float(cost.isolated_prefill_s(probe, public)) * 1e3, 1),
             scTokenSavedUs=fmt(float(saved) * 1e6, 3),
             scFullStepMs=fmt(cost.step_time(TOKEN_BUDGET, 0, 1, full, 0) * 1e3, 0))
    v.update(macros_for(at_head, "sc"))
    plain = by_load[~by_load["salted"]]
    v.update(macros_for(by_load[by_load["load"] == loads[0]], "scIdle"))
    v.update(macros_for(plain[plain["load"] == loads[-1]], "scMaxLoad"))
    salted = by_load[by_load["salted"]]
    half = salted["ci"].fillna(0.0)
    covers = (salted["mean"] - half <= 0.5) & (salted["mean"] + half >= 0.5)
    v.update(scSaltAccMin=fmt(float(salted["mean"].min()), 3),
             scSaltAccMax=fmt(float(salted["mean"].max()), 3),
             scSaltGroupsAtChance=str(int(covers.sum())), scSaltGroups=str(len(salted)),
             scSaltBitsMax=fmt(float(salted["bits"].max()), 3),
             scSaltBitsHigh=fmt(float(salted["bits_high"].max()), 2),
             scChanceBits=fmt(channel_bits(0.5), 0))
    drop = salt_drop(salt)
    hit = seed_ci(salt, ["design", "tenants", "salted"], "hit_rate")
    tenants = sorted(salt["tenants"].unique())
    for tag, t in (("Low", tenants[0]), ("High", tenants[-1])):
        v[f"scSaltTenants{tag}"] = str(int(t))
        for design, key in DESIGN_KEY.items():
            d = drop[(drop["design"] == design) & (drop["tenants"] == t)].iloc[0]
            v[f"scSaltDrop{key}{tag}"] = fmt(float(d["mean"]) * 100, 1)
            v[f"scSaltDrop{key}{tag}CI"] = ci_text(float(d["ci"]) * 100, 1)
            for salted_, name in ((False, "scSaltHit"), (True, "scSaltHitSalted")):
                h = hit[(hit["design"] == design) & (hit["tenants"] == t) & (hit["salted"] == salted_)]
                v[f"{name}{key}{tag}"] = fmt(float(h["mean"].iloc[0]) * 100, 1)
    spread = drop.groupby("tenants")["mean"].agg(lambda x: x.max() - x.min()).max()
    v["scSaltDropDesignSpread"] = fmt(float(spread) * 100, 1)
    if model is not None and model_table is not None:
        v.update(model_values(model, model_table, model_meta))
    else:
        v["scModelMeasured"] = "no"
    return v


def main(argv: list[str] | None = None) -> int:
    return figure_main(make, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
