"""Mutants of the hashchain backend's hybrid path (vLLM 0.33.0), in the shape of tests/mutants.py:
name -> (file, original text, mutated text), each original text occurring exactly once, and
the suites that must catch every one of them (``HYPOTHESIS_PROFILE=ci``)."""

from __future__ import annotations

SUITES = [
    "tests/test_hashchain_hybrid.py",
    "tests/test_hashchain_hybrid_fixtures.py",
    "tests/test_stateful_hybrid_hashchain.py",
    "tests/test_hashchain_hybrid_eagle.py",
]

_SW = "backends/hashchain/single_type_kv_cache_manager.py"
_COORD = "backends/hashchain/kv_cache_coordinator.py"
_MAMBA = "backends/hashchain/mamba_manager.py"
_FULL = _SW  # FullAttentionManager lives beside SlidingWindowManager

MUTANTS: dict[str, tuple[str, str, str]] = {
    # SlidingWindowManager scans left to right: it stops at the leftmost run, not the longest hit.
    "hashchain hybrid: SWA scan from the left": (
        _SW,
        "for i in range(max_num_blocks - 1, -1, -1):  # rightmost run first: the longest hit",
        "for i in range(max_num_blocks):  # rightmost run first: the longest hit",
    ),
    # remove_skipped_blocks frees the out-of-window blocks leftmost first (vLLM: rightmost).
    "hashchain hybrid: remove_skipped frees in ascending order": (
        _SW,
        "        self.block_pool.free_blocks(skipped)\n",
        "        self.block_pool.free_blocks(reversed(skipped))\n",
    ),
    # remove_skipped_blocks keeps one block too many out of the window (off by one).
    "hashchain hybrid: remove_skipped keeps one block too many": (
        _SW,
        "        end = min(num_skipped, len(blocks))\n",
        "        end = min(num_skipped - 1, len(blocks))\n",
    ),
    # A window hit needs one block fewer than cdiv(window - 1, block_size).
    "hashchain hybrid: SWA run one block short": (
        _SW,
        "self.contiguous_blocks = -(-(self.sliding_window - 1) // block_size)",
        "self.contiguous_blocks = max(1, -(-(self.sliding_window - 1) // block_size) - 1)",
    ),
    # Sparse retention hashes the tail one block past the replay boundary.
    "hashchain hybrid: retention tail off by one": (
        _SW,
        "end = boundary // self.block_size  # the tail [end - need, end) ends on the boundary",
        "end = boundary // self.block_size + 1  # the tail [end - need, end) ends on the boundary",
    ),
    # Retention ignored: every sliding-window block hashed (dense) whatever the interval.
    "hashchain hybrid: retention ignored": (
        _SW,
        "        if retention_interval is None:\n            return None\n        mask =",
        "        if True:\n            return None\n        mask =",
    ),
    # The fixed point stops after the first group instead of taking every group's answer.
    "hashchain hybrid: fixed point takes the first group only": (
        _COORD,
        "                longest = max(longest, curr)\n",
        "                longest = max(longest, curr)\n                break\n",
    ),
    # A Mamba hit claims a length off the checkpoint its state block was written at.
    "hashchain hybrid: Mamba state hit off the checkpoint": (
        _MAMBA,
        "return [[self.null_block] * i + [block] for block in cached], (i + 1) * self.block_size",
        "return [[self.null_block] * i + [block] for block in cached], i * self.block_size",
    ),
    # Old Mamba states are never freed (vLLM frees them once a newer state is computed).
    "hashchain hybrid: Mamba keeps every old state": (
        _MAMBA,
        "        self.block_pool.free_blocks(freed)\n",
        "        self.block_pool.free_blocks([])\n",
    ),
    # A chunk crossing several boundaries gets a block per boundary instead of nulls.
    "hashchain hybrid: Mamba state block per boundary": (
        _MAMBA,
        "        blocks.extend([self.null_block] * (num_required - 1 - len(blocks)))\n",
        "",
    ),
    # EAGLE (use_eagle=True, vLLM 0.33): the full-attention hit keeps its last block.
    "hashchain EAGLE: full-attention block not dropped": (
        _FULL,
        "num_blocks -= 1  # vLLM 0.33: the whole block, however short the lookup limit",
        "num_blocks -= 0  # vLLM 0.33: the whole block, however short the lookup limit",
    ),
    # EAGLE: a sliding-window run needs cdiv(window - 1, B) blocks, without the +1.
    "hashchain EAGLE: SWA need without the +1": (
        _SW,
        "need = self.contiguous_blocks + 1 if drop_eagle_block else self.contiguous_blocks",
        "need = self.contiguous_blocks",
    ),
    # EAGLE: the sliding-window hit keeps its last block.
    "hashchain EAGLE: SWA block not dropped": (
        _SW,
        "        if drop_eagle_block and computed[0]:\n",
        "        if False and computed[0]:\n",
    ),
    # EAGLE: the hybrid lookup does not look one block past the candidate length.
    "hashchain EAGLE: no one-block margin": (
        _COORD,
        "limit = min(curr + self.block_size, max_eagle_length) if drop else curr",
        "limit = curr",
    ),
    # EAGLE: sparse retention keeps the tail ending on the boundary, not one block past it.
    "hashchain EAGLE: retention tail not shifted": (
        _SW,
        "            end += shift  # EAGLE: ... on the block past it\n",
        "",
    ),
    # EAGLE: the replay boundaries are prompt - 1 as without EAGLE.
    "hashchain EAGLE: replay boundaries without EAGLE": (
        _COORD,
        "    if not use_eagle:\n        return [num_prompt_tokens - 1]\n",
        "    if True:\n        return [num_prompt_tokens - 1]\n",
    ),
    # EAGLE: a revalidated unitary match keeps the block the lookup dropped.
    "hashchain EAGLE: revalidation keeps the dropped block": (
        _COORD,
        "        if self.use_eagle and blocks:\n",
        "        if False and blocks:\n",
    ),
    # EAGLE: a sibling diverging right after the junction hits one block lower; sparse
    # retention no longer keeps that tail.
    "hashchain EAGLE: junction without the block below": (
        _COORD,
        "            if self.use_eagle:\n"
        "                boundaries.append(shared_prefix_boundary - self.block_size)\n",
        "            if False:\n"
        "                boundaries.append(shared_prefix_boundary - self.block_size)\n",
    ),
    # EAGLE: a group drops on every pass, not once per candidate length (issue #32802).
    "hashchain EAGLE: drop on every pass": (
        _COORD,
        "drop = self.use_eagle and idx not in eagle_verified",
        "drop = self.use_eagle",
    ),
    # EAGLE: a shrink without a drop leaves earlier drops verified.
    "hashchain EAGLE: verified drops never reset": (
        _COORD,
        "                elif found < curr:\n                    eagle_verified.clear()\n",
        "                elif False:\n                    eagle_verified.clear()\n",
    ),
    # EAGLE: segment tails of a positive retention interval are not shifted by the peek block.
    "hashchain EAGLE: segment tails not shifted": (
        _SW,
        "if (i - shift) % per_segment >= per_segment - need:",
        "if i % per_segment >= per_segment - need:",
    ),
}
