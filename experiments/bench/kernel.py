"""How close the paged-attention kernel gets to the GPU's roofline (``make gpu-bench``; never in CI).

* decode (one new token per sequence) is bound by HBM: the achieved bandwidth of reading K and V,
  as a percentage of the device's peak (H200: 4.8 TB/s);
* extend (512 new tokens over a cached prefix) and prefill (no prefix) are bound by
  compute: the achieved TFLOP/s of the two matmuls (causal, end-aligned) against dense bf16 peak.

Page sizes 1 (SGLang's token slots), 16 (vLLM's blocks) and 64, pages shuffled through the pool as
a long-running cache leaves them, batch 1..256 and context 1k..128k, at a Llama-3-8B-like shape
(32 query heads, 8 KV heads, head_dim 128, bf16). Decode runs with the kernel's split-KV heuristic
and, where the kernel has ``num_kv_splits``, with 1 split. The baselines see the same KV stored
contiguously, on the same device: ``scaled_dot_product_attention`` (the dense upper bound) and
compiled FlexAttention (a failure is a row, not a crash). A shape whose KV exceeds a memory cap is
skipped, and no measurement starts once ``--budget-s`` would be passed; both leave rows saying so.
The most important shapes (long-context decode at page 1 and 16, batch 1..64) run first.

Writes ``results/kernel_bench/results.csv`` after every shape (one tidy row per measurement,
device, driver and versions on each) and ``config.json``, and prints one summary line.

``--tiny`` runs the same code on the CPU under the Triton interpreter at tiny shapes, timed by
``time.perf_counter``: a test of the script whose timings mean nothing (device ``cpu-interpreter``).
"""

from __future__ import annotations

import argparse
import csv
import importlib
import inspect
import json
import math
import os
import platform
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional as F
import triton
from prefixcache.kernels.reference import paged_attention_reference

# Peak dense bf16 FLOP/s and HBM bytes/s by device name (datasheet numbers, no sparsity).
PEAKS = {"H200": (989e12, 4.8e12), "H100": (989e12, 3.35e12), "A100": (312e12, 2.0e12)}
INTERPRETER = "cpu-interpreter"
MODES = ("decode", "extend", "prefill")
# The fp32 reference materialises each sequence's KV repeated per query head, and may materialise
# its scores: past these sizes it checks the first sequence only, and past them for one sequence
# the kernel is checked against dense SDPA (bf16) instead.
REFERENCE_MAX_TOKENS = 1 << 18  # batch * context
REFERENCE_MAX_SCORES = 1 << 30  # batch * q_heads * q_len * context
# Seconds the first step of each impl is guessed to take on a GPU (compiles included).
FIRST_GUESS_S = {"triton": 5.0, "triton-nosplit": 5.0, "sdpa": 2.0, "flex": 30.0}
# Kernel vs reference or SDPA, both accumulating in fp32 (as tests/test_kernel.py).
TOLERANCE = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}
COLUMNS = [
    "device", "driver", "cuda", "torch", "triton", "date", "dtype", "q_heads", "kv_heads", "head_dim",
    "mode", "impl", "page_size", "batch", "context", "q_len", "num_kv_splits", "status",
    "time_us", "bytes", "flops", "tb_per_s", "pct_hbm_peak", "tflop_per_s", "pct_flops_peak",
    "max_abs_err", "checked_against", "correct", "note",
]  # fmt: skip


@dataclass(frozen=True, slots=True)
class Grid:
    """The shapes one run plans; decode, extend and prefill each cross their batches and contexts."""

    page_sizes: tuple[int, ...]
    decode_batches: tuple[int, ...]
    decode_contexts: tuple[int, ...]
    extend_batches: tuple[int, ...]
    extend_contexts: tuple[int, ...]
    extend_len: int
    prefill_batches: tuple[int, ...]
    prefill_contexts: tuple[int, ...]
    q_heads: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype


GPU_GRID = Grid(
    page_sizes=(1, 16, 64),
    decode_batches=(1, 4, 16, 32, 64, 128, 256),
    decode_contexts=(1024, 4096, 16384, 32768, 65536, 131072),
    extend_batches=(1, 4, 16), extend_contexts=(4096, 16384, 65536), extend_len=512,
    prefill_batches=(1, 4), prefill_contexts=(1024, 4096, 16384),
    q_heads=32, kv_heads=8, head_dim=128, dtype=torch.bfloat16,
)  # fmt: skip
# Interpreter: fp32 (its bf16 tl.dot is wrong), contexts that end mid-page for pages 16 and 64.
TINY_GRID = Grid(
    page_sizes=(1, 16, 64),
    decode_batches=(1, 2), decode_contexts=(64, 100),
    extend_batches=(1, 2), extend_contexts=(64, 100), extend_len=16,
    prefill_batches=(1,), prefill_contexts=(64,),
    q_heads=4, kv_heads=2, head_dim=16, dtype=torch.float32,
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Shape:
    mode: str  # decode | extend | prefill
    page_size: int
    batch: int
    context: int  # KV tokens per sequence, the new ones included
    q_len: int  # new tokens per sequence: the last q_len of the context


def plan(grid: Grid) -> list[Shape]:
    """Every shape of the grid, most important first: long-context decode at page 1 and 16 with
    batch <= 64, then extend at page 1 and 16, the rest of decode, page 64, prefill."""
    shapes = [Shape("decode", p, b, c, 1)
              for p in grid.page_sizes for b in grid.decode_batches for c in grid.decode_contexts]
    shapes += [Shape("extend", p, b, c, grid.extend_len)
               for p in grid.page_sizes for b in grid.extend_batches for c in grid.extend_contexts
               if c > grid.extend_len]
    shapes += [Shape("prefill", p, b, c, c)
               for p in grid.page_sizes for b in grid.prefill_batches for c in grid.prefill_contexts]
    long_context = max(grid.decode_contexts) // 4

    def priority(s: Shape) -> tuple[int, int, int, int]:
        main_page = s.page_size in (1, 16)
        if s.mode == "decode":
            tier = (0 if s.context >= long_context and s.batch <= 64 else 2) if main_page else 3
        else:
            tier = (1 if main_page else 4) if s.mode == "extend" else 5
        return tier, -s.context, s.page_size, s.batch

    return sorted(shapes, key=priority)


def work(s: Shape, grid: Grid) -> tuple[int, float]:
    """(bytes that must move, FLOPs that must run) for one call: the roofline denominators."""
    elem = torch.finfo(grid.dtype).bits // 8
    qo_bytes = 2 * s.batch * s.q_len * grid.q_heads * grid.head_dim * elem  # q read, out written
    # Query i sees (context - q_len + i + 1) keys; QK^T and PV are 2 flops per MAC each.
    keys_seen = s.q_len * (s.context - s.q_len) + s.q_len * (s.q_len + 1) / 2
    return kv_bytes(s, grid) + qo_bytes, 4 * s.batch * grid.q_heads * grid.head_dim * keys_seen


def kv_bytes(s: Shape, grid: Grid) -> int:
    """Bytes of K and V for the shape's sequences (each read once by decode)."""
    return 2 * s.batch * s.context * grid.kv_heads * grid.head_dim * (torch.finfo(grid.dtype).bits // 8)


class Budget:
    """Wall-clock guard: a step starts only if the last step of its kind, repeated, still fits.

    Costs are kept per key (``impl/mode``); a key not seen yet is guessed at ``first_guess_s``
    of its impl (compiling FlexAttention takes tens of seconds), else 0. The run can therefore
    pass the limit by what one step costs beyond its estimate.
    """

    def __init__(self, limit_s: float, clock: Callable[[], float] = time.perf_counter,
                 first_guess_s: dict[str, float] | None = None) -> None:
        if limit_s < 0:
            raise ValueError(f"budget must be >= 0 seconds, got {limit_s}")
        self.limit_s = limit_s
        self._clock = clock
        self._start = clock()
        self.first_guess_s = first_guess_s or {}
        self.last_cost: dict[str, float] = {}
        self.spent: dict[str, float] = {}

    def estimate(self, key: str) -> float:
        return self.last_cost.get(key, self.first_guess_s.get(key.split("/")[0], 0.0))

    def elapsed(self) -> float:
        return self._clock() - self._start

    def fits(self, key: str, cap_s: float | None = None, group: str | None = None) -> bool:
        """Whether a step of ``key`` fits the limit (and ``cap_s``, for all keys of ``group``)."""
        estimate = self.estimate(key)
        if cap_s is not None and group is not None:
            group_spent = sum(v for k, v in self.spent.items() if k.startswith(group + "/"))
            if group_spent + estimate > cap_s:
                return False
        return self.elapsed() + estimate <= self.limit_s

    def record(self, key: str, seconds: float) -> None:
        self.last_cost[key] = seconds
        self.spent[key] = self.spent.get(key, 0.0) + seconds


# --------------------------------------------------------------------------------- inputs
def make_inputs(s: Shape, grid: Grid, device: str, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """A batch of ``s.batch`` sequences of ``s.context`` tokens, the last ``s.q_len`` of them new."""
    g = torch.Generator(device=device).manual_seed(seed)
    pages_per_seq = -(-s.context // s.page_size)
    num_pages = s.batch * pages_per_seq + 1  # page 0 reserved, as in the caches
    # Shuffled pages: a cache that has run a while hands out scattered pages, never a range.
    perm = torch.randperm(num_pages - 1, generator=g, device=device) + 1
    page_table = perm.view(s.batch, pages_per_seq).int()  # [B, max_pages]
    cache_shape = (num_pages, s.page_size, grid.kv_heads, grid.head_dim)
    k_cache = torch.randn(cache_shape, generator=g, device=device, dtype=grid.dtype)  # [P, S, Hkv, D]
    v_cache = torch.randn(cache_shape, generator=g, device=device, dtype=grid.dtype)  # [P, S, Hkv, D]
    q = torch.randn(s.batch * s.q_len, grid.q_heads, grid.head_dim, generator=g, device=device,
                    dtype=grid.dtype)  # [T, Hq, D]
    cu_seqlens_q = torch.arange(0, s.batch + 1, device=device, dtype=torch.int32) * s.q_len  # [B + 1]
    seq_lens = torch.full((s.batch,), s.context, device=device, dtype=torch.int32)  # [B]
    return q, k_cache, v_cache, page_table, cu_seqlens_q, seq_lens


def dense_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, page_table: torch.Tensor,
             context: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sequence's K and V, contiguous [B, Hkv, context, D], gathered one sequence at a time
    (the peak is one extra sequence, not a second copy of the batch)."""
    batch = page_table.shape[0]
    _, _, kv_heads, head_dim = k_cache.shape
    out = []
    for cache in (k_cache, v_cache):
        dense = torch.empty(batch, kv_heads, context, head_dim, device=cache.device, dtype=cache.dtype)
        for b in range(batch):
            dense[b] = cache[page_table[b].long()].reshape(-1, kv_heads, head_dim)[:context].transpose(0, 1)
        out.append(dense)
    return out[0], out[1]


# --------------------------------------------------------------------------------- implementations
# Each maker returns (call, unpack): `call` is what is timed, `unpack` turns its result into the
# kernel's packed [T, Hq, D] layout for the correctness check, outside the timing.
Impl = tuple[Callable[[], torch.Tensor], Callable[[torch.Tensor], torch.Tensor]]


def sdpa_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, s: Shape) -> Impl:
    """``scaled_dot_product_attention`` over contiguous KV: q [T, Hq, D], k/v [B, Hkv, S, D]."""
    from torch.nn.attention.bias import causal_lower_right

    _, q_heads, head_dim = q.shape
    kv_heads = k.shape[1]
    if s.q_len == 1:
        # Decode sees every key, so a KV head's G query heads are just G rows of one query:
        # [B, Hkv, G, D] against [B, Hkv, S, D], no mask and no GQA support needed.
        q_grouped = q.view(s.batch, kv_heads, q_heads // kv_heads, head_dim)
        return (lambda: F.scaled_dot_product_attention(q_grouped, k, v),
                lambda o: o.reshape(s.batch, q_heads, head_dim))
    q_heads_first = q.view(s.batch, s.q_len, q_heads, head_dim).transpose(1, 2)  # [B, Hq, L, D]
    mask = causal_lower_right(s.q_len, s.context)  # end-aligned, as the kernel (is_causal is top-left)
    return (lambda: F.scaled_dot_product_attention(q_heads_first, k, v, attn_mask=mask, enable_gqa=True),
            lambda o: o.transpose(1, 2).reshape(s.batch * s.q_len, q_heads, head_dim))


def flex_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, s: Shape, flex: Callable[..., Any]) -> Impl:
    """FlexAttention over the same contiguous KV, with an end-aligned causal block mask."""
    from torch.nn.attention.flex_attention import create_block_mask

    _, q_heads, head_dim = q.shape
    q_heads_first = q.view(s.batch, s.q_len, q_heads, head_dim).transpose(1, 2).contiguous()  # [B, Hq, L, D]
    prefix = s.context - s.q_len

    def end_aligned(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return kv_idx <= q_idx + prefix

    # A mask even for decode: compiled flex without one read past a KV length that is not a
    # multiple of its 128-token block (wrong output on torch 2.13's CPU inductor; paper/LOG.md).
    block_mask = create_block_mask(end_aligned, None, None, s.q_len, s.context, device=q.device)
    return (lambda: flex(q_heads_first, k, v, block_mask=block_mask, enable_gqa=True),
            lambda o: o.transpose(1, 2).reshape(s.batch * s.q_len, q_heads, head_dim))


def kernel_parameters(kernel: ModuleType) -> set[str]:
    """What this version of ``paged_attention`` accepts (split-KV came later than this script)."""
    return set(inspect.signature(kernel.paged_attention).parameters)


def kernel_splits_supported(kernel: ModuleType) -> bool:
    return "num_kv_splits" in kernel_parameters(kernel)


def heuristic_splits(kernel: ModuleType, s: Shape, grid: Grid, device: str) -> int | None:
    """The split count the kernel's heuristic picks, if it exposes ``choose_num_kv_splits`` with
    arguments this script can name; None if not (the CSV then says ``auto``)."""
    choose = getattr(kernel, "choose_num_kv_splits", None)
    if choose is None:
        return None
    sms = torch.cuda.get_device_properties(0).multi_processor_count if device == "cuda" else 1
    known = {"batch": s.batch, "num_kv_heads": grid.kv_heads, "num_q_heads": grid.q_heads,
             "head_dim": grid.head_dim, "max_q_len": s.q_len, "max_seq_len": s.context,
             "page_size": s.page_size, "num_sms": sms}
    try:
        params = inspect.signature(choose).parameters.values()
        kwargs = {p.name: known[p.name] for p in params if p.name in known}
        if any(p.default is p.empty and p.name not in kwargs
               and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
            return None
        return int(choose(**kwargs))
    except (TypeError, ValueError, RuntimeError):
        return None


# --------------------------------------------------------------------------------- environment
def load_kernel(tiny: bool) -> ModuleType:
    """The kernel module. Triton picks the interpreter when it is imported (its own ``@jit``
    helpers, ``tl.max`` among them, are decorated then), so ``--tiny`` cannot switch it on."""
    if tiny and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError("--tiny runs the kernel under the Triton interpreter: set TRITON_INTERPRET=1 "
                         "before Python starts (TRITON_INTERPRET=1 python -m "
                         "prefixcache.experiments.bench.kernel --tiny)")
    return importlib.import_module("prefixcache.kernels.paged_attention")


def driver_version() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True)
        return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown"


def environment(tiny: bool, grid: Grid) -> dict[str, Any]:
    """The columns every row repeats: which machine and software measured it."""
    return {
        "device": INTERPRETER if tiny else torch.cuda.get_device_name(),
        "driver": "none" if tiny else driver_version(),
        "cuda": "none" if tiny else str(torch.version.cuda),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "dtype": str(grid.dtype).removeprefix("torch."),
        "q_heads": grid.q_heads,
        "kv_heads": grid.kv_heads,
        "head_dim": grid.head_dim,
    }


Measure = Callable[[Callable[[], torch.Tensor]], tuple[torch.Tensor, float]]


def make_measure(tiny: bool, warmup_ms: int, rep_ms: int, reps: int) -> Measure:
    """(output, seconds per call): do_bench's median on a GPU after one call that compiles; under
    the interpreter the median of ``reps`` perf_counter-timed calls, the first one's output kept
    (each call takes seconds there, and its time means nothing anyway)."""
    if not tiny:
        import triton.testing

        def do_bench(fn: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, float]:
            out = fn()
            ms = triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median")
            return out, ms * 1e-3

        return do_bench

    def perf_counter_median(fn: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, float]:
        outs, times = [], []
        for _ in range(reps):
            t = time.perf_counter()
            outs.append(fn())
            times.append(time.perf_counter() - t)
        return outs[0], sorted(times)[len(times) // 2]

    return perf_counter_median


# --------------------------------------------------------------------------------- the run
@dataclass(slots=True)
class Run:
    """What the measurement loop needs besides the shape."""

    grid: Grid
    device: str
    env: dict[str, Any]
    peak_flops: float
    peak_bw: float
    mem_cap_bytes: float
    budget: Budget
    flex_budget_s: float
    measure: Measure
    kernel: ModuleType
    flex: Callable[..., Any] | None  # None: --no-flex

    def row(self, s: Shape | None, impl: str, status: str, **fields: Any) -> dict[str, Any]:
        shape = asdict(s) if s is not None else {}
        if impl in ("sdpa", "flex"):
            shape["page_size"] = ""  # contiguous KV: no pages
        return {**self.env, **shape, "impl": impl, "status": status, **fields}

    def timed_row(self, s: Shape, impl: str, seconds: float, nbytes: int, flops: float,
                  **fields: Any) -> dict[str, Any]:
        return self.row(s, impl, "ok", time_us=f"{seconds * 1e6:.4g}", bytes=nbytes, flops=f"{flops:.6g}",
                        tb_per_s=f"{nbytes / seconds / 1e12:.4g}",
                        pct_hbm_peak=f"{100 * nbytes / seconds / self.peak_bw:.4g}",
                        tflop_per_s=f"{flops / seconds / 1e12:.4g}",
                        pct_flops_peak=f"{100 * flops / seconds / self.peak_flops:.4g}", **fields)


def check(out: torch.Tensor, expected: torch.Tensor | None, against: str,
          dtype: torch.dtype) -> dict[str, Any]:
    """The correctness columns of a row: max |out - expected| over the rows ``expected`` covers
    (all, or the first sequence's), against the dtype's tolerance."""
    if expected is None:
        return {"checked_against": ""}
    err = (out[: expected.shape[0]].float() - expected.float()).abs().max().item()
    return {"max_abs_err": f"{err:.3g}", "checked_against": against,
            "correct": bool(math.isfinite(err) and err <= TOLERANCE[dtype])}


def short(e: BaseException) -> str:
    return f"{type(e).__name__}: {' '.join(str(e).split())}"[:300]


def measure_copy(run: Run) -> dict[str, Any]:
    """A device-to-device copy: the bandwidth a kernel can practically reach, as a ceiling row."""
    numel = (1 << 31) if run.device == "cuda" else (1 << 20)  # 2 GiB on a GPU, 1 MiB under test
    src = torch.empty(numel, dtype=torch.uint8, device=run.device)
    dst = torch.empty_like(src)
    _, seconds = run.measure(lambda: dst.copy_(src))
    nbytes = 2 * numel  # read and written
    return run.row(None, "torch-copy", "ok", mode="copy", time_us=f"{seconds * 1e6:.4g}", bytes=nbytes,
                   tb_per_s=f"{nbytes / seconds / 1e12:.4g}",
                   pct_hbm_peak=f"{100 * nbytes / seconds / run.peak_bw:.4g}")


def reference(inputs: tuple[torch.Tensor, ...], s: Shape, grid: Grid) -> tuple[torch.Tensor | None, str]:
    """The fp32 reference's output for the whole batch, or for its first sequence only (the
    first ``q_len`` rows of the packed output) where the batch would not fit; None past that."""
    scores = grid.q_heads * s.q_len * s.context
    if s.batch * s.context <= REFERENCE_MAX_TOKENS and s.batch * scores <= REFERENCE_MAX_SCORES:
        return paged_attention_reference(*inputs), "reference"
    if s.context <= REFERENCE_MAX_TOKENS * 2 and scores <= REFERENCE_MAX_SCORES:
        q, k_cache, v_cache, page_table, cu_seqlens_q, seq_lens = inputs
        first = (q[: s.q_len], k_cache, v_cache, page_table[:1], cu_seqlens_q[:2], seq_lens[:1])
        return paged_attention_reference(*first), "reference-seq0"
    return None, ""


def measure_shape(run: Run, s: Shape, dense_done: set[tuple[str, int, int]]) -> list[dict[str, Any]]:
    """Rows for one shape: the kernel (heuristic splits, and 1 split for decode where the kernel
    can split), then, once per (mode, batch, context), the dense baselines."""
    grid, budget = run.grid, run.budget
    variants: list[tuple[str, dict[str, Any], int | str]] = [("triton", {}, 1)]  # no split-KV: 1 split
    if kernel_splits_supported(run.kernel):
        variants = [("triton", {}, heuristic_splits(run.kernel, s, grid, run.device) or "auto")]
        if s.mode == "decode":
            variants.append(("triton-nosplit", {"num_kv_splits": 1}, 1))
    dense_key = (s.mode, s.batch, s.context)
    baselines = [] if dense_key in dense_done else ["sdpa"] + (["flex"] if run.flex is not None else [])
    impls = [name for name, _, _ in variants] + baselines
    kv = kv_bytes(s, grid)
    if kv > run.mem_cap_bytes or not budget.fits(f"triton/{s.mode}"):
        dense_done.add(dense_key)  # one row per dense shape, as when it is measured
        if kv > run.mem_cap_bytes:
            note = f"KV {kv / 2**30:.3g} GiB > cap {run.mem_cap_bytes / 2**30:.3g} GiB"
            return [run.row(s, impl, "skipped-memory", note=note) for impl in impls]
        note = f"{budget.elapsed():.0f} s elapsed"
        return [run.row(s, impl, "skipped-budget", note=note) for impl in impls]

    t0 = time.perf_counter()
    try:
        inputs = make_inputs(s, grid, run.device)
        expected, against = reference(inputs, s, grid)
    except torch.OutOfMemoryError as e:
        return [run.row(s, impl, "failed", note=short(e)) for impl in impls]
    # The lengths the benchmark knows, so that no launch reads them back (a device sync).
    known_lengths = {"max_seq_len": s.context} if "max_seq_len" in kernel_parameters(run.kernel) else {}
    kernel_rows, outputs = [], []
    nbytes, flops = work(s, grid)
    for name, kwargs, splits in variants:
        key = f"{name}/{s.mode}"
        if name != "triton" and not budget.fits(key):
            kernel_rows.append(run.row(s, name, "skipped-budget", num_kv_splits=splits))
            continue
        call = partial(run.kernel.paged_attention, *inputs, max_q_len=s.q_len, **known_lengths, **kwargs)
        try:
            out, seconds = run.measure(call)
        except Exception as e:  # a kernel that fails is a result: recorded, and the run exits 1
            kernel_rows.append(run.row(s, name, "failed", num_kv_splits=splits, note=short(e), correct=False))
        else:
            outputs.append((name, splits, seconds, out))
        budget.record(key, time.perf_counter() - t0)
        t0 = time.perf_counter()

    baseline_rows, dense_out = measure_baselines(run, s, baselines, inputs, (expected, against),
                                                 nbytes, flops)
    if baselines:
        dense_done.add(dense_key)
    if expected is None and dense_out is not None:
        expected, against = dense_out, "sdpa"
    for name, splits, seconds, out in outputs:
        kernel_rows.append(run.timed_row(s, name, seconds, nbytes, flops, num_kv_splits=splits,
                                         **check(out, expected, against, grid.dtype)))
    return kernel_rows + baseline_rows


def measure_baselines(run: Run, s: Shape, baselines: list[str], inputs: tuple[torch.Tensor, ...],
                      expected: tuple[torch.Tensor | None, str], nbytes: int, flops: float,
                      ) -> tuple[list[dict[str, Any]], torch.Tensor | None]:
    """SDPA and FlexAttention rows for one (mode, batch, context), and SDPA's packed output."""
    budget = run.budget
    wanted = [b for b in baselines
              if budget.fits(f"{b}/{s.mode}", run.flex_budget_s if b == "flex" else None, b)]
    rows = [run.row(s, b, "skipped-budget") for b in baselines if b not in wanted]
    if not wanted:
        return rows, None
    t0 = time.perf_counter()
    try:
        k, v = dense_kv(inputs[1], inputs[2], inputs[3], s.context)  # [B, Hkv, S, D] each
    except torch.OutOfMemoryError as e:
        return rows + [run.row(s, b, "failed", note=short(e)) for b in wanted], None
    dense_out = None
    for name in wanted:
        try:
            out, seconds, note = run_baseline(run, name, inputs[0], k, v, s)
        except Exception as e:  # torch.compile raises its own error types: record the failure, go on
            rows.append(run.row(s, name, "failed", note=short(e)))
        else:
            if name == "sdpa":
                dense_out = out
            rows.append(run.timed_row(s, name, seconds, nbytes, flops, note=note,
                                      **check(out, *expected, run.grid.dtype)))
        budget.record(f"{name}/{s.mode}", time.perf_counter() - t0)
        t0 = time.perf_counter()
    return rows, dense_out


def run_baseline(run: Run, name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 s: Shape) -> tuple[torch.Tensor, float, str]:
    """(packed output, seconds, note) of one dense baseline. Should SDPA have no fused kernel for
    GQA with an end-aligned mask, it runs again on KV repeated per query head, if that fits."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager flex on the interpreter says it is unfused
        if name == "flex":
            assert run.flex is not None  # "flex" is planned only with it
            call, unpack = flex_impl(q, k, v, s, run.flex)
            raw, seconds = run.measure(call)
            return unpack(raw), seconds, ""
        with restricted_sdpa(run.device):
            try:
                call, unpack = sdpa_impl(q, k, v, s)
                raw, seconds = run.measure(call)
                return unpack(raw), seconds, ""
            except RuntimeError as e:
                group = q.shape[1] // k.shape[1]
                if s.q_len == 1 or group * kv_bytes(s, run.grid) > run.mem_cap_bytes:
                    raise
                first_error = short(e)
            call, unpack = sdpa_impl(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), s)
            raw, seconds = run.measure(call)
            return unpack(raw), seconds, f"KV repeated per query head (GQA failed: {first_error})"[:300]


def restricted_sdpa(device: str) -> Any:
    """On a GPU, SDPA may use fused kernels only: its math fallback would materialise the scores
    and repeat KV per query head (a silent 4x memory and a meaningless baseline)."""
    from contextlib import nullcontext

    from torch.nn.attention import SDPBackend, sdpa_kernel

    if device != "cuda":
        return nullcontext()
    fused = [SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]
    return sdpa_kernel(fused)


def compiled_flex(tiny: bool) -> Callable[..., Any]:
    """FlexAttention, compiled on a GPU; eager under the interpreter (compiling it on the CPU
    takes ~40 s and the timings mean nothing there anyway)."""
    from torch.nn.attention.flex_attention import flex_attention

    if tiny:
        return flex_attention
    import torch._dynamo

    for name in ("recompile_limit", "cache_size_limit"):  # a new shape recompiles; never fall back to eager
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 256)
    return torch.compile(flex_attention)


# --------------------------------------------------------------------------------- output
def summary(rows: list[dict[str, Any]]) -> str:
    ok = [r for r in rows if r["status"] == "ok"]

    def best(mode: str, impl: str, col: str, page: int | str) -> str:
        cands = [r for r in ok if r["mode"] == mode and r["impl"] == impl and r["page_size"] == page]
        if not cands:
            return "n/a"
        longest = max(int(r["context"]) for r in cands)
        top = max((r for r in cands if int(r["context"]) == longest), key=lambda r: float(r[col]))
        return f"{float(top[col]):.0f}% (b{top['batch']} ctx{longest})"

    parts = [f"page {p}: decode {best('decode', 'triton', 'pct_hbm_peak', p)} of HBM peak, "
             f"extend {best('extend', 'triton', 'pct_flops_peak', p)} of bf16 peak" for p in (1, 16)]
    parts.append(f"sdpa decode {best('decode', 'sdpa', 'pct_hbm_peak', '')}")
    statuses = ("ok", "skipped-memory", "skipped-budget", "failed")
    counts = ", ".join(f"{st} {sum(r['status'] == st for r in rows)}" for st in statuses)
    return "kernel_bench: " + "; ".join(parts) + "; rows " + counts


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--out", default="results/kernel_bench", help="output folder")
    ap.add_argument("--tiny", action="store_true",
                    help="CPU, Triton interpreter (TRITON_INTERPRET=1), tiny shapes: tests the script, "
                         "times nothing real")
    ap.add_argument("--budget-s", type=float, default=420.0,
                    help="start no measurement that would end past this many seconds of the run")
    ap.add_argument("--flex-budget-s", type=float, default=60.0,
                    help="of which FlexAttention (compiling per shape) may take at most this")
    ap.add_argument("--mem-cap-gib", type=float,
                    help="skip shapes whose KV (one copy; the dense baseline holds a second) exceeds "
                         "this; default 40%% of the device's memory")
    ap.add_argument("--page-sizes", type=int, nargs="+", help="override the grid's page sizes")
    ap.add_argument("--batches", type=int, nargs="+", help="override the decode batches")
    ap.add_argument("--contexts", type=int, nargs="+", help="override the decode contexts")
    ap.add_argument("--no-flex", action="store_true", help="skip the FlexAttention baseline")
    ap.add_argument("--peak-tflops", type=float, help="dense bf16 peak; default from the device name")
    ap.add_argument("--peak-tbps", type=float, help="HBM peak in TB/s; default from the device name")
    ap.add_argument("--warmup", type=int, default=10, help="do_bench warmup, ms")
    ap.add_argument("--rep", type=int, default=50, help="do_bench repetition time, ms")
    ap.add_argument("--reps", type=int, default=1, help="timed calls per measurement under --tiny")
    args = ap.parse_args(argv)
    for name in ("page_sizes", "batches", "contexts"):
        if any(x <= 0 for x in getattr(args, name) or []):
            ap.error(f"--{name.replace('_', '-')} must be positive")
    if args.reps < 1:
        ap.error("--reps must be >= 1")
    if args.budget_s < 0 or args.flex_budget_s < 0:
        ap.error("--budget-s and --flex-budget-s must be >= 0")
    return args


def peaks(device: str, args: argparse.Namespace) -> tuple[float, float] | None:
    """(dense bf16 FLOP/s, HBM bytes/s): the flags, else the datasheet by device name."""
    if args.tiny:
        return 1e12, 1e12  # nominal: the interpreter has no peak worth the name
    known = next((v for k, v in PEAKS.items() if k in device), None)
    flops = args.peak_tflops * 1e12 if args.peak_tflops else (known[0] if known else None)
    bw = args.peak_tbps * 1e12 if args.peak_tbps else (known[1] if known else None)
    return (flops, bw) if flops and bw else None


def describe(run: Run, args: argparse.Namespace, total_memory: int, shapes: list[Shape]) -> dict[str, Any]:
    """config.json: what was planned, on what, under which limits."""
    return {
        "device": run.env["device"],
        "interpreter": args.tiny,
        "timings": ("meaningless: Triton interpreter on a CPU, time.perf_counter" if args.tiny
                    else f"triton.testing.do_bench median (warmup {args.warmup} ms, rep {args.rep} ms)"),
        "peak_tflops_bf16_dense": run.peak_flops / 1e12,
        "peak_hbm_tb_per_s": run.peak_bw / 1e12,
        "peaks": "nominal (interpreter)" if args.tiny else "datasheet by device name, or the flags",
        "total_memory_gib": total_memory / 2**30,
        "kv_cap_gib": run.mem_cap_bytes / 2**30,
        "kv_cap_rule": "one copy of K+V per shape at most this (the dense baselines hold a second); "
                       "larger shapes are rows with status skipped-memory",
        "budget_s": args.budget_s,
        "flex_budget_s": args.flex_budget_s,
        "grid": {k: (str(v) if k == "dtype" else v) for k, v in asdict(run.grid).items()},
        "shapes_planned": len(shapes),
        "order": "long-context decode at page 1 and 16, batch <= 64, first (plan())",
        "kernel_has_num_kv_splits": kernel_splits_supported(run.kernel),
        "kernel_has_choose_num_kv_splits": hasattr(run.kernel, "choose_num_kv_splits"),
        "flex": "off" if run.flex is None else ("eager" if args.tiny else "torch.compile"),
        "tolerance": TOLERANCE[run.grid.dtype],
        "versions": {**{k: run.env[k] for k in ("torch", "triton", "cuda", "driver")},
                     "python": platform.python_version()},
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # The whole run counts: imports, compiles, the copy row. A GPU's first compile of each impl
    # is guessed so that none starts just before the limit.
    budget = Budget(args.budget_s, first_guess_s={} if args.tiny else FIRST_GUESS_S)
    if not args.tiny and not torch.cuda.is_available():
        print("kernel_bench needs a CUDA GPU and found none (torch.cuda.is_available() is False); "
              "--tiny runs it on the interpreter, whose timings mean nothing", file=sys.stderr)
        return 2
    try:
        kernel = load_kernel(args.tiny)
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    base = TINY_GRID if args.tiny else GPU_GRID
    grid = replace(base, page_sizes=tuple(args.page_sizes or base.page_sizes),
                   decode_batches=tuple(args.batches or base.decode_batches),
                   decode_contexts=tuple(args.contexts or base.decode_contexts))
    device = "cpu" if args.tiny else "cuda"
    env = environment(args.tiny, grid)
    peak = peaks(env["device"], args)
    if peak is None:
        print(f"unknown device {env['device']!r}: pass --peak-tflops and --peak-tbps", file=sys.stderr)
        return 2
    total_memory = torch.cuda.get_device_properties(0).total_memory if device == "cuda" else 1 << 30
    mem_cap = args.mem_cap_gib * 2**30 if args.mem_cap_gib is not None else 0.4 * total_memory
    run = Run(grid, device, env, peak[0], peak[1], mem_cap, budget, args.flex_budget_s,
              make_measure(args.tiny, args.warmup, args.rep, args.reps), kernel,
              None if args.no_flex else compiled_flex(args.tiny))

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shapes = plan(grid)
    config = describe(run, args, total_memory, shapes)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    rows: list[dict[str, Any]] = []
    dense_done: set[tuple[str, int, int]] = set()
    with open(out / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, COLUMNS, restval="", extrasaction="raise")
        writer.writeheader()
        for shape_rows in ([measure_copy(run)], *(measure_shape(run, s, dense_done) for s in shapes)):
            for r in shape_rows:
                writer.writerow(r)
                if r["status"] == "ok" and r["mode"] != "copy":
                    print(f"{r['mode']:7s} {r['impl']:14s} page {r['page_size']!s:>2} b{r['batch']:<3} "
                          f"ctx {r['context']:>6}: {r['time_us']:>9} us {r['pct_hbm_peak']:>6}% HBM "
                          f"{r['tflop_per_s']:>7} TFLOP/s", flush=True)
            f.flush()  # a run cut short keeps every finished shape
            rows += shape_rows
            if device == "cuda":
                torch.cuda.empty_cache()
    # The run fails on the kernel only: a wrong or failed baseline is a row (the figure drops it).
    kernel_rows = [r for r in rows if r["impl"].startswith("triton")]
    checked = [r for r in kernel_rows if r.get("checked_against")]
    kernel_failed = [r for r in kernel_rows if r["status"] == "failed"]
    correct = all(r["correct"] for r in checked) and not kernel_failed
    baselines_wrong = [r for r in rows if r["impl"] in ("sdpa", "flex") and r.get("correct") is False]
    config.update(elapsed_s=round(budget.elapsed(), 1), rows=len(rows), kernel_rows_checked=len(checked),
                  kernel_rows_failed=len(kernel_failed), correctness_ok=correct,
                  baseline_rows_wrong=len(baselines_wrong))
    (out / "config.json").write_text(json.dumps(config, indent=2))
    print(summary(rows) + f"; {len(checked)} kernel rows checked, {'all' if correct else 'NOT all'} "
          f"within {TOLERANCE[grid.dtype]:g}, {len(baselines_wrong)} baseline rows wrong; "
          f"{budget.elapsed():.0f} s; wrote {out}/results.csv")
    return 0 if correct else 1


if __name__ == "__main__":
    raise SystemExit(main())
