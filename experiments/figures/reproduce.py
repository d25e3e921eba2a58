"""Reproduce the paper: run every study (reusing stored cells unless ``--force``), regenerate
every figure and table from the stored results, then build ``paper/main.pdf`` if LaTeX is
installed (figures and tables are made either way).

 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
python -m prefixcache.experiments.figures.reproduce --scale default   # minutes on 2 cores
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
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
import shutil
import subprocess
import time
from pathlib import Path

from prefixcache.experiments.figures import (
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
fig_capacity,
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
fig_divergence,
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
fig_eviction,
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
fig_granularity,
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
fig_hybrid,
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
fig_kernel,
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
fig_ops,
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
fig_policies,
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
fig_routing,
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
fig_scheduling,
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
fig_side_channel,
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
fig_structures,
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
fig_tiers,
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
fig_ttft,
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
plotting,
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
study_capacity,
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
study_divergence,
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
study_eviction,
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
study_granularity,
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
study_hybrid,
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
study_routing,
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
study_scheduling,
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
study_side_channel,
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
study_tiers,
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
study_ttft,
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
study_whole_traces,
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
tab_cost_model,
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
tab_features,
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
tab_published,
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
tab_whole_traces,
)
from prefixcache.experiments.figures.common import SCALES

STUDIES = [study_whole_traces, study_granularity, study_capacity, study_scheduling, study_eviction,
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
       study_ttft, study_side_channel, study_divergence, study_hybrid, study_routing, study_tiers]
FIGURES = [fig_structures, fig_granularity, fig_capacity, fig_scheduling, fig_eviction, fig_policies,
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
       fig_ttft, fig_ops, fig_kernel, tab_published, tab_features, tab_whole_traces, tab_cost_model,
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
       fig_side_channel, fig_divergence, fig_hybrid, fig_routing, fig_tiers]
LATEX_INSTALL = "apt-get install -y texlive-latex-recommended texlive-fonts-recommended latexmk"


def build_pdf(paper: Path) -> bool:
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
"""latexmk (else pdflatex + bibtex) in ``paper``; False, with how to install, if absent."""
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
if shutil.which("latexmk"):
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
    cmd = [["latexmk", "-pdf", "-interaction=nonstopmode", "-halt-on-error", "main.tex"]]
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
elif shutil.which("pdflatex"):
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
    pdf = ["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "main.tex"]
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
    cmd = [pdf, ["bibtex", "main"], pdf, pdf]
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
else:
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
    print(f"no LaTeX found: figures and tables are made; to build paper/main.pdf: {LATEX_INSTALL}")
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
    return False
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
for c in cmd:
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
    r = subprocess.run(c, cwd=paper, capture_output=True, text=True)
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
    if r.returncode != 0 and c[0] != "bibtex":
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
        print(f"{' '.join(c)} failed (see {paper / 'main.log'}):\n{r.stdout[-2000:]}")
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
        return False
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
print(f"built {paper / 'main.pdf'}")
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
return True


def main(argv: list[str] | None = None) -> int:
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
ap.add_argument("--scale", default="default", choices=list(SCALES))
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
ap.add_argument("--force", action="store_true", help="re-run cells already stored")
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
ap.add_argument("--out", default="results", help="results folder")
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
ap.add_argument("--paper", default=str(plotting.PAPER), help="paper folder (figures/, generated/)")
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
ap.add_argument("--jobs", type=int, default=2, help="processes per study")
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
ap.add_argument("--no-pdf", action="store_true", help="skip the LaTeX build")
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
a = ap.parse_args(argv)
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
results, paper = Path(a.out), Path(a.paper)
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
t0 = time.perf_counter()
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
times: dict[str, float] = {}
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
for study in STUDIES:
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
    t = time.perf_counter()
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
    study.run(results, a.scale, a.force, a.jobs)
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
    times[study.STUDY] = round(time.perf_counter() - t, 1)
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
    print(f"  {study.STUDY}: {times[study.STUDY]:.1f} s")
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
# Each study's runtime this time (cells already stored take none): a wall-clock file, kept
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
# out of git with the rest of results/ (results/.gitignore rules), never read by a figure.
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
results.mkdir(parents=True, exist_ok=True)
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
(results / f"reproduce_times_{a.scale}.json").write_text(
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
    json.dumps({"scale": a.scale, "force": a.force, "jobs": a.jobs, "studies_s": times}, indent=2))
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
plotting.style()
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
for fig in FIGURES:
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
    for p in fig.make(results, paper):
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
        print(f"wrote {p}")
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
pdf = False if a.no_pdf else build_pdf(paper)
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
print(f"reproduce ({a.scale}): studies, figures and tables in {time.perf_counter() - t0:.0f} s"
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
      + ("" if pdf else "; paper/main.pdf not built"))
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
return 0


if __name__ == "__main__":
 Each study.s runtime this time (cells already stored take none): a wall-clock file, kept
raise SystemExit(main())
