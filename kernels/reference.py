"""The oracle for ``paged_attention``: gather each sequence's KV through its page table, then
``scaled_dot_product_attention`` in fp32 with an explicit end-aligned causal mask (banded by
the sliding window if there is one).

Not ``is_causal=True``: SDPA aligns that mask top-left, so with a cached prefix (q_len <
kv_len) query i would see positions <= i instead of <= kv_len - q_len + i.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from prefixcache.kernels.paged_attention import check_sliding_window


def end_aligned_causal_mask(
    q_len: int, kv_len: int, device: torch.device | str = "cpu", sliding_window: int | None = None
) -> torch.Tensor:
    """bool [q_len, kv_len]: True where query i (at position p = kv_len - q_len + i) may attend:
    positions <= p, and with a sliding window W only p - W + 1 .. p (vLLM's meaning)."""
    q_pos = torch.arange(kv_len - q_len, kv_len, device=device)  # [q_len]
    kv_pos = torch.arange(kv_len, device=device)  # [kv_len]
    mask = kv_pos[None, :] <= q_pos[:, None]
    if sliding_window is not None:
        mask &= kv_pos[None, :] > q_pos[:, None] - sliding_window
    return mask


def paged_attention_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float | None = None,
    *,
    # Accepted for signature parity with ``paged_attention``; the reference needs none of them
    # (it has no tiles to split or to align).
    max_q_len: int | None = None,
    max_seq_len: int | None = None,
    num_kv_splits: int | None = None,
    batch_invariant: bool = False,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Same inputs and output as ``paged_attention`` (see there), one sequence at a time.

    With a window, only the pages from the first query's window start on are gathered: those
    before it may be the null page 0 and hold anything (a masked NaN would still poison SDPA).
    """
    check_sliding_window(sliding_window)
    num_tokens, num_q_heads, head_dim = q.shape  # q: [T, Hq, D]
    _, page_size, num_kv_heads, _ = k_cache.shape  # k/v_cache: [P, S, Hkv, D]
    assert num_q_heads % num_kv_heads == 0, f"Hq={num_q_heads} is not a multiple of Hkv={num_kv_heads}"
    group = num_q_heads // num_kv_heads
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    out = torch.empty_like(q)  # [T, Hq, D]
    cu = cu_seqlens_q.tolist()
    for b, kv_len in enumerate(seq_lens.tolist()):
        q_b = q[cu[b] : cu[b + 1]]  # [q_len, Hq, D]
        q_len = q_b.shape[0]
        if q_len == 0:
            continue
        assert kv_len >= q_len, f"sequence {b}: seq_len {kv_len} < its {q_len} new tokens"
        # [0, first_page * page_size)  never seen: left of every query's window
        first_page = 0 if sliding_window is None else max(0, kv_len - q_len - sliding_window + 1) // page_size
        lo = first_page * page_size
        pages = page_table[b, first_page : -(-kv_len // page_size)].long()  # [n_pages]
        k_b = k_cache[pages].reshape(-1, num_kv_heads, head_dim)[: kv_len - lo]  # [kv_len - lo, Hkv, D]
        v_b = v_cache[pages].reshape(-1, num_kv_heads, head_dim)[: kv_len - lo]  # [kv_len - lo, Hkv, D]
        # Heads first for SDPA; each KV head serves `group` consecutive query heads.
        qh = q_b.float().transpose(0, 1)  # [Hq, q_len, D]
        kh = k_b.float().transpose(0, 1).repeat_interleave(group, dim=0)  # [Hq, kv_len - lo, D]
        vh = v_b.float().transpose(0, 1).repeat_interleave(group, dim=0)  # [Hq, kv_len - lo, D]
        mask = end_aligned_causal_mask(q_len, kv_len, q.device, sliding_window)  # [q_len, kv_len]
        mask = mask[:, lo:]  # [q_len, kv_len - lo]
        o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale)  # [Hq, q_len, D]
        out[cu[b] : cu[b + 1]] = o.transpose(0, 1).to(q.dtype)
    return out
