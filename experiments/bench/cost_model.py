"""Measure the engine's cost-model constants (``make calibrate``).

Times model-mode engine steps (``Model.step`` over the paged pool, as the engine calls it):
prefill chunks of several token counts, with an empty and with a cached context; decode
batches of several sizes; and a few mixed steps (a prefill chunk beside a decode batch) that
check the model is additive. Every shape is timed ``--repeats`` times, shapes interleaved
round by round so that load from other processes hits them alike, and the median is kept.
``numpy.linalg.lstsq`` fits ``seconds = step_overhead_s + prefill_token_s * prefill tokens +
decode_token_s * decode tokens`` (a constant that comes out negative is pinned at 0 and the
rest refitted); R^2 and the largest relative residual say how well a line fits.

Writes the raw points (``results/bench/cost_model.csv``) and the constants file the engine
reads (``prefixcache/cost_model_measured.json``): the constants, a ``label`` saying what was
timed, the machine, torch version, date, model config and fit quality. Wall-clock numbers are
not reproducible byte for byte, so only ``make calibrate`` rewrites them (never ``make
reproduce``); every engine study's clock moves when they change.

The model timed. On CPU (``reference`` attention, fp32): 4 layers, dim 256, 4 query heads of 64,
2 KV heads, SwiGLU width 688, Llama-2's 32k vocabulary. At the default tiny test model (dim
64, 2 layers) a step is almost all Python and per-op overhead plus the 32k-vocabulary output
layer, so the per-token constants would drown in noise; at dim 256 x 4 layers a 512-token
prefill costs about ten one-token steps on a 2-core VM, and the whole calibration still runs
in about a minute. Torch runs on ``--threads`` (default 1) threads: a 2-thread matmul on a
shared 2-core machine stalls whenever another process holds a core, which would turn the
fit into noise. On a GPU (``triton`` attention, bf16) the model is TinyLlama-1.1B's shape, big
enough that per-token work is the GPU's and not the launch overhead's (not yet run on one).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import statistics
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from prefixcache.experiments.bench.ops import write_rows_csv

from prefixcache import CostModel
from prefixcache.cost_model import CONSTANTS, MEASURED_PATH, read_measured
from prefixcache.model import AttentionImpl, Model, ModelConfig, SeqChunk

# Median wall / CPU time of a 1-thread step above which the machine was busy (the warning).
BUSY_WALL_OVER_CPU = 1.15
PAGE_SIZE = 16  # the hashchain backend's page: the engine's most common page table shape
REPO_ROOT = Path(__file__).resolve().parents[2]
POINTS_PATH = REPO_ROOT / "results" / "bench" / "cost_model.csv"


@dataclass(frozen=True)
class Plan:
    """What to time: the model and the step shapes."""

    model: ModelConfig
    prefill_tokens: tuple[int, ...]  # chunk lengths of one prefilling sequence
    prefill_contexts: tuple[int, ...]  # tokens already cached in front of the chunk
    decode_batches: tuple[int, ...]  # sequences decoding one token each
    decode_context: int  # tokens each decoding sequence already holds
    mixed: tuple[tuple[int, int], ...]  # (prefill chunk, decode batch) in one step
    repeats: int


PLANS = {
    "cpu": Plan(ModelConfig(n_layers=4, dim=256, n_heads=4, n_kv_heads=2, intermediate_size=688),
                prefill_tokens=(16, 64, 128, 256, 512), prefill_contexts=(0, 512),
                decode_batches=(1, 4, 16, 32, 64), decode_context=256,
                mixed=((128, 16), (256, 32)), repeats=15),
    "cuda": Plan(ModelConfig(n_layers=22, dim=2048, n_heads=32, n_kv_heads=4, intermediate_size=5632),
                 prefill_tokens=(128, 512, 1024, 2048, 4096), prefill_contexts=(0, 2048),
                 decode_batches=(1, 16, 64, 128, 256), decode_context=1024,
                 mixed=((1024, 64), (2048, 128)), repeats=10),
    # --quick: seconds, for the test that the script runs; its numbers mean nothing.
    "quick": Plan(ModelConfig(vocab_size=512, n_layers=1, dim=32, n_heads=2, n_kv_heads=1,
                              intermediate_size=64),
                  prefill_tokens=(4, 16), prefill_contexts=(0, 16), decode_batches=(1, 4),
                  decode_context=8, mixed=((8, 2),), repeats=2),
}


class Shape(NamedTuple):
    """One step to time: a prefill chunk of ``prefill`` tokens after ``context`` cached ones
    (0: none), beside ``decode`` sequences that each hold ``decode_context`` tokens."""

    kind: str  # prefill | decode | mixed
    prefill: int
    context: int
    decode: int
    decode_context: int


class Fit(NamedTuple):
    constants: dict[str, float]
    predicted: np.ndarray  # [points] seconds
    r2: float
    max_rel_residual: float
    pinned_at_zero: list[str]  # constants the unconstrained fit made negative


def shapes_of(plan: Plan) -> list[Shape]:
    out = [Shape("prefill", n, ctx, 0, 0) for ctx in plan.prefill_contexts for n in plan.prefill_tokens]
    out += [Shape("decode", 0, 0, b, plan.decode_context) for b in plan.decode_batches]
    out += [Shape("mixed", n, 0, b, plan.decode_context) for n, b in plan.mixed]
    return out


def chunks_of(shape: Shape, vocab_size: int, rng: random.Random) -> list[SeqChunk]:
    """The step's SeqChunks, each sequence on pages of its own (page 0 is never handed out)."""
    next_page = 1
    chunks = []

    def add(new_tokens: int, start: int) -> None:
        nonlocal next_page
        pages = -(-(start + new_tokens) // PAGE_SIZE)
        ids = [rng.randrange(vocab_size) for _ in range(new_tokens)]
        chunks.append(SeqChunk(ids, start, list(range(next_page, next_page + pages))))
        next_page += pages

    if shape.prefill:
        add(shape.prefill, shape.context)
    for _ in range(shape.decode):
        add(1, shape.decode_context)
    return chunks


def pages_needed(shapes: list[Shape]) -> int:
    per_shape = (
        -(-(s.prefill + s.context) // PAGE_SIZE) * bool(s.prefill)
        + s.decode * -(-(s.decode_context + 1) // PAGE_SIZE)
        for s in shapes
    )
    return 1 + max(per_shape)  # + page 0


def time_shapes(
    model: Model, batches: list[list[SeqChunk]], repeats: int
) -> tuple[list[list[float]], list[list[float]]]:
    """(wall seconds, process CPU seconds) of ``model.step`` per batch and repeat, after one
    warm-up step each. Rounds interleave the batches (as bench/hashing does) so that load bursts
    hit every shape alike. On one CPU thread, wall well above CPU time means the process waited
    for a core: the machine was busy."""
    cuda = model.device.type == "cuda"

    def once(chunks: list[SeqChunk]) -> tuple[float, float]:
        if cuda:
            torch.cuda.synchronize()
        t0, c0 = time.perf_counter(), time.process_time()
        model.step(chunks)
        if cuda:
            torch.cuda.synchronize()  # the step's kernels, not just their launch
        return time.perf_counter() - t0, time.process_time() - c0

    for chunks in batches:
        once(chunks)
    wall: list[list[float]] = [[] for _ in batches]
    cpu: list[list[float]] = [[] for _ in batches]
    for _ in range(repeats):
        for i, chunks in enumerate(batches):
            w, c = once(chunks)
            wall[i].append(w)
            cpu[i].append(c)
    return wall, cpu


def fit_linear(prefill: np.ndarray, decode: np.ndarray, seconds: np.ndarray) -> Fit:
    """Least squares of ``seconds`` on [1, prefill tokens, decode tokens]. A coefficient that
    comes out negative (noise on a near-zero cost) is pinned at 0 and the others refitted: a
    clock must never run backwards."""
    columns = np.stack([np.ones_like(prefill, dtype=float), prefill.astype(float), decode.astype(float)], 1)
    free = list(range(len(CONSTANTS)))
    coef = np.zeros(len(CONSTANTS))
    while free:
        sol, *_ = np.linalg.lstsq(columns[:, free], seconds, rcond=None)
        if (sol >= 0).all():
            coef[free] = sol
            break
        free.pop(int(np.argmin(sol)))  # pin the most negative, refit the rest
    predicted = columns @ coef
    ss_res = float(((seconds - predicted) ** 2).sum())
    ss_tot = float(((seconds - seconds.mean()) ** 2).sum())
    return Fit(
        constants={name: float(c) for name, c in zip(CONSTANTS, coef, strict=True)},
        predicted=predicted,
        r2=1.0 - ss_res / ss_tot if ss_tot > 0 else float("nan"),
        max_rel_residual=float(np.max(np.abs(seconds - predicted) / seconds)),
        pinned_at_zero=[CONSTANTS[i] for i in range(len(CONSTANTS)) if i not in free],
    )


def machine(device: torch.device, threads: int) -> dict[str, Any]:
    """What ran the timing. ``virtual``: the CPU reports a hypervisor (Linux cpuinfo flag)."""
    cpuinfo = Path("/proc/cpuinfo")
    text = cpuinfo.read_text() if cpuinfo.exists() else ""
    cpu_name = next((line.split(":", 1)[1].strip() for line in text.splitlines()
                     if line.startswith("model name")), platform.processor() or "unknown CPU")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name
    return dict(platform=platform.platform(), cpu=cpu_name, cpu_count=os.cpu_count(),
                virtual=" hypervisor" in text, device=device.type, device_name=name,
                torch_threads=threads, torch=torch.__version__, python=platform.python_version())


def label_of(device: torch.device, plan: Plan, attention: str, host: dict[str, Any]) -> str:
    c = plan.model
    what = f"tiny Llama {c.n_layers}x{c.dim}" if device.type == "cpu" else f"Llama {c.n_layers}x{c.dim}"
    if device.type == "cuda":
        return f"model-mode GPU timing ({what}, {attention} attention), {host['device_name']}"
    threads = f"{host['torch_threads']} thread" + ("s" if host["torch_threads"] > 1 else "")
    box = f"{host['cpu_count']}-core {'VM' if host['virtual'] else 'machine'}"
    return f"model-mode CPU timing ({what}, {attention} attention, {threads}), {box}"


def calibrate(
    plan: Plan, device: torch.device, threads: int, seed: int = 0
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Time every shape of ``plan``, fit, and return (constants record, CSV rows)."""
    attention: AttentionImpl = "triton" if device.type == "cuda" else "reference"
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shapes = shapes_of(plan)
    model = Model(plan.model, pages_needed(shapes), PAGE_SIZE, dtype=dtype, device=device, seed=seed,
                  attention_impl=attention)
    rng = random.Random(seed)
    batches = [chunks_of(s, plan.model.vocab_size, rng) for s in shapes]
    threads_before = torch.get_num_threads()
    torch.set_num_threads(threads)  # restored after: a caller's (a test's) torch is left as it was
    try:
        t0 = time.perf_counter()
        times, cpu_times = time_shapes(model, batches, plan.repeats)
        wall = time.perf_counter() - t0
    finally:
        torch.set_num_threads(threads_before)
    medians = np.array([statistics.median(t) for t in times])
    cpu_medians = np.array([statistics.median(t) for t in cpu_times])
    fit = fit_linear(np.array([s.prefill for s in shapes]), np.array([s.decode for s in shapes]), medians)
    rows = [
        dict(kind=s.kind, prefill_tokens=s.prefill, context_tokens=s.context, decode_tokens=s.decode,
             decode_context_tokens=s.decode_context, repeats=len(t), median_s=m, min_s=min(t), max_s=max(t),
             cpu_median_s=c, predicted_s=float(p), rel_residual=float((m - p) / m))
        for s, t, m, c, p in zip(shapes, times, medians, cpu_medians, fit.predicted, strict=True)
    ]
    host = machine(device, threads)
    record = {
        "label": label_of(device, plan, attention, host),
        "constants": fit.constants,
        "fit": dict(method="numpy.linalg.lstsq on the per-shape medians", points=len(shapes),
                    repeats=plan.repeats, r2=fit.r2, max_rel_residual=fit.max_rel_residual,
                    pinned_at_zero=fit.pinned_at_zero, timing_wall_s=wall,
                    wall_over_cpu=float(np.median(medians / np.maximum(cpu_medians, 1e-9)))),
        "machine": host,
        "model": dict(asdict(plan.model), attention_impl=attention, dtype=str(dtype).removeprefix("torch."),
                      page_size=PAGE_SIZE),
        "shapes": dict(prefill_tokens=plan.prefill_tokens, prefill_contexts=plan.prefill_contexts,
                       decode_batches=plan.decode_batches, decode_context=plan.decode_context,
                       mixed=plan.mixed),
        "date": datetime.date.today().isoformat(),
        "command": "make calibrate (python -m prefixcache.experiments.bench.cost_model)",
    }
    return record, rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                    help="auto: cuda if one is present, else cpu")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (see the module doc)")
    ap.add_argument("--repeats", type=int, help="timings per shape (default: the plan's)")
    ap.add_argument("--quick", action="store_true", help="tiny model and shapes: checks the script runs")
    ap.add_argument("--constants", type=Path, default=MEASURED_PATH, help="constants file to write")
    ap.add_argument("--points", type=Path, default=POINTS_PATH, help="raw points CSV to write")
    args = ap.parse_args(argv)
    if args.threads < 1 or (args.repeats is not None and args.repeats < 1):
        ap.error("--threads and --repeats must be >= 1")
    name = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    plan = PLANS["quick" if args.quick else device.type]
    if args.repeats is not None:
        plan = replace(plan, repeats=args.repeats)
    record, rows = calibrate(plan, device, args.threads)
    if args.quick:
        record["label"] = "QUICK CHECK, not a calibration: " + record["label"]
    points = args.points.resolve()
    record["points_csv"] = str(points.relative_to(REPO_ROOT) if points.is_relative_to(REPO_ROOT) else points)
    write_rows_csv(args.points, rows)
    args.constants.parent.mkdir(parents=True, exist_ok=True)
    args.constants.write_text(json.dumps(record, indent=2) + "\n")
    read_measured(args.constants)  # what the engine will read must load
    cost, fit = CostModel.measured(args.constants), record["fit"]
    pinned = f"; pinned at 0: {', '.join(fit['pinned_at_zero'])}" if fit["pinned_at_zero"] else ""
    if device.type == "cpu" and args.threads == 1 and fit["wall_over_cpu"] > BUSY_WALL_OVER_CPU:
        print(f"WARNING: wall time is {fit['wall_over_cpu']:.2f}x CPU time: the machine was busy, "
              "so these constants are inflated; rerun `make calibrate` on a quiet machine")
    print(f"{record['label']}: step {cost.step_overhead_s * 1e3:.3f} ms + prefill "
          f"{cost.prefill_token_s * 1e6:.2f} us/token + decode {cost.decode_token_s * 1e6:.2f} us/token; "
          f"R^2 {fit['r2']:.4f}, max |rel residual| {fit['max_rel_residual']:.1%} over "
          f"{fit['points']} shapes x {fit['repeats']} in {fit['timing_wall_s']:.0f} s{pinned}; "
          f"wrote {args.constants}, {args.points}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
