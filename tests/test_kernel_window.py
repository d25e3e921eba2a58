"""Sliding-window attention in the Triton paged-attention kernel, against its PyTorch reference.

The window follows vLLM 0.33.0's meaning (``TritonAttentionImpl`` turns ``sliding_window=W``
into ``window_size=(W - 1, 0)``, and ``kernel_unified_attention`` keeps a key when
``q_pos - k_pos < W``): a query at position p sees the keys at p - W + 1 .. p.

Every batch is built the way a sliding-window KV group hands it to the model: the page-table
entries of pages that lie wholly left of a sequence's first window are 0, the null page, and
page 0 and every page nobody wrote hold NaN. A kernel that reads a page left of the window,
or a slot past a sequence's length, turns its output NaN.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from prefixcache.kernels.paged_attention import (
    BLOCK_N,
    MAX_KV_SPLITS,
    MIN_TILES_PER_SPLIT,
    choose_num_kv_splits,
    paged_attention,
    store_kv,
)
from prefixcache.kernels.reference import end_aligned_causal_mask, paged_attention_reference

from tests.test_kernel import DEVICE, NUM_KV_HEADS, TOLERANCE, Batch  # the kernel tests' own

pytestmark = pytest.mark.kernel

HEAD_DIM = 16  # smaller than the kernel tests' 32: these contexts are longer

# (q_len per sequence, seq_len per sequence): the new tokens are the last q_len of seq_len.
# Contexts reach past two KV tiles (BLOCK_N = 64) so that windows skip whole tiles.
SCENARIOS = {
    "decode": ([1, 1, 1], [1, 70, 200]),
    "extend": ([7, 20], [100, 150]),  # over cached prefixes of 93 and 130 tokens
    "prefill": ([9, 80], [9, 80]),
    "mixed": ([1, 12, 40, 1], [140, 12, 110, 5]),
}
# Windows of 1 (itself only), 5 (less than a page of 16), 16 (a page), 37 (not a multiple of
# the page nor of the tile) and 1000 (more than any context: full attention). A window of one
# tile (64) is in the page-size test below.
WINDOWS = [1, 5, 16, 37, 1000]


def first_visible(q_len: int, seq_len: int, window: int) -> int:
    """The first KV position any new query of the sequence sees (its first query's window)."""
    return max(0, seq_len - q_len - window + 1)


def windowed_batch(
    q_lens: list[int],
    seq_lens: list[int],
    window: int,
    *,
    page_size: int,
    group: int = 4,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    free_left_pages: bool = True,
) -> Batch:
    """Each sequence's KV in shuffled pages of a NaN pool; with ``free_left_pages`` the pages
    wholly left of its first window are freed as a sliding-window group frees them: their
    table entry becomes 0 and the page itself is overwritten with NaN (reused, garbage)."""
    g = torch.Generator().manual_seed(seed)
    cu = torch.tensor([0, *q_lens], dtype=torch.int32).cumsum(0, dtype=torch.int32)  # [B + 1]
    q = torch.randn(int(cu[-1]), NUM_KV_HEADS * group, HEAD_DIM, generator=g).to(dtype)  # [T, Hq, D]
    pages_per_seq = [-(-n // page_size) for n in seq_lens]
    num_pages = sum(pages_per_seq) + 4  # page 0 plus a few that nobody writes (NaN)
    max_pages = max(pages_per_seq) + 1  # a padding column
    order = (torch.randperm(num_pages - 1, generator=g) + 1).tolist()  # page 0 stays the null page
    shape = (num_pages, page_size, NUM_KV_HEADS, HEAD_DIM)
    k_cache = torch.full(shape, float("nan"), dtype=dtype, device=DEVICE)
    v_cache = torch.full_like(k_cache, float("nan"))
    page_table = torch.zeros(len(seq_lens), max_pages, dtype=torch.int32)
    for b, (n_pages, q_len, n) in enumerate(zip(pages_per_seq, q_lens, seq_lens, strict=True)):
        pages, order = order[:n_pages], order[n_pages:]
        slots = torch.tensor([pages[t // page_size] * page_size + t % page_size for t in range(n)])
        k = torch.randn(n, NUM_KV_HEADS, HEAD_DIM, generator=g).to(dtype)
        v = torch.randn(n, NUM_KV_HEADS, HEAD_DIM, generator=g).to(dtype)
        store_kv(k.to(DEVICE), v.to(DEVICE), k_cache, v_cache, slots.to(DEVICE))
        page_table[b, :n_pages] = torch.tensor(pages, dtype=torch.int32)
        if free_left_pages:
            # [0, freed)  pages wholly left of the first query's window: null in the table
            freed = first_visible(q_len, n, window) // page_size
            k_cache[pages[:freed]] = float("nan")
            v_cache[pages[:freed]] = float("nan")
            page_table[b, :freed] = 0
    return Batch(
        q.to(DEVICE),
        k_cache,
        v_cache,
        page_table.to(DEVICE),
        cu.to(DEVICE),
        torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE),
    )


def assert_window_matches_reference(batch: Batch, window: int, **kwargs: object) -> torch.Tensor:
    out = paged_attention(*batch, sliding_window=window, **kwargs)  # [T, Hq, D]
    ref = paged_attention_reference(*batch, sliding_window=window)  # [T, Hq, D]
    assert out.shape == batch.q.shape and out.dtype == batch.q.dtype
    assert torch.isfinite(ref).all(), "the reference read a freed page: the test setup is wrong"
    assert torch.isfinite(out).all(), "NaN in the output: the kernel read a page left of the window"
    torch.testing.assert_close(out, ref, **TOLERANCE[batch.q.dtype])
    return out


# %%
# The mask itself (the oracle's, so that kernel and reference cannot share an off-by-one)
# ---------------------------------------------------------------------------------------


def test_reference_window_is_vllms_p_minus_w_plus_1_to_p() -> None:
    # Queries at positions 3, 4, 5 of 6, window 2: each sees itself and the one before.
    mask = end_aligned_causal_mask(q_len=3, kv_len=6, sliding_window=2)
    assert mask.int().tolist() == [
        [0, 0, 1, 1, 0, 0],
        [0, 0, 0, 1, 1, 0],
        [0, 0, 0, 0, 1, 1],
    ]
    assert end_aligned_causal_mask(2, 4, sliding_window=1).int().tolist() == [[0, 0, 1, 0], [0, 0, 0, 1]]
    assert torch.equal(end_aligned_causal_mask(3, 6, sliding_window=6), end_aligned_causal_mask(3, 6))


# %%
# Kernel against reference
# ------------------------


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_window_matches_reference(scenario: str, window: int) -> None:
    q_lens, seq_lens = SCENARIOS[scenario]
    assert_window_matches_reference(windowed_batch(q_lens, seq_lens, window, page_size=16), window)


@pytest.mark.parametrize(
    ("page_size", "window", "group"),
    [(1, 1, 1), (1, 37, 8), (64, 5, 4), (64, 64, 1), (64, 100, 8)],
)
def test_window_matches_reference_for_page_sizes_and_gqa(page_size: int, window: int, group: int) -> None:
    q_lens, seq_lens = SCENARIOS["mixed"]
    batch = windowed_batch(q_lens, seq_lens, window, page_size=page_size, group=group)
    assert_window_matches_reference(batch, window)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_window_in_half_precision(dtype: torch.dtype) -> None:
    q_lens, seq_lens = SCENARIOS["mixed"]
    assert_window_matches_reference(windowed_batch(q_lens, seq_lens, 37, page_size=16, dtype=dtype), 37)


def test_window_longer_than_the_context_is_full_attention_bit_for_bit() -> None:
    q_lens, seq_lens = SCENARIOS["mixed"]
    batch = windowed_batch(q_lens, seq_lens, max(seq_lens), page_size=16)
    assert torch.equal(paged_attention(*batch, sliding_window=max(seq_lens)), paged_attention(*batch))


def test_window_changes_the_output() -> None:
    """Not vacuous: the window's mask matters (a kernel ignoring it would fail the above only
    through the NaN of freed pages; here no page is freed)."""
    q_lens, seq_lens = SCENARIOS["extend"]
    batch = windowed_batch(q_lens, seq_lens, 37, page_size=16, free_left_pages=False)
    windowed = paged_attention(*batch, sliding_window=37)
    assert (windowed - paged_attention(*batch)).abs().max() > 1e-2
    torch.testing.assert_close(windowed, paged_attention_reference(*batch, sliding_window=37),
                               **TOLERANCE[torch.float32])  # fmt: skip


@pytest.mark.parametrize("garbage", [float("nan"), float("inf")])
def test_pages_left_of_the_window_are_never_read(garbage: float) -> None:
    """Whatever the null page and the freed pages hold, the output is the same bits."""
    q_lens, seq_lens = SCENARIOS["extend"]
    batch = windowed_batch(q_lens, seq_lens, 21, page_size=16)
    expected = paged_attention(*batch, sliding_window=21)
    assert torch.isfinite(expected).all()
    used = {int(p) for b in range(len(seq_lens)) for p in batch.page_table[b] if int(p) != 0}
    unread = [p for p in range(batch.k_cache.shape[0]) if p not in used]  # page 0, freed, unused
    assert 0 in unread and len(unread) > 8, "the batch should free some pages"
    k_cache, v_cache = batch.k_cache.clone(), batch.v_cache.clone()
    k_cache[unread] = garbage
    v_cache[unread] = -garbage
    out = paged_attention(*batch._replace(k_cache=k_cache, v_cache=v_cache), sliding_window=21)
    assert torch.equal(out, expected)


# %%
# Split-KV decode with a window
# -----------------------------
# Long contexts behind small windows: the splits divide the window's tiles only, so a walk
# that started at position 0 instead of the window's tile would miss the window altogether.
WINDOW_DECODE = ([1, 1, 1, 1], [1, 70, 300, 129])


@pytest.mark.parametrize(("num_kv_splits", "window"), [(2, 8), (5, 37), (5, 300)])
def test_split_kv_decode_with_window_matches_reference(num_kv_splits: int, window: int) -> None:
    q_lens, seq_lens = WINDOW_DECODE
    batch = windowed_batch(q_lens, seq_lens, window, page_size=16, group=4)
    assert_window_matches_reference(batch, window, num_kv_splits=num_kv_splits)


def test_split_kv_with_window_in_a_mixed_batch() -> None:
    """Splits are not only for decode: an extend block's range is split too."""
    q_lens, seq_lens = [1, 6, 1], [140, 100, 5]
    assert_window_matches_reference(windowed_batch(q_lens, seq_lens, 37, page_size=16), 37, num_kv_splits=3)


def test_split_heuristic_counts_only_the_window_tiles() -> None:
    sms = 132  # an H100/H200
    long = 128 * 1024
    # A 128-token window is at most 4 tiles wide whatever the context: never worth a split.
    assert choose_num_kv_splits(1, 8, 1, long, sms, sliding_window=128) == 1
    assert choose_num_kv_splits(1, 8, 1, long, sms) == min(MAX_KV_SPLITS, -(-2 * sms // 8))
    # A 4096-token window: its tiles (plus the partial first one) bound the splits.
    tiles_of_window = -(-(4096 + BLOCK_N - 1) // (BLOCK_N * MIN_TILES_PER_SPLIT))
    assert choose_num_kv_splits(1, 8, 1, long, sms, sliding_window=4096) == tiles_of_window
    # A window wider than the context changes nothing.
    unwindowed = choose_num_kv_splits(1, 8, 1, 2048, sms)
    assert choose_num_kv_splits(1, 8, 1, 2048, sms, sliding_window=1 << 20) == unwindowed


# %%
# Batch invariance with a window
# ------------------------------
CHUNKINGS = [[100], [37, 1, 50, 12], [99, 1]]


@pytest.mark.parametrize(("page_size", "window"), [(1, 37), (16, 64)])
def test_batch_invariant_window_is_bit_identical_across_chunkings(page_size: int, window: int) -> None:
    """A chunk after a cached (and partly freed) prefix gives the bits of one whole prefill."""
    total = sum(CHUNKINGS[0])
    whole = windowed_batch([total], [total], window, page_size=page_size, seed=3)
    expected = paged_attention(*whole, batch_invariant=True, sliding_window=window)  # [total, Hq, D]
    torch.testing.assert_close(expected, paged_attention_reference(*whole, sliding_window=window),
                               **TOLERANCE[torch.float32])  # fmt: skip
    for chunking in CHUNKINGS[1:]:
        start = 0
        for n in chunking:
            # Queries [start, start + n) over KV [0, start + n), pages left of the window freed.
            table = whole.page_table.clone()
            table[0, : first_visible(n, start + n, window) // page_size] = 0
            step = whole._replace(
                q=whole.q[start : start + n],
                page_table=table,
                cu_seqlens_q=torch.tensor([0, n], dtype=torch.int32, device=DEVICE),
                seq_lens=torch.tensor([start + n], dtype=torch.int32, device=DEVICE),
            )
            out = paged_attention(*step, batch_invariant=True, sliding_window=window)
            assert torch.equal(out, expected[start : start + n]), (
                f"chunking {chunking}: chunk at {start} differs"
            )
            start += n


# %%
# Bad input
# ---------


@pytest.mark.parametrize("window", [0, -3, 2.5, True, "16"])
def test_bad_window_is_a_clear_error(window: object) -> None:
    batch = windowed_batch([2], [6], 4, page_size=4)
    for attention in (paged_attention, paged_attention_reference):
        with pytest.raises(ValueError, match="sliding_window"):
            attention(*batch, sliding_window=window)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sliding_window"):
        choose_num_kv_splits(1, 1, 1, 100, 1, sliding_window=window)  # type: ignore[arg-type]


VLLM_WINDOW = Path(__file__).parent / "fixtures" / "upstream" / "kernel" / "vllm_window.pt"


@pytest.mark.parametrize("page_size, window", [(16, 5), (16, 37), (32, 16), (32, 1000)])
def test_window_matches_vllms_own_unified_attention_kernel(page_size: int, window: int) -> None:
    """Outputs recorded from vLLM 0.33's Triton ``unified_attention`` (interpreter, CPU) by
    experiments/upstream/vllm_window_driver.py, on the same seeded inputs: our kernel and our
    reference give them (stored as fp16), and a window one token wider does not."""
    from prefixcache.experiments.upstream.window_cases import build

    recorded = torch.load(VLLM_WINDOW)
    assert recorded["vllm"] == "0.33.0"
    want = recorded["outputs"][f"{page_size}-{window}"].float()
    x = build(page_size, window)
    args = (x["q"], x["k"], x["v"], x["page_table"], x["cu_seqlens_q"], x["seq_lens"])
    assert torch.isfinite(want).all()
    for attend in (paged_attention, paged_attention_reference):
        assert (attend(*args, sliding_window=window) - want).abs().max() < 2e-3
    if window < max(x["seq_lens"].tolist()):
        wider = paged_attention_reference(*args, sliding_window=window + 1)
        assert (wider - want).abs().max() > 0.05
