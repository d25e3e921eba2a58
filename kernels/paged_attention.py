"""
Paged attention: new query tokens over a paged KV cache
=======================================================

One kernel serves every attention call of the engine:

* **extend**: prefill of the tokens after a cached prefix (the prefix-cache hit),
* **prefill**: the same with an empty prefix,
* **decode**: the same with one new token.

Sequence ``b`` brings ``q_len_b`` new query tokens (packed one sequence after another in ``q``,
offsets in ``cu_seqlens_q``) and has ``seq_len_b`` tokens of KV in the cache, the new ones
included (``store_kv`` wrote them before the launch). The new tokens are the *last* ``q_len_b``
positions of the sequence, so causality is aligned to the end::

    query i of sequence b sits at position  p_i = seq_len_b - q_len_b + i
    and attends to the KV positions         [0, p_i]
    or, with a sliding window of W tokens,  [p_i - W + 1, p_i]   (vLLM's ``sliding_window``)

    out[i, h] = softmax_j(scale * q[i, h] . k[j, h // G]) @ v[j, h // G]      G = Hq // Hkv

KV lives in pages of ``PAGE_SIZE`` token slots: token ``j`` of sequence ``b`` is at slot
``j % PAGE_SIZE`` of page ``page_table[b, j // PAGE_SIZE]``. The radix backend drives this with
``PAGE_SIZE`` 1 (SGLang's token slots), the hashchain backend with vLLM's 16-token blocks.

How the work is split (the layout of vLLM's ``triton_unified_attention``):

* one program per (block of ``BLOCK_Q`` query tokens, KV head, sequence);
* the program processes the ``G`` query heads that share its KV head together: its
  ``BLOCK_M = BLOCK_Q * GROUP_PAD`` rows are (token, head-in-group) pairs, so each K/V tile is
  loaded once for the whole group (GQA's whole point: G times less KV traffic);
* it walks the KV positions in tiles of ``BLOCK_N``, looking each token's page up in the page
  table (a gather: this works for any page size, 1 included), and keeps an online softmax in
  fp32 (FlashAttention-2: running max ``m``, running sum ``l``, rescaled accumulator).

Split-KV decode (flash-decoding): a decode batch has one query token per sequence, so the grid
above is only ``batch x Hkv`` programs; at batch 1 that leaves most of a GPU idle while one
program streams a long context. With ``num_kv_splits = S > 1`` each program also takes one of
``S`` contiguous KV ranges (tile-aligned, so a split holds whole tiles of the unsplit walk),
writes its partial output and log-sum-exp, and a second kernel combines the ``S`` partials::

    out = sum_s 2^(lse_s - M) * o_s / sum_s 2^(lse_s - M)        M = max_s lse_s  (base 2)

``choose_num_kv_splits`` picks ``S`` from the batch, the context and the device's SM count.

Sliding window: a program starts its walk at the tile holding the window start of its first
query and masks the rest of that tile, so the tiles left of every query's window are never
loaded, nor their page-table entries read. That skipping is the point of a window on a GPU:
work and KV traffic per query are O(W) instead of O(context), and the pages left of the window
(freed, page 0 in the table) are never touched. Splits divide the windowed range only.

Batch invariance: with ``batch_invariant=True`` the tile shape is fixed (the largest ``BLOCK_Q``,
whatever the longest query), query blocks start at multiples of ``BLOCK_Q`` in absolute
position (so a query sits in the same row of the same tile however its prompt was chunked: a
matmul's rounding may depend on the row, numpy's BLAS under the interpreter does) and KV is
never split. The floating-point operations that make one query's output then depend only on
its position and the KV: the same whether its prefix came from the cache (decode/extend) or was
recomputed with it in one prefill.
"""

from __future__ import annotations

import functools
import math
import os

import torch
import triton
import triton.language as tl

# Page sizes the kernel is compiled for: a power of two so that `// PAGE_SIZE` and
# `% PAGE_SIZE` are shifts and masks. 128 is the largest page either system uses.
MAX_PAGE_SIZE = 128
# Target rows (query token x head-in-group pairs) per program, and KV positions per tile.
# 64 x 64 with head_dim 128 is the classic FlashAttention tile on Hopper.
BLOCK_M_TARGET = 64
BLOCK_N = 64
# tl.dot needs every dimension >= 16 on the GPU.
MIN_DOT = 16
# Split-KV: at most this many splits, each at least this many tiles of BLOCK_N positions (a
# shorter split spends more on its partial write and the combine than it saves), and enough
# programs to give every SM this many.
MAX_KV_SPLITS = 32
MIN_TILES_PER_SPLIT = 4
PROGRAMS_PER_SM = 2
# split_len of an unsplit launch: longer than any sequence, so the one range is [0, kv_end).
UNSPLIT_LEN = 1 << 30


# %%
# The kernel
# ----------


@triton.jit
def _paged_attention_kernel(
    Q,  # [T, Hq, D]
    K_CACHE,  # [num_pages, PAGE_SIZE, Hkv, D]
    V_CACHE,  # [num_pages, PAGE_SIZE, Hkv, D]
    OUT,  # [T, Hq, D]; with SPLIT: fp32 [T, Hq, S, D], each split's normalised partial output
    LSE,  # with SPLIT: fp32 [T, Hq, S], each split's log2-sum-exp2 (-inf: the split saw nothing)
    PAGE_TABLE,  # int32 [B, max_pages]
    CU_SEQLENS_Q,  # int32 [B + 1]
    SEQ_LENS,  # int32 [B]
    scale_log2e,  # softmax scale * log2(e): the softmax runs in base 2 (exp2 is one instruction)
    stride_qt,
    stride_qh,
    stride_kp,
    stride_ks,
    stride_kh,
    stride_vp,
    stride_vs,
    stride_vh,
    stride_ot,
    stride_oh,
    stride_os,  # OUT's split stride (SPLIT only)
    stride_lt,
    stride_lh,
    stride_pb,
    num_splits,  # S: program_id(0) is q_block * S + split
    split_len,  # KV positions per split, a multiple of BLOCK_N
    window,  # SLIDING only: a query at p sees KV positions [p - window + 1, p]
    GROUP: tl.constexpr,  # query heads per KV head, Hq // Hkv
    GROUP_PAD: tl.constexpr,  # GROUP rounded up to a power of two (tile shapes must be)
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,  # HEAD_DIM rounded up to a power of two
    PAGE_SIZE: tl.constexpr,
    BLOCK_Q: tl.constexpr,  # query tokens per program
    BLOCK_N: tl.constexpr,  # KV positions per tile
    DOT_FP32: tl.constexpr,  # upcast operands to fp32 before tl.dot (fp32 inputs, interpreter)
    SPLIT: tl.constexpr,  # write partials for the combine kernel instead of the output
    ALIGN_Q: tl.constexpr,  # align query blocks to absolute positions (batch invariance)
    SLIDING: tl.constexpr,  # sliding-window attention (``window``)
):
    BLOCK_M: tl.constexpr = BLOCK_Q * GROUP_PAD
    q_block = tl.program_id(0) // num_splits
    split = tl.program_id(0) % num_splits
    kv_head = tl.program_id(1)
    seq = tl.program_id(2)

    q_start = tl.load(CU_SEQLENS_Q + seq)
    q_len = tl.load(CU_SEQLENS_Q + seq + 1) - q_start
    seq_len = tl.load(SEQ_LENS + seq)
    prefix_len = seq_len - q_len  # KV positions [0, prefix_len) were cached before this step
    # ALIGN_Q: query blocks start at multiples of BLOCK_Q in absolute position, so a position
    # sits in the same row of the same tile however the prompt was chunked (a matmul's rounding
    # may depend on the row); the first block then begins with `shift` empty rows.
    shift = prefix_len % BLOCK_Q if ALIGN_Q else 0
    first = q_block * BLOCK_Q - shift  # this block's first token index within the new tokens
    if first >= q_len:  # the grid is sized for the longest query of the batch
        return

    # Row r of the tile is query token (r // GROUP_PAD) of this block, head (r % GROUP_PAD) of
    # the group. Padding rows (outside [0, q_len), or head >= GROUP) compute garbage that is
    # never stored.
    rows = tl.arange(0, BLOCK_M)
    tok = first + rows // GROUP_PAD  # [BLOCK_M] token index within the sequence's new tokens
    head = kv_head * GROUP + rows % GROUP_PAD  # [BLOCK_M] query head
    row_ok = (tok >= 0) & (tok < q_len) & (rows % GROUP_PAD < GROUP)
    q_pos = prefix_len + tok  # [BLOCK_M] absolute position: sees KV positions <= q_pos
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM

    q_ptrs = Q + (q_start + tok)[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :]
    q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)  # [BLOCK_M, BLOCK_D]
    if DOT_FP32:
        q = q.to(tl.float32)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)  # running max (base-2 logits)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)  # running sum of exp2(logit - m_i)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)  # running sum of p @ v

    # The last query of this block sees positions < kv_end; nothing after it is read.
    kv_end = tl.minimum(seq_len, prefix_len + first + BLOCK_Q)
    kv_start = 0
    if SLIDING:
        # The block's first real query sees positions >= win_lo, every later query a suffix
        # of that: the walk starts at win_lo's tile (positions stay tile-aligned in absolute
        # terms, as in the unsplit, unwindowed walk) and loads nothing left of win_lo.
        win_lo = prefix_len + tl.maximum(first, 0) - window + 1
        kv_start = tl.maximum(win_lo, 0) // BLOCK_N * BLOCK_N
    # A split walks its own range [kv_lo, kv_hi) of [kv_start, kv_end), in the same tiles.
    kv_lo = kv_start + split * split_len
    kv_hi = tl.minimum(kv_end, kv_lo + split_len)
    for start in range(kv_lo, kv_hi, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)  # [BLOCK_N] KV positions of this tile
        n_ok = n < kv_hi
        if SLIDING:
            # Left of win_lo the page may be freed (page 0 in the table): never read it.
            n_ok = n_ok & (n >= win_lo)
        # Gather: each position's page id, then its slot. int64: a layer's pool can pass 2**31.
        page = tl.load(PAGE_TABLE + seq * stride_pb + n // PAGE_SIZE, mask=n_ok, other=0).to(tl.int64)
        slot = n % PAGE_SIZE
        kv_mask = n_ok[:, None] & d_ok[None, :]
        k_ptrs = (
            K_CACHE + page[:, None] * stride_kp + slot[:, None] * stride_ks + kv_head * stride_kh + d[None, :]
        )
        v_ptrs = (
            V_CACHE + page[:, None] * stride_vp + slot[:, None] * stride_vs + kv_head * stride_vh + d[None, :]
        )
        k = tl.load(k_ptrs, mask=kv_mask, other=0.0)  # [BLOCK_N, BLOCK_D]
        v = tl.load(v_ptrs, mask=kv_mask, other=0.0)  # [BLOCK_N, BLOCK_D]

        if DOT_FP32:
            qk = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee")  # [BLOCK_M, BLOCK_N]
        else:
            qk = tl.dot(q, tl.trans(k))
        # End-aligned causal mask. A large finite negative rather than -inf: a row may see no
        # position at all (padding rows; in a split, queries before the split's range), and
        # exp2(-inf - -inf) would be NaN. What a row sees is a prefix of the walk, so once it
        # sees a position its max is finite and earlier all-masked garbage is rescaled by
        # exp2(-1e30 - m) = 0; a split row that saw nothing ends with max -1e30, which gives it
        # weight 0 in the combine (some split holds the query's own position, which it sees).
        # With a window, a row's visible positions are [q_pos - window + 1, q_pos]: still a
        # contiguous run of the walk, so the same argument holds.
        visible = (n[None, :] <= q_pos[:, None]) & n_ok[None, :]
        if SLIDING:
            visible = visible & (n[None, :] >= q_pos[:, None] - window + 1)
        qk = tl.where(visible, qk * scale_log2e, -1.0e30)

        m_new = tl.maximum(m_i, tl.max(qk, 1))  # [BLOCK_M]
        alpha = tl.math.exp2(m_i - m_new)  # rescales what was accumulated under the old max
        p = tl.math.exp2(qk - m_new[:, None])  # [BLOCK_M, BLOCK_N]
        l_i = l_i * alpha + tl.sum(p, 1)
        if DOT_FP32:
            acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32), input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new

    o_ptrs = OUT + (q_start + tok)[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :]
    if SPLIT:
        # A split with no tile for this block (its range starts past the block's last query or
        # the sequence) leaves l = 0: partial 0 with weight 2^-inf = 0 in the combine.
        seen = l_i > 0.0
        out = acc / tl.where(seen, l_i, 1.0)[:, None]
        lse = tl.where(seen, m_i + tl.math.log2(tl.where(seen, l_i, 1.0)), float("-inf"))
        tl.store(o_ptrs + split * stride_os, out, mask=row_ok[:, None] & d_ok[None, :])
        l_ptrs = LSE + (q_start + tok) * stride_lt + head * stride_lh + split
        tl.store(l_ptrs, lse, mask=row_ok)
    else:
        out = acc / l_i[:, None]
        tl.store(o_ptrs, out.to(OUT.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


@triton.jit
def _combine_splits_kernel(
    PARTIAL,  # fp32 [T, Hq, S, D]
    LSE,  # fp32 [T, Hq, S]
    OUT,  # [T, Hq, D]
    stride_pt,
    stride_ph,
    stride_ps,
    stride_lt,
    stride_lh,
    stride_ot,
    stride_oh,
    num_splits,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_S: tl.constexpr,  # num_splits rounded up to a power of two
):
    """One program per (token, query head): the softmax-weighted mean of the splits' partials."""
    t = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    s_ok = s < num_splits
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    lse = tl.load(LSE + t * stride_lt + h * stride_lh + s, mask=s_ok, other=float("-inf"))  # [BLOCK_S]
    # Some split holds the query's own position, which it always sees: the max is finite.
    w = tl.math.exp2(lse - tl.max(lse, 0))  # [BLOCK_S]; 0 for empty and padding splits
    p_ptrs = PARTIAL + t * stride_pt + h * stride_ph + s[:, None] * stride_ps + d[None, :]
    partial = tl.load(p_ptrs, mask=s_ok[:, None] & d_ok[None, :], other=0.0)  # [BLOCK_S, BLOCK_D]
    out = tl.sum(partial * w[:, None], 0) / tl.sum(w, 0)  # [BLOCK_D]
    tl.store(OUT + t * stride_ot + h * stride_oh + d, out.to(OUT.dtype.element_ty), mask=d_ok)


# %%
# The host wrapper
# ----------------
# Checks the layout (shapes, dtypes, devices, strides) before every launch: a wrong stride or
# an int64 page table would otherwise read the wrong memory silently.


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def check_layout(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
) -> None:
    """Assert that the inputs have the layout ``paged_attention`` documents (no device sync)."""
    assert q.dim() == 3, f"q must be [T, Hq, D], got shape {tuple(q.shape)}"
    assert k_cache.dim() == 4, f"k_cache must be [num_pages, page_size, Hkv, D], got {tuple(k_cache.shape)}"
    assert v_cache.shape == k_cache.shape, f"v_cache {tuple(v_cache.shape)} != k_cache {tuple(k_cache.shape)}"
    _, num_q_heads, head_dim = q.shape
    _, page_size, num_kv_heads, kv_head_dim = k_cache.shape
    assert kv_head_dim == head_dim, f"q head_dim {head_dim} != cache head_dim {kv_head_dim}"
    assert num_q_heads % num_kv_heads == 0, (
        f"Hq={num_q_heads} is not a multiple of Hkv={num_kv_heads} (GQA needs Hq % Hkv == 0)"
    )
    assert page_size & (page_size - 1) == 0 and page_size <= MAX_PAGE_SIZE, (
        f"page_size must be a power of two <= {MAX_PAGE_SIZE}, got {page_size}"
    )
    assert q.dtype in (torch.float32, torch.float16, torch.bfloat16), f"unsupported dtype {q.dtype}"
    assert k_cache.dtype == q.dtype and v_cache.dtype == q.dtype, (
        f"dtypes differ: q {q.dtype}, k_cache {k_cache.dtype}, v_cache {v_cache.dtype}"
    )
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        assert t.stride(-1) == 1, f"{name} must be contiguous in head_dim (stride(-1) == 1), got {t.stride()}"
    for name, t in (("page_table", page_table), ("cu_seqlens_q", cu_seqlens_q), ("seq_lens", seq_lens)):
        assert t.dtype == torch.int32, f"{name} must be int32, got {t.dtype}"
    assert page_table.dim() == 2 and page_table.stride(1) == 1, (
        f"page_table must be [B, max_pages] with contiguous rows, got shape {tuple(page_table.shape)} "
        f"strides {page_table.stride()}"
    )
    batch = page_table.shape[0]
    assert seq_lens.shape == (batch,), f"seq_lens must be [B={batch}], got {tuple(seq_lens.shape)}"
    assert cu_seqlens_q.shape == (batch + 1,), (
        f"cu_seqlens_q must be [B+1={batch + 1}], got {tuple(cu_seqlens_q.shape)}"
    )
    assert cu_seqlens_q.is_contiguous() and seq_lens.is_contiguous(), (
        "cu_seqlens_q and seq_lens must be contiguous"
    )
    devices = {t.device for t in (q, k_cache, v_cache, page_table, cu_seqlens_q, seq_lens)}
    assert len(devices) == 1, f"all inputs must be on one device, got {devices}"


def check_lengths(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    page_table: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
) -> int:
    """Assert that the lengths agree with each other (reads them back: a device sync).

    Returns the longest query length of the batch.
    """
    q_lens = (cu_seqlens_q[1:] - cu_seqlens_q[:-1]).cpu()
    lens = seq_lens.cpu()
    page_size = k_cache.shape[1]
    assert int(cu_seqlens_q[0]) == 0, f"cu_seqlens_q must start at 0, got {int(cu_seqlens_q[0])}"
    assert int(cu_seqlens_q[-1]) == q.shape[0], (
        f"cu_seqlens_q ends at {int(cu_seqlens_q[-1])} but q holds {q.shape[0]} tokens"
    )
    assert bool((q_lens >= 0).all()), f"cu_seqlens_q must be non-decreasing, got {cu_seqlens_q.tolist()}"
    assert bool((lens >= q_lens).all()), (
        f"each seq_len must count its new tokens too: seq_lens {lens.tolist()} < q_lens {q_lens.tolist()}"
    )
    pages_needed = (lens + page_size - 1) // page_size
    assert bool((pages_needed <= page_table.shape[1]).all()), (
        f"page_table has {page_table.shape[1]} columns; seq_lens {lens.tolist()} need up to "
        f"{int(pages_needed.max())} pages of {page_size}"
    )
    return int(q_lens.max()) if len(q_lens) else 0


def check_sliding_window(sliding_window: int | None) -> None:
    """None (full attention) or a positive int number of tokens; else a ValueError."""
    if sliding_window is None:
        return
    if isinstance(sliding_window, bool) or not isinstance(sliding_window, int) or sliding_window < 1:
        raise ValueError(f"sliding_window must be None or a positive int (tokens), got {sliding_window!r}")


def kv_span(max_seq_len: int, max_q_len: int, sliding_window: int | None) -> int:
    """The most KV positions one program's walk covers: the whole context, or with a window
    the run from the tile of its first query's window start to its last query (the block's
    ``min(BLOCK_Q, max_q_len)`` queries span W + q - 1 positions, the tile start up to
    BLOCK_N - 1 more)."""
    if sliding_window is None:
        return max_seq_len
    return min(max_seq_len, sliding_window + max_q_len - 1 + BLOCK_N - 1)


def choose_num_kv_splits(
    batch: int,
    num_kv_heads: int,
    max_q_len: int,
    max_seq_len: int,
    num_sms: int,
    sliding_window: int | None = None,
) -> int:
    """How many KV splits a launch should use (flash-decoding's heuristic, ours in detail).

    Only decode batches (one new token per sequence) split: extend and prefill have a program
    per block of query tokens already. A decode batch has ``batch * num_kv_heads`` programs;
    splitting multiplies that until every SM has ``PROGRAMS_PER_SM`` of them, as long as each
    split keeps ``MIN_TILES_PER_SPLIT`` tiles and there are at most ``MAX_KV_SPLITS``. With a
    sliding window only the tiles of the window count: a long context behind it is never read.
    """
    for name, value in (("batch", batch), ("num_kv_heads", num_kv_heads), ("num_sms", num_sms)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    check_sliding_window(sliding_window)
    if max_q_len != 1 or max_seq_len <= 0:
        return 1
    wanted = triton.cdiv(PROGRAMS_PER_SM * num_sms, batch * num_kv_heads)
    longest = triton.cdiv(kv_span(max_seq_len, 1, sliding_window), BLOCK_N * MIN_TILES_PER_SPLIT)
    return max(1, min(wanted, longest, MAX_KV_SPLITS))


def _num_sms(device: torch.device) -> int:
    """SMs of a CUDA device; 1 elsewhere (the interpreter runs programs one after another, so
    splitting there only adds work)."""
    if device.type != "cuda":
        return 1
    return _cuda_num_sms(torch.device(device).index or 0)


@functools.cache
def _cuda_num_sms(index: int) -> int:
    """Asked once per device: every decode launch consults it."""
    return torch.cuda.get_device_properties(index).multi_processor_count


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float | None = None,
    *,
    max_q_len: int | None = None,
    max_seq_len: int | None = None,
    num_kv_splits: int | None = None,
    batch_invariant: bool = False,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Causal (end-aligned) attention of the packed new tokens ``q`` over the paged KV cache.

    q:            [T, Hq, D]                         new query tokens, packed in sequence order
    k/v_cache:    [num_pages, page_size, Hkv, D]     Hq % Hkv == 0
    page_table:   int32 [B, max_pages]               physical page ids in token order, padded
    cu_seqlens_q: int32 [B + 1]                      query token offsets per sequence
    seq_lens:     int32 [B]                          KV length per sequence, cached + new
    scale:        softmax scale, 1/sqrt(D) by default
    max_q_len:    the longest q_len of the batch. If the caller knows it (an engine, a
                  benchmark) the launch needs no device sync; if not, it is read back from
                  ``cu_seqlens_q`` and the lengths are checked against each other.
    max_seq_len:  the longest seq_len, for the split heuristic (read back when it needs it and
                  it is not given).
    num_kv_splits: KV splits per sequence (flash-decoding); None: ``choose_num_kv_splits``;
                  1: no split. Any value is exact up to rounding (tests check 1..MAX_KV_SPLITS).
    batch_invariant: fix the reduction order of every query whatever the batch around it
                  (one tile shape, no split); ``num_kv_splits`` must then be None or 1.
    sliding_window: None (full causal attention) or W: a query at position p sees the KV
                  positions [p - W + 1, p]. Page-table entries of positions left of every
                  query's window are never read (they may be 0, the null page).
    returns:      [T, Hq, D] in q's dtype
    """
    check_layout(q, k_cache, v_cache, page_table, cu_seqlens_q, seq_lens)
    check_sliding_window(sliding_window)
    if max_q_len is None:
        max_q_len = check_lengths(q, k_cache, page_table, cu_seqlens_q, seq_lens)
    if num_kv_splits is not None and not 1 <= num_kv_splits <= MAX_KV_SPLITS:
        raise ValueError(f"num_kv_splits must be in [1, {MAX_KV_SPLITS}], got {num_kv_splits}")
    if batch_invariant and num_kv_splits not in (None, 1):
        raise ValueError(f"batch_invariant attention never splits KV, got num_kv_splits={num_kv_splits}")
    num_tokens, num_q_heads, head_dim = q.shape
    _, page_size, num_kv_heads, _ = k_cache.shape
    batch = page_table.shape[0]
    out = torch.empty_like(q)  # [T, Hq, D]
    if num_tokens == 0 or max_q_len == 0:
        return out
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale

    group = num_q_heads // num_kv_heads
    group_pad = triton.next_power_of_2(group)
    # Query tokens per program: fill BLOCK_M_TARGET rows with the group's heads, at least
    # MIN_DOT rows for tl.dot, no more tokens than the longest query (decode: 1 token) unless
    # the tile shape must not depend on the batch.
    block_q = max(1, BLOCK_M_TARGET // group_pad)
    if not batch_invariant:
        block_q = min(block_q, triton.next_power_of_2(max_q_len))
    block_q = max(block_q, MIN_DOT // group_pad, 1)
    interpreting = _interpreting() or q.device.type == "cpu"
    # The interpreter's bf16/fp16 tl.dot is wrong, and fp32 on the GPU would use TF32 by default.
    dot_fp32 = interpreting or q.dtype == torch.float32

    if batch_invariant:
        num_kv_splits = 1
    elif num_kv_splits is None:
        if max_q_len == 1 and max_seq_len is None:
            max_seq_len = int(seq_lens.max())
        num_kv_splits = choose_num_kv_splits(
            batch, num_kv_heads, max_q_len, max_seq_len or 0, _num_sms(q.device), sliding_window
        )
    split = num_kv_splits > 1
    if split:
        if max_seq_len is None:
            max_seq_len = int(seq_lens.max())
        # Tile-aligned ranges: a split is whole tiles of the unsplit walk.
        span = kv_span(max(max_seq_len, 1), min(block_q, max_q_len), sliding_window)
        split_len = triton.cdiv(triton.cdiv(span, num_kv_splits), BLOCK_N) * BLOCK_N
        partial = torch.empty(
            num_tokens, num_q_heads, num_kv_splits, head_dim, dtype=torch.float32, device=q.device
        )  # [T, Hq, S, D]
        lse = torch.empty(
            num_tokens, num_q_heads, num_kv_splits, dtype=torch.float32, device=q.device
        )  # [T, Hq, S]
        target, lse_strides = partial, (lse.stride(0), lse.stride(1))
    else:
        split_len = UNSPLIT_LEN
        lse = out  # unused without SPLIT
        target, lse_strides = out, (0, 0)

    # Aligned blocks may start up to block_q - 1 rows before a sequence's first new token.
    q_blocks = triton.cdiv(max_q_len + (block_q - 1 if batch_invariant else 0), block_q)
    grid = (q_blocks * num_kv_splits, num_kv_heads, batch)
    _paged_attention_kernel[grid](
        q, k_cache, v_cache, target, lse, page_table, cu_seqlens_q, seq_lens,
        scale * math.log2(math.e),
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        target.stride(0), target.stride(1), target.stride(2) if split else 0,
        *lse_strides,
        page_table.stride(0),
        num_kv_splits, split_len, sliding_window or 0,
        GROUP=group,
        GROUP_PAD=group_pad,
        HEAD_DIM=head_dim,
        BLOCK_D=max(triton.next_power_of_2(head_dim), MIN_DOT),
        PAGE_SIZE=page_size,
        BLOCK_Q=block_q,
        BLOCK_N=BLOCK_N,
        DOT_FP32=dot_fp32,
        SPLIT=split,
        ALIGN_Q=batch_invariant,
        SLIDING=sliding_window is not None,
        num_warps=4,
        num_stages=2,
    )  # fmt: skip
    if split:
        combine_splits(partial, lse, out)
    return out


def combine_splits(partial: torch.Tensor, lse: torch.Tensor, out: torch.Tensor) -> None:
    """Write into ``out`` [T, Hq, D] the combination of the splits' partial outputs
    ``partial`` fp32 [T, Hq, S, D] with log2-sum-exp2 weights ``lse`` fp32 [T, Hq, S]."""
    num_tokens, num_q_heads, num_splits, head_dim = partial.shape
    assert lse.shape == partial.shape[:3], f"lse {tuple(lse.shape)} != {tuple(partial.shape[:3])}"
    assert out.shape == (num_tokens, num_q_heads, head_dim), (
        f"out {tuple(out.shape)} != {(num_tokens, num_q_heads, head_dim)}"
    )
    assert partial.stride(-1) == 1 and lse.stride(-1) == 1 and out.stride(-1) == 1
    _combine_splits_kernel[(num_tokens, num_q_heads)](
        partial, lse, out,
        partial.stride(0), partial.stride(1), partial.stride(2),
        lse.stride(0), lse.stride(1),
        out.stride(0), out.stride(1),
        num_splits,
        HEAD_DIM=head_dim,
        BLOCK_D=max(triton.next_power_of_2(head_dim), MIN_DOT),
        BLOCK_S=max(triton.next_power_of_2(num_splits), 2),
        num_warps=4,
    )  # fmt: skip


# %%
# Writing new KV
# --------------
# Plain torch indexing, not a Triton kernel: the write is one scatter of contiguous [Hkv, D]
# rows, which torch's index_put already does in one bandwidth-bound launch. vLLM needs its own
# op (reshape_and_cache_flash) for fp8 quantisation and other cache layouts; we have neither.


def store_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write the new tokens' K/V into their slots (slot = page * page_size + offset).

    k, v:         [T, Hkv, D]
    k/v_cache:    [num_pages, page_size, Hkv, D]   contiguous
    slot_mapping: int [T]
    """
    assert k.dim() == 3 and k.shape == v.shape, (
        f"k and v must be [T, Hkv, D], got {tuple(k.shape)}, {tuple(v.shape)}"
    )
    assert k_cache.dim() == 4 and v_cache.shape == k_cache.shape, (
        f"k/v_cache must both be [num_pages, page_size, Hkv, D], "
        f"got {tuple(k_cache.shape)}, {tuple(v_cache.shape)}"
    )
    assert k.shape[1:] == k_cache.shape[2:], (
        f"k is [T, {k.shape[1]}, {k.shape[2]}], cache rows are {tuple(k_cache.shape[2:])}"
    )
    assert k.dtype == k_cache.dtype == v.dtype == v_cache.dtype, (
        f"dtypes differ: k {k.dtype}, v {v.dtype}, k_cache {k_cache.dtype}, v_cache {v_cache.dtype}"
    )
    assert k_cache.is_contiguous() and v_cache.is_contiguous(), (
        "k/v_cache must be contiguous to be addressed by slot"
    )
    assert slot_mapping.shape == (k.shape[0],), (
        f"slot_mapping must be [T={k.shape[0]}], got {tuple(slot_mapping.shape)}"
    )
    assert not slot_mapping.is_floating_point(), f"slot_mapping must be integer, got {slot_mapping.dtype}"
    num_slots = k_cache.shape[0] * k_cache.shape[1]
    slots = slot_mapping.long()
    k_cache.view(num_slots, *k_cache.shape[2:])[slots] = k
    v_cache.view(num_slots, *v_cache.shape[2:])[slots] = v
