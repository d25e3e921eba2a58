"""The whole figure pipeline end to end at the tiny scale: every study runs, every figure and
generated snippet that paper/main.tex includes is produced, and a second run reuses the stored
cells instead of recomputing them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytest.importorskip("pandas")
pytest.importorskip("seaborn")

from prefixcache.experiments.figures import reproduce  # noqa: E402
from prefixcache.experiments.figures.common import cell_name  # noqa: E402
from prefixcache.experiments.inputs.traces import data_dir  # noqa: E402

MAIN_TEX = Path(__file__).resolve().parents[1] / "paper" / "main.tex"


def included(tex: str) -> tuple[list[str], list[str]]:
    """(figure paths, input paths) that main.tex includes, comments stripped."""
    body = "\n".join(line.split("%")[0] for line in tex.splitlines())
    figures = re.findall(r"\\includegraphics(?:\[[^\]]*\])?\{([^}]+)\}", body)
    inputs = re.findall(r"\\input\{([^}]+)\}", body)
    return figures, inputs


def test_main_tex_includes_generated_files_only() -> None:
    figures, inputs = included(MAIN_TEX.read_text())
    assert figures and inputs
    assert all(f.startswith("figures/") for f in figures)
    assert all(i.startswith("generated/") for i in inputs)


def test_reproduce_tiny_makes_every_included_figure_and_snippet(tmp_path: Path) -> None:
    try:  # the capacity study replays the real Mooncake traces, read from ../shared/data
        data_dir()
    except FileNotFoundError as e:
        pytest.skip(f"trace data not available: {e}")
    results, paper = tmp_path / "results", tmp_path / "paper"
    argv = ["--scale", "tiny", "--out", str(results), "--paper", str(paper), "--no-pdf",
            "--jobs", "1"]
    assert reproduce.main(argv) == 0
    # Wall-clock benches are committed measurements (make bench): reproduce never runs one.
    assert not (results / "bench").exists()
    # Each study's runtime is recorded beside the results (a wall-clock file git ignores).
    times = json.loads((results / "reproduce_times_tiny.json").read_text())["studies_s"]
    assert set(times) == {study.STUDY for study in reproduce.STUDIES}
    figures, inputs = included(MAIN_TEX.read_text())
    for f in figures:
        path = paper / f
        assert path.exists() and path.stat().st_size > 0, f"figure {f} was not produced"
    for i in inputs:
        path = paper / (i if i.endswith(".tex") else i + ".tex")
        assert path.exists(), f"snippet {i} was not produced"
        text = path.read_text()
        assert "nan" not in re.sub(r"\\[A-Za-z]+", "", text).lower().replace("n/a", ""), f"{i} holds a NaN"

    # Every macro the text uses outside \ifx guards is defined by some snippet.
    defined = set()
    for i in inputs:
        defined |= set(re.findall(r"\\newcommand\{\\([A-Za-z]+)\}", (paper / i).read_text()))
    tex = MAIN_TEX.read_text()
    guarded = re.sub(r"\\ifx.*?\\fi", "", tex, flags=re.S)
    prefixes = "gran|cap|sched|ev|pol|ttft|wt|ops|cost|sc|div|kernel|hyb|dec"
    used = set(re.findall(rf"\\((?:{prefixes})[A-Z][A-Za-z]*)", guarded))
    assert used <= defined, f"undefined macros: {sorted(used - defined)}"
    # Every \ref has its \label in the text or in a snippet (no LaTeX here to say "??").
    labels = set(re.findall(r"\\label\{([^}]+)\}", tex))
    for i in inputs:
        labels |= set(re.findall(r"\\label\{([^}]+)\}", (paper / i).read_text()))
    # (a \ref inside an \ifx guard is typeset only with what defines its label; the PDF build
    # of a real run counts undefined references)
    refs = set(re.findall(r"\\ref\{([^}]+)\}", guarded))
    assert refs <= labels, f"undefined references: {sorted(refs - labels)}"

    # The real traces at their own block structure: both present, offsets within a block.
    traces = json.loads((results / "granularity" / "traces.json").read_text())
    assert {t["source"] for t in traces} == {"mooncake-conversation", "mooncake-synthetic"}
    assert all(0 <= o < t["page_size"] for t in traces for o in t["offsets"])
    assert "mooncake-conversation (first" in (paper / "generated" / "granularity_workloads.tex").read_text()

    # Cells are folders named from their config, each holding that config.
    cell = next((results / "granularity").glob("*/config.json"))
    assert cell_name(json.loads(cell.read_text())) == cell.parent.name

    # A second run reuses every stored cell (summaries untouched).
    stamps = {p: p.stat().st_mtime_ns for p in results.glob("*/*/summary.json")}
    assert reproduce.main(argv) == 0
    assert stamps and all(p.stat().st_mtime_ns == t for p, t in stamps.items())


def test_published_table_never_prints_minus_zero() -> None:
    from prefixcache.experiments.figures.tab_published import signed

    assert [signed(x) for x in (-0.04, 0.04, 0.0, 2.34, -1.06)] == ["0.0", "0.0", "0.0", "+2.3", "-1.1"]


def test_a_stored_cell_of_another_summary_version_is_run_again(tmp_path: Path) -> None:
    """A cell stored before a summary column existed must not be reused (its figures would
    quietly differ from a fresh clone's)."""
    from prefixcache.experiments.figures.common import SUMMARY_VERSION, cell_config, run_cell

    config = cell_config("t", source="multi-turn-chat", backend="radix", page_size=1,
                         capacity_tokens=8192, params=dict(conversations=2, turns=2))
    first = run_cell(config, tmp_path)
    assert first["summary_version"] == SUMMARY_VERSION and "wait_p99_s" in first
    path = next(tmp_path.glob("t/*/summary.json"))
    dropped = ("summary_version", "wait_p99_s")
    old = {k: v for k, v in json.loads(path.read_text()).items() if k not in dropped}
    path.write_text(json.dumps(old))
    rerun = run_cell(config, tmp_path)
    assert rerun["summary_version"] == SUMMARY_VERSION and "wait_p99_s" in rerun
    again = json.loads(path.read_text())
    assert again["summary_version"] == SUMMARY_VERSION and "wait_p99_s" in again
    assert run_cell(config, tmp_path)["wall_s"] == again["wall_s"]  # current: reused as stored


def test_the_latex_log_check_counts_what_a_clean_build_must_not_have() -> None:
    """``make reproduce`` builds paper/main.pdf where LaTeX is installed and reports any
    undefined reference or citation and any overfull box from main.log."""
    from prefixcache.experiments.figures.reproduce import latex_log_problems

    clean = "Underfull \\hbox (badness 3713) in paragraph at lines 8--8\nOutput written on main.pdf\n"
    assert latex_log_problems(clean) == []
    bad = ("Overfull \\hbox (1.5pt too wide) in paragraph at lines 3--4\n"
           "Overfull \\vbox (2.0pt too high) has occurred while \\output is active\n"
           "LaTeX Warning: Reference `fig:x' on page 3 undefined on input line 5.\n"
           "LaTeX Warning: Citation `abc' on page 2 undefined on input line 9.\n")
    assert latex_log_problems(bad) == ["1 undefined references", "1 undefined citations", "2 overfull boxes"]
