"""``make gpu-bench``'s script (``prefixcache.experiments.bench.kernel``) at tiny shapes on the
Triton interpreter: the CSV's schema, every page size and mode measured and checked against the
reference, the memory cap and the wall-clock budget turning shapes into rows that say why, the
shape order, and the kernel figure's macros from a GPU-labelled CSV (and none from the
interpreter's)."""

from __future__ import annotations

import csv
import json
import re
import shutil
import subprocess
import sys
from datetime import datetime
from itertools import product
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from prefixcache.experiments.bench import kernel as bench
from prefixcache.kernels.reference import end_aligned_causal_mask

pytestmark = pytest.mark.kernel

MAIN_TEX = Path(__file__).resolve().parents[1] / "paper" / "main.tex"
GRID = bench.TINY_GRID
# Just over the KV of one sequence of the longest tiny context: batch-2 shapes are over it.
CAP_BYTES = bench.kv_bytes(bench.Shape("decode", 1, 1, max(GRID.decode_contexts), 1), GRID) + 1
Tiny = tuple[int, list[str], list[dict[str, str]], dict[str, Any]]  # rc, header, rows, config


def read_rows(out: Path) -> tuple[list[str], list[dict[str, str]]]:
    with open(out / "results.csv", newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


def run_tiny(out: Path, *extra: str) -> Tiny:
    rc = bench.main(["--tiny", "--out", str(out), "--mem-cap-gib", str(CAP_BYTES / 2**30), *extra])
    header, rows = read_rows(out)
    return rc, header, rows, json.loads((out / "config.json").read_text())


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Tiny:
    return run_tiny(tmp_path_factory.mktemp("kernel_bench"))


def test_tiny_run_exits_zero_and_labels_its_timings_meaningless(tiny: Tiny) -> None:
    rc, header, rows, config = tiny
    assert rc == 0
    assert header == bench.COLUMNS
    assert rows and all(r["device"] == bench.INTERPRETER for r in rows)
    assert config["interpreter"] is True and "meaningless" in config["timings"]
    assert config["correctness_ok"] is True
    for r in rows:
        assert r["torch"] == torch.__version__ and r["triton"] and r["driver"] and r["cuda"]
        assert datetime.fromisoformat(r["date"]).tzinfo is not None


def test_every_page_size_and_mode_is_measured_and_matches_the_reference(tiny: Tiny) -> None:
    _, _, rows, _ = tiny
    kernel_rows = [r for r in rows if r["impl"].startswith("triton") and r["status"] == "ok"]
    measured = {(r["mode"], int(r["page_size"])) for r in kernel_rows}
    assert measured == set(product(bench.MODES, GRID.page_sizes))
    for r in kernel_rows:
        assert r["checked_against"] == "reference" and r["correct"] == "True", r
        assert float(r["max_abs_err"]) <= bench.TOLERANCE[GRID.dtype]
        assert float(r["time_us"]) > 0 and float(r["pct_hbm_peak"]) > 0 and r["num_kv_splits"]
    decode_impls = {r["impl"] for r in kernel_rows if r["mode"] == "decode"}
    if bench.kernel_splits_supported(bench.load_kernel(tiny=True)):
        assert decode_impls == {"triton", "triton-nosplit"}  # the heuristic and one split
    else:
        assert decode_impls == {"triton"}


def test_dense_baselines_run_once_per_shape_on_contiguous_kv_and_agree(tiny: Tiny) -> None:
    _, _, rows, _ = tiny
    measured = {(r["mode"], r["batch"], r["context"]) for r in rows
                if r["impl"] == "triton" and r["status"] == "ok"}
    planned = {(r["mode"], r["batch"], r["context"]) for r in rows if r["impl"] == "triton"}
    for impl in ("sdpa", "flex"):
        dense = [r for r in rows if r["impl"] == impl]
        assert all(r["page_size"] == "" for r in dense)
        assert sorted((r["mode"], r["batch"], r["context"]) for r in dense) == sorted(planned)
        ok = [(r["mode"], r["batch"], r["context"]) for r in dense if r["status"] == "ok"]
        assert sorted(ok) == sorted(measured), impl  # each shape once, whatever its page size
        assert all(r["correct"] == "True" for r in dense if r["status"] == "ok")


def test_shapes_over_the_memory_cap_are_rows_that_say_so(tiny: Tiny) -> None:
    _, _, rows, config = tiny
    shape_rows = [r for r in rows if r["mode"] != "copy"]
    for r in shape_rows:
        shape = bench.Shape(r["mode"], 1, int(r["batch"]), int(r["context"]), int(r["q_len"]))
        kv = bench.kv_bytes(shape, GRID)
        assert (r["status"] == "skipped-memory") == (kv > CAP_BYTES), r
        if r["status"] == "skipped-memory":
            assert r["time_us"] == "" and "cap" in r["note"]
    assert any(r["status"] == "skipped-memory" for r in shape_rows)
    assert config["kv_cap_gib"] == pytest.approx(CAP_BYTES / 2**30)


def test_a_spent_budget_measures_no_shape_but_still_writes_every_row(tmp_path: Path, tiny: Tiny) -> None:
    _, _, full_rows, _ = tiny
    rc, header, rows, config = run_tiny(tmp_path, "--budget-s", "0")
    assert rc == 0 and header == bench.COLUMNS
    shape_rows = [r for r in rows if r["mode"] != "copy"]
    assert {r["status"] for r in shape_rows} == {"skipped-budget", "skipped-memory"}
    planned = {(r["mode"], r["page_size"], r["batch"], r["context"]) for r in full_rows}
    assert {(r["mode"], r["page_size"], r["batch"], r["context"]) for r in rows} == planned
    assert config["kernel_rows_checked"] == 0


def test_a_batch_too_big_for_the_reference_is_checked_on_its_first_sequence(
        monkeypatch: pytest.MonkeyPatch) -> None:
    s = bench.Shape("extend", 16, 3, 40, 5)
    inputs = bench.make_inputs(s, GRID, "cpu", seed=3)
    full, against = bench.reference(inputs, s, GRID)
    assert against == "reference" and full is not None and full.shape[0] == s.batch * s.q_len
    monkeypatch.setattr(bench, "REFERENCE_MAX_TOKENS", s.context)  # one sequence fits, three do not
    first, against = bench.reference(inputs, s, GRID)
    assert against == "reference-seq0" and first is not None
    torch.testing.assert_close(first, full[: s.q_len])
    assert bench.check(full, first, against, GRID.dtype)["correct"]
    wrong = full.clone()
    wrong[0] += 1
    assert not bench.check(wrong, first, against, GRID.dtype)["correct"]
    monkeypatch.setattr(bench, "REFERENCE_MAX_SCORES", 1)
    assert bench.reference(inputs, s, GRID) == (None, "")


def test_sdpa_without_a_fused_gqa_kernel_runs_on_repeated_kv(monkeypatch: pytest.MonkeyPatch) -> None:
    s = bench.Shape("extend", 16, 2, 40, 8)
    inputs = bench.make_inputs(s, GRID, "cpu", seed=4)
    expected, _ = bench.reference(inputs, s, GRID)
    k, v = bench.dense_kv(inputs[1], inputs[2], inputs[3], s.context)
    real = bench.sdpa_impl

    def no_gqa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, shape: bench.Shape) -> bench.Impl:
        if k.shape[1] != q.shape[1]:
            raise RuntimeError("No available kernel. Aborting execution.")
        return real(q, k, v, shape)

    monkeypatch.setattr(bench, "sdpa_impl", no_gqa)
    run = SimpleNamespace(device="cpu", grid=GRID, mem_cap_bytes=1 << 30, flex=None,
                          measure=bench.make_measure(True, 0, 0, 1))
    out, seconds, note = bench.run_baseline(run, "sdpa", inputs[0], k, v, s)  # type: ignore[arg-type]
    assert "repeated" in note and "No available kernel" in note and seconds > 0
    torch.testing.assert_close(out, expected)
    run.mem_cap_bytes = bench.kv_bytes(s, GRID)  # four copies would not fit
    with pytest.raises(RuntimeError, match="No available kernel"):
        bench.run_baseline(run, "sdpa", inputs[0], k, v, s)  # type: ignore[arg-type]


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_budget_lets_a_step_start_only_if_its_last_cost_still_fits() -> None:
    clock = FakeClock()
    budget = bench.Budget(10.0, clock)
    assert budget.fits("triton/decode")  # nothing known yet: the first step runs
    clock.now = 4.0
    budget.record("triton/decode", 4.0)
    assert budget.fits("triton/decode")  # 4 + 4 <= 10
    assert budget.fits("sdpa/decode")  # another key: its own (unknown) cost
    clock.now = 6.5
    assert not budget.fits("triton/decode")  # 6.5 + 4 > 10
    budget.record("flex/decode", 2.0)
    assert not budget.fits("flex/extend", cap_s=1.5, group="flex")  # flex's own cap is spent
    assert budget.fits("flex/extend", cap_s=3.0, group="flex")
    with pytest.raises(ValueError, match="budget"):
        bench.Budget(-1.0)


def test_budget_guesses_a_first_compile_so_none_starts_just_before_the_limit() -> None:
    clock = FakeClock()
    budget = bench.Budget(10.0, clock, first_guess_s={"flex": 8.0})
    clock.now = 3.0
    assert budget.fits("triton/decode") and not budget.fits("flex/decode")  # 3 + 8 > 10
    budget.record("flex/decode", 1.0)  # measured: cheaper than guessed
    assert budget.fits("flex/decode") and not budget.fits("flex/extend")


def test_plan_runs_long_context_decode_at_page_1_and_16_first() -> None:
    shapes = bench.plan(bench.GPU_GRID)
    long_ctx = max(bench.GPU_GRID.decode_contexts) // 4

    def important(s: bench.Shape) -> bool:
        return s.mode == "decode" and s.page_size in (1, 16) and s.context >= long_ctx and s.batch <= 64

    flags = [important(s) for s in shapes]
    first_other = flags.index(False)
    assert any(flags) and not any(flags[first_other:])
    assert shapes[0].context == max(bench.GPU_GRID.decode_contexts)
    assert len(set(shapes)) == len(shapes)
    assert {s.page_size for s in shapes} == {1, 16, 64} and {s.mode for s in shapes} == set(bench.MODES)
    assert max(s.batch for s in shapes) == 256 and max(s.context for s in shapes) == 128 * 1024


def test_the_default_memory_cap_skips_the_largest_shapes_on_an_h200() -> None:
    cap = 0.4 * 141e9  # main()'s rule on a 141 GB device
    too_big = [s for s in bench.plan(bench.GPU_GRID) if bench.kv_bytes(s, bench.GPU_GRID) > cap]
    assert bench.Shape("decode", 1, 256, 128 * 1024, 1) in too_big
    assert all(s.batch * s.context > 64 * 128 * 1024 for s in too_big)


@given(batch=st.integers(1, 3), context=st.integers(1, 40), q_len=st.integers(1, 40))
def test_work_counts_the_keys_the_end_aligned_mask_lets_each_query_see(batch: int, context: int,
                                                                       q_len: int) -> None:
    q_len = min(q_len, context)
    s = bench.Shape("extend", 16, batch, context, q_len)
    nbytes, flops = bench.work(s, GRID)
    visible = int(end_aligned_causal_mask(q_len, context).sum())
    assert flops == 4 * batch * GRID.q_heads * GRID.head_dim * visible
    elem = torch.finfo(GRID.dtype).bits // 8
    assert nbytes == bench.kv_bytes(s, GRID) + 2 * batch * q_len * GRID.q_heads * GRID.head_dim * elem


def test_heuristic_splits_asks_the_kernel_with_the_arguments_it_names() -> None:
    s = bench.Shape("decode", 16, 3, 4096, 1)

    def choose(batch: int, max_seq_len: int, num_sms: int) -> int:
        return batch * 1000 + max_seq_len + num_sms

    stub = SimpleNamespace(choose_num_kv_splits=choose)
    assert bench.heuristic_splits(stub, s, GRID, "cpu") == 3000 + 4096 + 1

    def unknown(batch: int, mystery: int) -> int:
        return 1

    assert bench.heuristic_splits(SimpleNamespace(choose_num_kv_splits=unknown), s, GRID, "cpu") is None
    assert bench.heuristic_splits(SimpleNamespace(), s, GRID, "cpu") is None
    kernel = bench.load_kernel(tiny=True)
    if hasattr(kernel, "choose_num_kv_splits"):  # the real one: what the CSV records for decode
        assert bench.heuristic_splits(kernel, s, GRID, "cpu") == kernel.choose_num_kv_splits(
            batch=3, num_kv_heads=GRID.kv_heads, max_q_len=1, max_seq_len=4096, num_sms=1)


def test_without_a_gpu_the_real_run_refuses_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench.main(["--out", str(tmp_path)]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "results.csv").exists()
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        bench.load_kernel(tiny=True)


@pytest.mark.skipif(shutil.which("make") is None or torch.cuda.is_available(), reason="needs make, no GPU")
def test_make_gpu_bench_without_a_gpu_fails_with_one_clear_line(tmp_path: Path) -> None:
    repo = MAIN_TEX.parents[1]
    done = subprocess.run(["make", "-s", "-C", str(repo), "gpu-bench", f"GPU_PY={sys.executable}",
                           f"GPU_BENCH_ARGS=--out {tmp_path}"], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    message = [line for line in done.stderr.splitlines() if line.startswith("make gpu-bench:")]
    assert len(message) == 1 and "no CUDA device" in message[0], done.stderr
    assert not any(tmp_path.iterdir())  # nothing ran, nothing written


# ------------------------------------------------------------------------------ the figure
def macros(paper: Path) -> dict[str, str]:
    text = (paper / "generated" / "kernel.tex").read_text()
    return dict(re.findall(r"\\newcommand\{\\([A-Za-z]+)\}\{(.*)\}$", text, flags=re.M))


def kernel_paragraph() -> tuple[str, str]:
    """The kernel paragraph's measured and unmeasured branches in main.tex."""
    tex = MAIN_TEX.read_text()
    start = tex.index(r"\ifx\kernelMeasured\pcYes")
    body = tex[start:tex.index(r"\fi", start)]
    measured, unmeasured = body.split(r"\else")
    return measured, unmeasured


def used_macros(tex: str) -> set[str]:
    return set(re.findall(r"\\(kernel[A-Za-z]+)", tex)) - {"kernelMeasured"}


def gpu_csv(results: Path) -> None:
    """A GPU-labelled results.csv whose percentages follow a known rule: rising with batch and
    context, page 16 above page 1 above page 64, dense SDPA above all (but for one wrong row), no
    FlexAttention."""
    out = results / "kernel_bench"
    out.mkdir(parents=True)
    rows = [{"device": "NVIDIA H200", "mode": "copy", "impl": "torch-copy", "status": "ok",
             "tb_per_s": 4.3, "pct_hbm_peak": 4.3 / 4.8 * 100}]
    rank = {64: 0, 1: 1, 16: 2}
    for page, batch, context in product((1, 16, 64), (1, 4, 64), (4096, 131072)):
        pct = 20 + 10 * rank[page] + batch / 4 + context / 2**16
        for impl, p in (("triton", pct), ("triton-nosplit", pct / 2)):
            rows.append({"mode": "decode", "impl": impl, "page_size": page, "batch": batch,
                         "context": context, "q_len": 1, "pct_hbm_peak": p, "tb_per_s": p / 100 * 4.8})
        rows.append({"mode": "extend", "impl": "triton", "page_size": page, "batch": batch,
                     "context": context, "q_len": 512, "tflop_per_s": 300 + 10 * rank[page] + batch,
                     "pct_hbm_peak": 1.0, "tb_per_s": 0.048})
    for batch, context in product((1, 4, 64), (4096, 131072)):
        rows.append({"mode": "decode", "impl": "sdpa", "batch": batch, "context": context, "q_len": 1,
                     "pct_hbm_peak": 90 - batch / 64, "tb_per_s": (90 - batch / 64) / 100 * 4.8})
        rows.append({"mode": "extend", "impl": "sdpa", "batch": batch, "context": context, "q_len": 512,
                     "tflop_per_s": 600 + batch, "pct_hbm_peak": 1.0, "tb_per_s": 0.048})
        rows.append({"mode": "decode", "impl": "flex", "batch": batch, "context": context, "q_len": 1,
                     "status": "failed", "note": "BackendCompilerFailed: no"})
    rows.append({"mode": "decode", "impl": "sdpa", "batch": 256, "context": 131072, "q_len": 1,
                 "pct_hbm_peak": 99.0, "tb_per_s": 4.75, "correct": False})  # a wrong output: ignored
    with open(out / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, bench.COLUMNS, restval="")
        writer.writeheader()
        for r in rows:
            writer.writerow({"device": "NVIDIA H200", "status": "ok", **r})


def test_kernel_figure_from_a_gpu_csv_quotes_long_context_decode_and_the_baseline(tmp_path: Path) -> None:
    from prefixcache.experiments.figures import fig_kernel

    results, paper = tmp_path / "results", tmp_path / "paper"
    gpu_csv(results)
    fig_kernel.make(results, paper)
    m = macros(paper)
    assert m["kernelMeasured"] == "yes" and m["kernelDevice"] == "NVIDIA H200"
    assert m["kernelLongCtx"] == "128k"
    # At 128k the best batch is the largest; page 1's rule: 20 + 10 + 64/4 + 2 = 48.
    assert m["kernelDecodeBatchOneBest"] == m["kernelDecodeBatchSixteenBest"] == "64"
    assert m["kernelDecodePctOneBest"] == "48" and m["kernelDecodePctSixteenBest"] == "58"
    assert m["kernelDecodePctOneBatchOne"] == f"{20 + 10 + 1 / 4 + 2:.0f}"
    assert "short of the goal of 80" in m["kernelDecodeGoal"]
    assert "page 1 and page 16" in m["kernelDecodeGoal"]
    assert m["kernelSdpaDecodePct"] == f"{90 - 1 / 64:.0f}" and m["kernelSdpaDecodeBatch"] == "1"
    assert "did not run" in m["kernelFlexSentence"]
    assert f"{(20 + 10 + 1 / 4 + 2) / 2:.0f}" in m["kernelSplitSentence"]
    assert m["kernelTflopsSixteen"] == "384" and m["kernelSdpaTflops"] == "664"  # 300 + 20 + 64, 600 + 64
    assert m["kernelExtendLen"] == "512"
    assert m["kernelPeakTbps"] == "4.8" and m["kernelCopyPct"] == f"{4.3 / 4.8 * 100:.0f}"
    assert (paper / "figures" / "kernel.pdf").stat().st_size > 0
    measured, _ = kernel_paragraph()
    assert used_macros(measured) <= set(m), sorted(used_macros(measured) - set(m))


@pytest.mark.parametrize("source", ["absent", "interpreter"])
def test_kernel_figure_without_a_gpu_run_claims_no_numbers(tmp_path: Path, tiny: Tiny, source: str) -> None:
    from prefixcache.experiments.figures import fig_kernel

    results, paper = tmp_path / "results", tmp_path / "paper"
    if source == "interpreter":  # the tiny run's own CSV
        (results / "kernel_bench").mkdir(parents=True)
        _, header, rows, _ = tiny
        with open(results / "kernel_bench" / "results.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, header)
            writer.writeheader()
            writer.writerows(rows)
    fig_kernel.make(results, paper)
    m = macros(paper)
    assert m["kernelMeasured"] == "no"
    assert "not measured on a GPU" in m["kernelMissing"] and "make gpu-bench" in m["kernelMissing"]
    assert ("interpreter" in m["kernelMissing"]) == (source == "interpreter")
    assert not re.search(r"\d", m["kernelMissing"])  # no number, measured or not
    _, unmeasured = kernel_paragraph()
    assert used_macros(unmeasured) <= set(m)
    assert (paper / "figures" / "kernel.pdf").exists()
