"""Seeded sliding-window attention inputs, built the same way by the recorder (vLLM 0.33's
unified-attention kernel, experiments/upstream/vllm_window_driver.py) and by
tests/test_kernel_window.py, so the fixture stores only vLLM's outputs. Pages wholly left of
every query's window are the null page (0), which holds finite garbage."""

from __future__ import annotations

from typing import Any

import torch

H_KV, GROUP, HEAD_DIM = 2, 4, 32
Q_LENS, SEQ_LENS = [1, 7, 20, 1], [140, 100, 20, 5]  # decode, extend, prefill, a short decode
CASES = [(16, 5), (16, 37), (32, 16), (32, 1000)]  # (page size, window)


def build(page_size: int, window: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(1000 * page_size + window)
    pages = [-(-n // page_size) for n in SEQ_LENS]
    num_pages = sum(pages) + 1
    k = torch.randn(num_pages, page_size, H_KV, HEAD_DIM, generator=g)
    v = torch.randn(num_pages, page_size, H_KV, HEAD_DIM, generator=g)
    k[0], v[0] = 1e3, -1e3
    order = (torch.randperm(num_pages - 1, generator=g) + 1).tolist()
    table = torch.zeros(len(SEQ_LENS), max(pages), dtype=torch.int32)
    for b, (n_pages, q_len, n) in enumerate(zip(pages, Q_LENS, SEQ_LENS, strict=True)):
        ids, order = order[:n_pages], order[n_pages:]
        table[b, :n_pages] = torch.tensor(ids, dtype=torch.int32)
        table[b, : max(0, n - q_len - window + 1) // page_size] = 0
    q = torch.randn(sum(Q_LENS), H_KV * GROUP, HEAD_DIM, generator=g)
    cu = torch.tensor([0, *Q_LENS], dtype=torch.int32).cumsum(0, dtype=torch.int32)
    return dict(q=q, k=k, v=v, page_table=table, cu_seqlens_q=cu,
                seq_lens=torch.tensor(SEQ_LENS, dtype=torch.int32))
