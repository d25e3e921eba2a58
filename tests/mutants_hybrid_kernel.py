"""Mutants of the sliding-window kernel and of the model's hybrid mode (same shape as
tests/mutants.py: name -> (file, original text, mutated text)); ``SUITES`` must catch every one
of them (the kernel's in tests/test_kernel_window.py, the model's in tests/test_model_hybrid.py)."""

from __future__ import annotations

SUITES = ["tests/test_kernel_window.py", "tests/test_model_hybrid.py"]

MUTANTS: dict[str, tuple[str, str, str]] = {
    "kernel: window mask off by one (sees p - W too)": (
        "kernels/paged_attention.py",
        "visible = visible & (n[None, :] >= q_pos[:, None] - window + 1)",
        "visible = visible & (n[None, :] >= q_pos[:, None] - window)",
    ),
    "kernel: window walk skips one tile too many": (
        "kernels/paged_attention.py",
        "kv_start = tl.maximum(win_lo, 0) // BLOCK_N * BLOCK_N",
        "kv_start = (tl.maximum(win_lo, 0) // BLOCK_N + 1) * BLOCK_N",
    ),
    "kernel: the window's first tile loads the freed pages left of the window": (
        "kernels/paged_attention.py",
        "n_ok = n_ok & (n >= win_lo)",
        "n_ok = n_ok & (n >= 0)",
    ),
    "kernel: splits start at position 0, not at the window's first tile": (
        "kernels/paged_attention.py",
        "kv_lo = kv_start + split * split_len",
        "kv_lo = split * split_len",
    ),
    "model: a sliding-window layer attends fully": (
        "prefixcache/model.py",
        "batch_invariant=batch.invariant_attention, sliding_window=kv.sliding_window,",
        "batch_invariant=batch.invariant_attention, sliding_window=None,",
    ),
    "model: every layer reads the first group's page table": (
        "prefixcache/model.py",
        "x = layer(x, k_cache, v_cache, batch, batch.groups[g])",
        "x = layer(x, k_cache, v_cache, batch, batch.groups[0])",
    ),
    "model: groups of one pool get memory of their own": (
        "prefixcache/model.py",
        "tensors = shared.setdefault(group.pool, [])",
        "tensors = shared.setdefault(group.kind, [])",
    ),
}
