"""Reproduce the paper: run every study (reusing stored cells unless ``--force``), regenerate
every figure and table from the stored results, then build ``paper/main.pdf`` if LaTeX is
installed (figures and tables are made either way).

    python -m prefixcache.experiments.figures.reproduce --scale default   # minutes on 2 cores
    python -m prefixcache.experiments.figures.reproduce --scale full      # longer, whole traces

Scales: ``tiny`` (the end-to-end test, seconds), ``default``, ``full``. The operation-cost
figure reads ``results/bench/`` (ops, replay, upstream): wall-clock measurements that no rerun
reproduces byte for byte, so they are committed and only ``make bench`` / ``make upstream``
rewrite them; reproduce never runs a benchmark. The kernel figure reads
``results/kernel_bench/results.csv`` if a GPU run left one, and otherwise says the kernel was
not measured.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import time
from pathlib import Path

from prefixcache.experiments.figures import (
    fig_capacity,
    fig_decomposition,
    fig_divergence,
    fig_engine_traces,
    fig_eviction,
    fig_granularity,
    fig_hybrid,
    fig_hybrid_causes,
    fig_kernel,
    fig_ops,
    fig_policies,
    fig_routing,
    fig_routing_full,
    fig_scheduling,
    fig_side_channel,
    fig_structures,
    fig_tiers,
    fig_tiers_full,
    fig_ttft,
    plotting,
    study_capacity,
    study_decomposition,
    study_divergence,
    study_engine_traces,
    study_eviction,
    study_granularity,
    study_hybrid,
    study_hybrid_causes,
    study_routing,
    study_scheduling,
    study_side_channel,
    study_tiers,
    study_ttft,
    study_whole_traces,
    tab_cost_model,
    tab_features,
    tab_published,
    tab_whole_traces,
)
from prefixcache.experiments.figures.common import SCALES

STUDIES = [study_whole_traces, study_granularity, study_capacity, study_scheduling, study_eviction,
           study_ttft, study_side_channel, study_divergence, study_hybrid, study_routing, study_tiers,
           study_engine_traces, study_decomposition, study_hybrid_causes]
FIGURES = [fig_structures, fig_granularity, fig_capacity, fig_scheduling, fig_eviction, fig_policies,
           fig_ttft, fig_ops, fig_kernel, tab_published, tab_features, tab_whole_traces, tab_cost_model,
           fig_side_channel, fig_divergence, fig_hybrid, fig_routing, fig_routing_full, fig_tiers,
           fig_tiers_full, fig_engine_traces, fig_decomposition, fig_hybrid_causes]
LATEX_INSTALL = "apt-get install -y texlive-latex-recommended texlive-fonts-recommended latexmk"


def build_pdf(paper: Path) -> bool:
    """latexmk (else pdflatex + bibtex) in ``paper``; False, with how to install, if absent."""
    if shutil.which("latexmk"):
        cmd = [["latexmk", "-pdf", "-interaction=nonstopmode", "-halt-on-error", "main.tex"]]
    elif shutil.which("pdflatex"):
        pdf = ["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "main.tex"]
        cmd = [pdf, ["bibtex", "main"], pdf, pdf]
    else:
        print(f"no LaTeX found: figures and tables are made; to build paper/main.pdf: {LATEX_INSTALL}")
        return False
    for c in cmd:
        r = subprocess.run(c, cwd=paper, capture_output=True, text=True)
        if r.returncode != 0 and c[0] != "bibtex":
            print(f"{' '.join(c)} failed (see {paper / 'main.log'}):\n{r.stdout[-2000:]}")
            return False
    problems = latex_log_problems((paper / "main.log").read_text(errors="replace"))
    print(f"built {paper / 'main.pdf'}: " + ("; ".join(problems) if problems else
                                              "0 undefined references, 0 overfull boxes"))
    return not problems


def latex_log_problems(log: str) -> list[str]:
    """What a clean build must not have: undefined references or citations, overfull boxes."""
    counts = {
        "undefined references": len(re.findall(r"LaTeX Warning: Reference `[^']*' on page", log)),
        "undefined citations": len(re.findall(r"LaTeX Warning: Citation `[^']*' on page", log)),
        "overfull boxes": len(re.findall(r"^Overfull \\[hv]box", log, flags=re.M)),
    }
    return [f"{n} {what}" for what, n in counts.items() if n]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", default="default", choices=list(SCALES))
    ap.add_argument("--force", action="store_true", help="re-run cells already stored")
    ap.add_argument("--out", default="results", help="results folder")
    ap.add_argument("--paper", default=str(plotting.PAPER), help="paper folder (figures/, generated/)")
    ap.add_argument("--jobs", type=int, default=2, help="processes per study")
    ap.add_argument("--no-pdf", action="store_true", help="skip the LaTeX build")
    a = ap.parse_args(argv)
    results, paper = Path(a.out), Path(a.paper)
    t0 = time.perf_counter()
    times: dict[str, float] = {}
    for study in STUDIES:
        t = time.perf_counter()
        study.run(results, a.scale, a.force, a.jobs)
        times[study.STUDY] = round(time.perf_counter() - t, 1)
        print(f"  {study.STUDY}: {times[study.STUDY]:.1f} s")
    # Each study's runtime this time (cells already stored take none): a wall-clock file, kept
    # out of git with the rest of results/ (see .gitignore), never read by a figure.
    results.mkdir(parents=True, exist_ok=True)
    (results / f"reproduce_times_{a.scale}.json").write_text(
        json.dumps({"scale": a.scale, "force": a.force, "jobs": a.jobs, "studies_s": times}, indent=2))
    plotting.style()
    for fig in FIGURES:
        for p in fig.make(results, paper):
            print(f"wrote {p}")
    pdf = False if a.no_pdf else build_pdf(paper)
    print(f"reproduce ({a.scale}): studies, figures and tables in {time.perf_counter() - t0:.0f} s"
          + ("" if pdf else "; paper/main.pdf not built"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
