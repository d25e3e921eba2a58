"""How close the paged-attention kernel gets to the GPU's roofline (GPU only, never in tests).

* decode (one new token per sequence) is bound by HBM: we report the achieved bandwidth of
  reading K and V, as a fraction of the device's peak;
* extend (``--extend-len`` new tokens over a cached prefix) is bound by compute: we report the
  achieved TFLOP/s of the two matmuls (causal, end-aligned), as a fraction of dense bf16 peak.

Each is measured with page size 1 (SGLang's token slots) and 16 (vLLM's blocks), pages shuffled
through the pool as a long-running cache leaves them, across batch (1..64) and context
(1k..32k) at a Llama-3-8B-like shape (32 query heads, 8 KV heads, head_dim 128, bf16), and
against the PyTorch reference (gather + SDPA) where it fits. Timed by
``triton.testing.do_bench`` (median). Writes ``results/kernel_bench/results.csv`` (one tidy
row per measurement) and ``config.json`` (device, peaks, shapes, versions, a correctness check)
and prints one summary line.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
import triton
import triton.testing
from prefixcache.kernels.paged_attention import paged_attention
from prefixcache.kernels.reference import paged_attention_reference

# Peak dense bf16 FLOP/s and HBM bytes/s by device name (datasheet numbers, no sparsity).
PEAKS = {
    "H200": (989e12, 4.8e12),
    "H100": (989e12, 3.35e12),
    "A100": (312e12, 2.0e12),
}
BATCHES = [1, 4, 16, 64]
CONTEXTS = [1024, 4096, 16384, 32768]
QUICK_BATCHES = [1, 16]
QUICK_CONTEXTS = [1024, 8192]
PAGE_SIZES = [1, 16]
# The reference materialises each sequence's KV in fp32, repeated per query head: skip it
# beyond this many KV tokens in a batch (it would take minutes and tells nothing new).
REFERENCE_MAX_TOKENS = 1 << 18
DTYPE = torch.bfloat16
DEVICE = "cuda"


def make_inputs(
    batch: int, context: int, q_len: int, page_size: int, args: argparse.Namespace, seed: int = 0
) -> tuple[torch.Tensor, ...]:
    """A batch of ``batch`` sequences of ``context`` tokens, the last ``q_len`` of them new."""
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    pages_per_seq = -(-context // page_size)
    num_pages = batch * pages_per_seq + 1  # page 0 reserved, as in the caches
    # Shuffled pages: a cache that has run a while hands out scattered pages, never a range.
    perm = torch.randperm(num_pages - 1, generator=g, device=DEVICE) + 1
    page_table = perm.view(batch, pages_per_seq).int()  # [B, max_pages]
    cache_shape = (num_pages, page_size, args.kv_heads, args.head_dim)
    k_cache = torch.randn(cache_shape, generator=g, device=DEVICE, dtype=DTYPE)  # [P, S, Hkv, D]
    v_cache = torch.randn(cache_shape, generator=g, device=DEVICE, dtype=DTYPE)  # [P, S, Hkv, D]
    q = torch.randn(batch * q_len, args.q_heads, args.head_dim, generator=g, device=DEVICE, dtype=DTYPE)
    cu_seqlens_q = torch.arange(0, batch + 1, device=DEVICE, dtype=torch.int32) * q_len  # [B + 1]
    seq_lens = torch.full((batch,), context, device=DEVICE, dtype=torch.int32)  # [B]
    return q, k_cache, v_cache, page_table, cu_seqlens_q, seq_lens


def work(batch: int, context: int, q_len: int, args: argparse.Namespace) -> tuple[float, float]:
    """(bytes that must move, FLOPs that must run) for one call: the roofline denominators."""
    elem = torch.finfo(DTYPE).bits // 8
    kv_bytes = 2 * batch * context * args.kv_heads * args.head_dim * elem  # K and V read once
    qo_bytes = 2 * batch * q_len * args.q_heads * args.head_dim * elem  # q read, out written
    # Query i of a sequence sees (context - q_len + i + 1) keys; QK^T and PV are 2 flops/MAC each.
    keys_seen = q_len * (context - q_len) + q_len * (q_len + 1) / 2
    flops = 4 * batch * args.q_heads * args.head_dim * keys_seen
    return kv_bytes + qo_bytes, flops


def check_correctness(args: argparse.Namespace) -> float:
    """Max |kernel - reference| on one small mixed shape, in the benchmark's dtype."""
    worst = 0.0
    for page_size in PAGE_SIZES:
        for q_len in (1, 64):
            inputs = make_inputs(2, 1000, q_len, page_size, args, seed=1)
            out = paged_attention(*inputs)
            ref = paged_attention_reference(*inputs)
            worst = max(worst, (out.float() - ref.float()).abs().max().item())
    return worst


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    peak_flops, peak_bw = args.peak_tflops * 1e12, args.peak_tbps * 1e12
    rows = []
    for mode, q_len in (("decode", 1), ("extend", args.extend_len)):
        for page_size in PAGE_SIZES:
            for batch in args.batches:
                for context in args.contexts:
                    if q_len > context:
                        continue
                    inputs = make_inputs(batch, context, q_len, page_size, args)
                    nbytes, flops = work(batch, context, q_len, args)
                    impls: dict[str, Callable[[], torch.Tensor]] = {
                        "triton": partial(paged_attention, *inputs, max_q_len=q_len)  # no host sync
                    }
                    if batch * context <= REFERENCE_MAX_TOKENS:
                        impls["reference"] = partial(paged_attention_reference, *inputs)
                    for impl, fn in impls.items():
                        ms = triton.testing.do_bench(
                            fn, warmup=args.warmup, rep=args.rep, return_mode="median"
                        )
                        seconds = ms * 1e-3
                        rows.append(
                            dict(
                                mode=mode,
                                impl=impl,
                                page_size=page_size,
                                batch=batch,
                                context=context,
                                q_len=q_len,
                                ms=ms,
                                bytes=nbytes,
                                flops=flops,
                                tb_per_s=nbytes / seconds / 1e12,
                                tflop_per_s=flops / seconds / 1e12,
                                frac_peak_bw=nbytes / seconds / peak_bw,
                                frac_peak_flops=flops / seconds / peak_flops,
                            )  # fmt: skip
                        )
                        r = rows[-1]
                        print(
                            f"{mode:6s} {impl:9s} page {page_size:2d} batch {batch:2d} ctx {context:5d}: "
                            f"{ms:8.3f} ms  {r['tb_per_s']:5.2f} TB/s  {r['tflop_per_s']:6.1f} TFLOP/s",
                            flush=True,
                        )
                    del inputs
                    torch.cuda.empty_cache()
    return rows


def summary(rows: list[dict[str, Any]]) -> str:
    def best(mode: str, page_size: int, key: str) -> dict[str, Any]:
        cands = [
            r for r in rows if r["mode"] == mode and r["impl"] == "triton" and r["page_size"] == page_size
        ]
        return max(cands, key=lambda r: r[key])

    parts = []
    for page_size in PAGE_SIZES:
        d = best("decode", page_size, "frac_peak_bw")
        e = best("extend", page_size, "frac_peak_flops")
        parts.append(
            f"page {page_size}: decode {d['tb_per_s']:.2f} TB/s ({d['frac_peak_bw']:.0%} of HBM peak, "
            f"b{d['batch']} ctx{d['context']}), extend {e['tflop_per_s']:.0f} TFLOP/s "
            f"({e['frac_peak_flops']:.0%} of peak, b{e['batch']} ctx{e['context']})"
        )
    return "kernel_bench: " + "; ".join(parts)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="results/kernel_bench", help="output folder")
    ap.add_argument(
        "--quick", action="store_true", help=f"batches {QUICK_BATCHES}, contexts {QUICK_CONTEXTS}"
    )
    ap.add_argument("--batches", type=int, nargs="+", default=BATCHES)
    ap.add_argument("--contexts", type=int, nargs="+", default=CONTEXTS)
    ap.add_argument("--extend-len", type=int, default=512, help="new tokens per sequence in extend")
    ap.add_argument("--q-heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--peak-tflops", type=float, help="dense bf16 peak; default from the device name")
    ap.add_argument("--peak-tbps", type=float, help="HBM peak in TB/s; default from the device name")
    ap.add_argument("--warmup", type=int, default=25, help="do_bench warmup, ms")
    ap.add_argument("--rep", type=int, default=100, help="do_bench repetition time, ms")
    args = ap.parse_args(argv)
    if args.quick:
        args.batches, args.contexts = QUICK_BATCHES, QUICK_CONTEXTS
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print(
            "kernel_bench needs a CUDA GPU and found none: timings under the Triton interpreter "
            "mean nothing (correctness runs in tests/test_kernel.py instead).",
            file=sys.stderr,
        )
        return 2
    device = torch.cuda.get_device_name()
    known = next((v for k, v in PEAKS.items() if k in device), None)
    if known is None and (args.peak_tflops is None or args.peak_tbps is None):
        print(f"unknown device {device!r}: pass --peak-tflops and --peak-tbps", file=sys.stderr)
        return 2
    args.peak_tflops = args.peak_tflops or known[0] / 1e12  # type: ignore[index]
    args.peak_tbps = args.peak_tbps or known[1] / 1e12  # type: ignore[index]

    max_error = check_correctness(args)
    rows = measure(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    columns = list(rows[0])
    with open(out / "results.csv", "w") as f:
        f.write(",".join(columns) + "\n")
        for r in rows:
            f.write(",".join(f"{r[c]:.6g}" if isinstance(r[c], float) else str(r[c]) for c in columns) + "\n")
    config = {
        "device": device,
        "peak_tflops_bf16_dense": args.peak_tflops,
        "peak_hbm_tb_per_s": args.peak_tbps,
        "dtype": str(DTYPE),
        "q_heads": args.q_heads,
        "kv_heads": args.kv_heads,
        "head_dim": args.head_dim,
        "extend_len": args.extend_len,
        "batches": args.batches,
        "contexts": args.contexts,
        "page_sizes": PAGE_SIZES,
        "reference_max_tokens": REFERENCE_MAX_TOKENS,
        "do_bench": {"warmup_ms": args.warmup, "rep_ms": args.rep, "return_mode": "median"},
        "max_abs_error_vs_reference": max_error,
        "versions": {
            "torch": torch.__version__,
            "triton": triton.__version__,
            "python": platform.python_version(),
        },
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    line = summary(rows)
    print(line + f"; max |kernel - reference| {max_error:.3g}; wrote {out}/results.csv")
    return 0 if math.isfinite(max_error) else 1


if __name__ == "__main__":
    raise SystemExit(main())
