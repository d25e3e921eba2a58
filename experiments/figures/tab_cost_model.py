"""Macros: where the engine clock's constants come from (the calibration record that ``make
calibrate`` wrote, ``prefixcache/cost_model_measured.json``): what was timed, on which machine,
when, and how well a line fits. Checks that the stored engine studies ran under these constants,
so that the paper never credits one machine with another's clock. Writes
``generated/cost_model.tex``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prefixcache.experiments.figures.common import read_table
from prefixcache.experiments.figures.plotting import figure_main, fmt, tex_escape, write_macros

from prefixcache.cost_model import CostModel, clock_from_constants, read_measured

ENGINE_STUDIES = ("ttft", "scheduling")  # the studies whose cells run the engine's clock


def machine_text(record: dict[str, Any]) -> str:
    """E.g. "AMD EPYC, 2 cores (virtual machine), 1 torch thread, torch 2.13.0+cpu"."""
    m = record["machine"]
    if m["device"] == "cuda":
        return f"{m['device_name']}, torch {m['torch']}"
    threads = f"{m['torch_threads']} torch thread" + ("s" if m["torch_threads"] > 1 else "")
    box = " (virtual machine)" if m.get("virtual") else ""
    return f"{m['cpu']}, {m['cpu_count']} cores{box}, {threads}, torch {m['torch']}"


def model_text(record: dict[str, Any]) -> str:
    """E.g. "4 layers, dim 256, 32000-token vocabulary, reference attention, float32"."""
    c = record["model"]
    return (f"{c['n_layers']} layers, dim {c['dim']}, {c['vocab_size']}-token vocabulary, "
            f"{c['attention_impl']} attention, {c['dtype']}")


def check_studies_ran_under(cost: CostModel, results: Path) -> None:
    """ValueError if a stored engine study's cells ran under other CPU-clock constants than the
    file's (cells under a GPU roofline, built from code, not from the file, are not checked)."""
    for study in ENGINE_STUDIES:
        try:
            df = read_table(results / study / "summary")
        except FileNotFoundError:
            continue  # not run: nothing to contradict
        # Rows that ran no engine (scheduling's computed optimum) record no clock.
        recorded = df["cost_model"].dropna() if "cost_model" in df else []
        clocks = {clock_from_constants(json.loads(s)) for s in recorded}
        measured = {c for c in clocks if isinstance(c, CostModel)}
        if not clocks or measured - {cost}:
            raise ValueError(
                f"{results / study} ran under {sorted(map(repr, clocks)) or 'no recorded clock'}, "
                f"not the calibrated {cost}: rerun the study (make reproduce)"
            )


def make(results: Path, paper: Path) -> list[Path]:
    record = read_measured()
    cost = CostModel.measured()
    check_studies_ran_under(cost, results)
    fit = record["fit"]
    ratio = fmt(cost.decode_token_s / cost.prefill_token_s) if cost.prefill_token_s else "n/a"
    values = {
        "costSource": tex_escape(record["label"]),
        "costDevice": "GPU" if record["machine"]["device"] == "cuda" else "CPU",
        "costMachine": tex_escape(machine_text(record)),
        "costModel": tex_escape(model_text(record)),
        "costDate": tex_escape(record["date"]),
        "costStepOverheadMs": fmt(cost.step_overhead_s * 1e3, 2),
        "costPrefillUs": fmt(cost.prefill_token_s * 1e6, 0),
        "costDecodeUs": fmt(cost.decode_token_s * 1e6, 0),
        "costDecodeOverPrefill": ratio,
        "costRsquared": fmt(float(fit["r2"]), 3),
        "costMaxResidualPct": fmt(float(fit["max_rel_residual"]) * 100, 0),
        "costShapes": str(fit["points"]),
        "costRepeats": str(fit["repeats"]),
    }
    return [write_macros(paper, "cost_model", values)]


def main(argv: list[str] | None = None) -> int:
    return figure_main(make, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
