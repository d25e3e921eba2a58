"""The Triton paged-attention kernel against its PyTorch reference (interpreter on CPU).

Every batch lives in a pool whose pages are shuffled and whose unused pages and slots hold NaN,
so a read outside a sequence's pages, or past its length, turns the output NaN.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pytest
import torch
from prefixcache.kernels.paged_attention import (
    BLOCK_N,
    MAX_KV_SPLITS,
    MIN_TILES_PER_SPLIT,
    choose_num_kv_splits,
    combine_splits,
    paged_attention,
    store_kv,
)
from prefixcache.kernels.reference import end_aligned_causal_mask, paged_attention_reference

pytestmark = pytest.mark.kernel

# Kernel vs reference, both accumulating in fp32; the rest is the output's rounding (one or two
# ulps at |out| ~ 1: fp16 ulp ~1e-3, bf16 ulp ~8e-3) plus, on a GPU, p rounded before p @ v.
TOLERANCE = {
    torch.float32: dict(atol=2e-5, rtol=2e-5),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
}
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
NUM_KV_HEADS = 2
HEAD_DIM = 32

# (q_len per sequence, seq_len per sequence): the new tokens are the last q_len of seq_len.
SCENARIOS = {
    "decode": ([1, 1, 1], [1, 17, 50]),
    "extend": ([7, 16], [30, 48]),  # over cached prefixes of 23 and 32 tokens
    "prefill": ([9, 33], [9, 33]),
    "mixed": ([1, 12, 20, 1], [40, 12, 37, 5]),
}


class Batch(NamedTuple):
    q: torch.Tensor  # [T, Hq, D]
    k_cache: torch.Tensor  # [num_pages, page_size, Hkv, D]
    v_cache: torch.Tensor  # [num_pages, page_size, Hkv, D]
    page_table: torch.Tensor  # int32 [B, max_pages]
    cu_seqlens_q: torch.Tensor  # int32 [B + 1]
    seq_lens: torch.Tensor  # int32 [B]


def logical_kv(
    seq_lens: list[int], num_kv_heads: int, head_dim: int, seed: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per sequence, its K and V in token order: ([seq_len, Hkv, D], [seq_len, Hkv, D])."""
    g = torch.Generator().manual_seed(seed)
    return [
        (
            torch.randn(n, num_kv_heads, head_dim, generator=g),
            torch.randn(n, num_kv_heads, head_dim, generator=g),
        )
        for n in seq_lens
    ]


def paged_batch(
    q_lens: list[int],
    seq_lens: list[int],
    *,
    page_size: int,
    group: int,
    num_kv_heads: int = NUM_KV_HEADS,
    head_dim: int = HEAD_DIM,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
) -> Batch:
    """Store each sequence's KV in shuffled, non-contiguous pages of a NaN-filled pool."""
    g = torch.Generator().manual_seed(seed + 1)
    cu = torch.tensor([0] + q_lens, dtype=torch.int32).cumsum(0, dtype=torch.int32)  # [B + 1]
    # q before the page shuffle: the same seed gives the same queries whatever the page size.
    q = torch.randn(int(cu[-1]), num_kv_heads * group, head_dim, generator=g).to(dtype)  # [T, Hq, D]
    kv = logical_kv(seq_lens, num_kv_heads, head_dim, seed) if kv is None else kv
    pages_per_seq = [-(-n // page_size) for n in seq_lens]
    num_pages = 2 * sum(pages_per_seq) + 2  # half of the pool stays unused (NaN)
    max_pages = max(pages_per_seq) + 2  # padding columns, pointing at NaN pages
    order = (torch.randperm(num_pages - 1, generator=g) + 1).tolist()  # page 0 stays reserved
    k_cache = torch.full(
        (num_pages, page_size, num_kv_heads, head_dim), float("nan"), dtype=dtype, device=DEVICE
    )
    v_cache = torch.full_like(k_cache, float("nan"))
    unused = order[sum(pages_per_seq) :]
    page_table = torch.full((len(seq_lens), max_pages), unused[0], dtype=torch.int32)
    for b, n_pages in enumerate(pages_per_seq):
        pages, order = order[:n_pages], order[n_pages:]
        page_table[b, :n_pages] = torch.tensor(pages, dtype=torch.int32)
        slots = torch.tensor([pages[t // page_size] * page_size + t % page_size for t in range(seq_lens[b])])
        k, v = kv[b]
        store_kv(k.to(dtype).to(DEVICE), v.to(dtype).to(DEVICE), k_cache, v_cache, slots.to(DEVICE))
    return Batch(
        q.to(DEVICE),
        k_cache,
        v_cache,
        page_table.to(DEVICE),
        cu.to(DEVICE),
        torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE),
    )


def assert_matches_reference(batch: Batch) -> torch.Tensor:
    out = paged_attention(*batch)  # [T, Hq, D]
    ref = paged_attention_reference(*batch)  # [T, Hq, D]
    assert out.shape == batch.q.shape and out.dtype == batch.q.dtype
    assert torch.isfinite(out).all(), "NaN in the output: the kernel read a slot it must not"
    torch.testing.assert_close(out, ref, **TOLERANCE[batch.q.dtype])
    return out


@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_kernel_matches_reference(scenario: str, group: int, page_size: int) -> None:
    q_lens, seq_lens = SCENARIOS[scenario]
    assert_matches_reference(paged_batch(q_lens, seq_lens, page_size=page_size, group=group))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_kernel_matches_reference_in_half_precision(dtype: torch.dtype) -> None:
    q_lens, seq_lens = SCENARIOS["mixed"]
    assert_matches_reference(paged_batch(q_lens, seq_lens, page_size=16, group=4, dtype=dtype))


@pytest.mark.parametrize(
    ("num_q_heads", "num_kv_heads", "head_dim"),
    [(4, 1, 16), (6, 2, 24), (3, 3, 32)],  # MQA; group of 3 and head_dim 24 (padded tiles); MHA
)
def test_kernel_handles_odd_head_shapes(num_q_heads: int, num_kv_heads: int, head_dim: int) -> None:
    q_lens, seq_lens = SCENARIOS["mixed"]
    batch = paged_batch(
        q_lens,
        seq_lens,
        page_size=4,
        group=num_q_heads // num_kv_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
    )
    assert_matches_reference(batch)


def test_sequence_without_new_tokens_is_skipped() -> None:
    batch = paged_batch([3, 0, 2], [10, 7, 2], page_size=4, group=2)
    assert_matches_reference(batch)


def test_same_kv_in_pages_of_1_and_16_gives_same_output() -> None:
    q_lens, seq_lens = SCENARIOS["mixed"]
    kv = logical_kv(seq_lens, NUM_KV_HEADS, HEAD_DIM, seed=7)
    small = paged_batch(q_lens, seq_lens, page_size=1, group=4, kv=kv, seed=7)
    large = paged_batch(q_lens, seq_lens, page_size=16, group=4, kv=kv, seed=7)
    torch.testing.assert_close(small.q, large.q, atol=0, rtol=0)
    torch.testing.assert_close(paged_attention(*small), paged_attention(*large), **TOLERANCE[torch.float32])


def test_end_aligned_mask_lets_the_last_query_see_everything() -> None:
    mask = end_aligned_causal_mask(q_len=2, kv_len=5)
    assert mask.tolist() == [[True, True, True, True, False], [True, True, True, True, True]]


@pytest.mark.parametrize("page_size", [1, 16])
def test_store_kv_round_trip(page_size: int) -> None:
    num_tokens = 20
    num_pages = 2 * num_tokens // page_size + 1
    k_cache = torch.zeros(num_pages, page_size, NUM_KV_HEADS, HEAD_DIM)
    v_cache = torch.zeros_like(k_cache)
    k = torch.randn(num_tokens, NUM_KV_HEADS, HEAD_DIM)
    v = torch.randn(num_tokens, NUM_KV_HEADS, HEAD_DIM)
    slots = torch.randperm(num_pages * page_size)[:num_tokens]
    store_kv(k, v, k_cache, v_cache, slots.int())
    pages, offsets = slots // page_size, slots % page_size
    assert torch.equal(k_cache[pages, offsets], k)
    assert torch.equal(v_cache[pages, offsets], v)
    assert int((k_cache.flatten(0, 1).abs().sum((1, 2)) > 0).sum()) == num_tokens  # nothing else written


def _bad(name: str, batch: Batch) -> Batch:
    """``batch`` with one input broken in the way ``name`` says."""
    q, k, v, pt, cu, sl = batch
    if name == "q not 3-d":
        q = q.flatten(1)
    elif name == "Hq not a multiple of Hkv":
        q = q[:, :3]
    elif name == "head_dim mismatch":
        q = q[..., :16]
    elif name == "page_size not a power of two":
        k, v = k[:, :3], v[:, :3]
    elif name == "dtype mismatch":
        k = k.half()
    elif name == "head_dim not contiguous":
        q = q.transpose(1, 2).contiguous().transpose(1, 2)
    elif name == "page_table int64":
        pt = pt.long()
    elif name == "cu_seqlens_q wrong length":
        cu = cu[:-1]
    elif name == "seq_len shorter than q_len":
        sl = sl.clone()
        sl[1] = 0
    elif name == "cu_seqlens_q does not cover q":
        q = q[:-1]
    elif name == "page_table too narrow":
        pt = pt[:, :1]
    return Batch(q, k, v, pt, cu, sl)


@pytest.mark.parametrize(
    "name",
    [
        "q not 3-d",
        "Hq not a multiple of Hkv",
        "head_dim mismatch",
        "page_size not a power of two",
        "dtype mismatch",
        "head_dim not contiguous",
        "page_table int64",
        "cu_seqlens_q wrong length",
        "seq_len shorter than q_len",
        "cu_seqlens_q does not cover q",
        "page_table too narrow",
    ],
)
def test_bad_layout_raises_before_launch(name: str) -> None:
    batch = paged_batch([2, 3], [6, 9], page_size=4, group=2)
    with pytest.raises(AssertionError):
        paged_attention(*_bad(name, batch))


def test_store_kv_rejects_mismatched_rows() -> None:
    k_cache = torch.zeros(4, 4, NUM_KV_HEADS, HEAD_DIM)
    k = torch.zeros(3, NUM_KV_HEADS + 1, HEAD_DIM)
    with pytest.raises(AssertionError, match="cache rows"):
        store_kv(k, k, k_cache, k_cache.clone(), torch.arange(3))


# %%
# Split-KV decode (flash-decoding) and its combine
# ------------------------------------------------
# Ragged decode: contexts from 1 token (every split but the first is empty) to several tiles.
RAGGED_DECODE = ([1, 1, 1, 1], [1, 70, 300, 129])


@pytest.mark.parametrize("num_kv_splits", [2, 5])
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_split_kv_decode_matches_reference(num_kv_splits: int, group: int, page_size: int) -> None:
    q_lens, seq_lens = RAGGED_DECODE
    batch = paged_batch(q_lens, seq_lens, page_size=page_size, group=group)
    out = paged_attention(*batch, num_kv_splits=num_kv_splits)
    assert torch.isfinite(out).all(), "NaN: a split read a slot it must not, or an empty split leaked"
    torch.testing.assert_close(out, paged_attention_reference(*batch), **TOLERANCE[torch.float32])


@pytest.mark.parametrize("num_kv_splits", [3, 8])
def test_split_kv_is_exact_for_extend_and_mixed_batches(num_kv_splits: int) -> None:
    """Splits are not only for decode: queries before a split's range see none of it."""
    q_lens, seq_lens = SCENARIOS["mixed"]
    batch = paged_batch(q_lens, seq_lens, page_size=16, group=4)
    out = paged_attention(*batch, num_kv_splits=num_kv_splits)
    torch.testing.assert_close(out, paged_attention_reference(*batch), **TOLERANCE[torch.float32])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_split_kv_in_half_precision(dtype: torch.dtype) -> None:
    q_lens, seq_lens = RAGGED_DECODE
    batch = paged_batch(q_lens, seq_lens, page_size=16, group=4, dtype=dtype)
    torch.testing.assert_close(
        paged_attention(*batch, num_kv_splits=4), paged_attention_reference(*batch), **TOLERANCE[dtype]
    )


def test_combine_weights_splits_by_their_log_sum_exp() -> None:
    """Two splits of one row: the combine is the softmax-weighted mean; an empty split (-inf)
    counts for nothing, even when its partial holds garbage."""
    partial = torch.stack(
        [torch.full((HEAD_DIM,), 1.0), torch.full((HEAD_DIM,), 3.0), torch.full((HEAD_DIM,), 1e6)]
    )[None, None]  # [1, 1, 3, D]
    lse = torch.tensor([[[0.0, 1.0, float("-inf")]]])  # weights 1 : 2 : 0 (base 2)
    out = torch.empty(1, 1, HEAD_DIM)
    combine_splits(partial, lse, out)
    torch.testing.assert_close(out, torch.full((1, 1, HEAD_DIM), (1.0 + 2 * 3.0) / 3))


def test_split_heuristic() -> None:
    sms = 132  # an H100/H200
    # Decode at batch 1: split until the SMs are busy, bounded by the context's tiles.
    assert choose_num_kv_splits(1, 8, 1, 128 * 1024, sms) == min(MAX_KV_SPLITS, -(-2 * sms // 8))
    assert choose_num_kv_splits(1, 8, 1, 2 * BLOCK_N * MIN_TILES_PER_SPLIT, sms) == 2
    assert choose_num_kv_splits(1, 8, 1, 100, sms) == 1  # one split's worth of context
    # A big batch already fills the GPU; extend and prefill never split; neither does a CPU.
    assert choose_num_kv_splits(256, 8, 1, 128 * 1024, sms) == 1
    assert choose_num_kv_splits(1, 8, 512, 128 * 1024, sms) == 1
    assert choose_num_kv_splits(1, 8, 1, 128 * 1024, 1) == 1
    with pytest.raises(ValueError, match="batch"):
        choose_num_kv_splits(0, 8, 1, 1024, sms)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(num_kv_splits=0),
        dict(num_kv_splits=MAX_KV_SPLITS + 1),
        dict(num_kv_splits=2, batch_invariant=True),
    ],
)
def test_bad_split_request_is_a_clear_error(kwargs: dict) -> None:
    batch = paged_batch([1], [8], page_size=4, group=2)
    with pytest.raises(ValueError, match="num_kv_splits"):
        paged_attention(*batch, **kwargs)


# %%
# Batch invariance
# ----------------
# A prompt's outputs must not depend on how it was chunked: each chunking computes the queries
# of one chunk over the KV of everything before it, as a prefix-cache hit does.
CHUNKINGS = [[70], [5, 65], [33, 37], [16, 48, 6], [1, 68, 1], [69, 1]]


@pytest.mark.parametrize("page_size", [1, 16])
def test_batch_invariant_attention_is_bit_identical_across_chunkings(page_size: int) -> None:
    assert_bit_identical_across_chunkings(page_size)


@pytest.mark.skipif(DEVICE == "cuda", reason="the GPU's own MMA is the tile-row-dependent arithmetic")
@pytest.mark.parametrize("page_size", [1, 16])
def test_batch_invariance_holds_when_rounding_depends_on_the_tile_row(
    page_size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a GPU a dot's rounding may depend on a value's row in the tile; numpy's matmul, which
    Triton's interpreter runs, rounds every row alike, so a token that lands in another row
    under another chunking would still match here. This dot scales each row by a factor of its
    row index, so each token's output is bit-identical across chunkings only if it always
    takes the same row (query blocks aligned to absolute positions)."""
    from triton.runtime.interpreter import InterpreterBuilder, TensorHandle

    exact_dot = InterpreterBuilder.create_dot

    def row_dependent_dot(self: InterpreterBuilder, a, b, d, *args):  # type: ignore[no-untyped-def]
        out = exact_dot(self, a, b, d, *args)
        rows = out.data.shape[-2]
        scale = (1 + np.arange(rows, dtype=out.data.dtype) * 2.0**-10)[:, None]
        return TensorHandle((out.data * scale).astype(out.data.dtype), out.dtype)

    monkeypatch.setattr(InterpreterBuilder, "create_dot", row_dependent_dot)
    assert_bit_identical_across_chunkings(page_size, against_reference=False)


def assert_bit_identical_across_chunkings(page_size: int, against_reference: bool = True) -> None:
    """Every chunking of CHUNKINGS gives each query token the same bits as the whole prompt."""
    total = sum(CHUNKINGS[0])
    kv = logical_kv([total], NUM_KV_HEADS, HEAD_DIM, seed=3)
    whole = paged_batch([total], [total], page_size=page_size, group=4, kv=kv, seed=3)
    expected = paged_attention(*whole, batch_invariant=True)  # [total, Hq, D]
    if against_reference:
        torch.testing.assert_close(expected, paged_attention_reference(*whole), **TOLERANCE[torch.float32])
    for chunking in CHUNKINGS[1:]:
        start = 0
        for n in chunking:
            # Queries [start, start + n) over KV [0, start + n): the chunk after a cached prefix.
            step = paged_batch(
                [n],
                [start + n],
                page_size=page_size,
                group=4,
                kv=[(k[: start + n], v[: start + n]) for k, v in kv],
                seed=3,
            )._replace(q=whole.q[start : start + n])
            out = paged_attention(*step, batch_invariant=True)
            assert torch.equal(out, expected[start : start + n]), (
                f"chunking {chunking}: chunk at {start} differs"
            )
            start += n


def test_batch_invariant_output_ignores_the_rest_of_the_batch() -> None:
    q_lens, seq_lens = SCENARIOS["mixed"]
    kv = logical_kv(seq_lens, NUM_KV_HEADS, HEAD_DIM, seed=5)
    together = paged_batch(q_lens, seq_lens, page_size=16, group=4, kv=kv, seed=5)
    out = paged_attention(*together, batch_invariant=True)
    cu = together.cu_seqlens_q.tolist()
    for b in range(len(seq_lens)):
        alone = paged_batch([q_lens[b]], [seq_lens[b]], page_size=16, group=4, kv=[kv[b]], seed=5)
        alone = alone._replace(q=together.q[cu[b] : cu[b + 1]])
        assert torch.equal(paged_attention(*alone, batch_invariant=True), out[cu[b] : cu[b + 1]])
