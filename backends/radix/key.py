"""RadixKey: an edge label of the radix tree (SGLang's ``RadixKey``).

Token ids live in a compact int64 numpy array so that comparing two runs of tokens is one C
call over a slice, not a Python loop per token; slices are views, so walking a key costs no
copies. ``extra_key`` is the namespace (LoRA, cache salt): keys of different namespaces never
share a node.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Sequence

import numpy as np
import numpy.typing as npt

TokenArray = npt.NDArray[np.int64]
ChildKey = Hashable

# Below this many tokens, comparing raw bytes beats np.array_equal's fixed call overhead (~1.5us);
# above it, array_equal avoids copying both slices.
_BYTES_COMPARE_MAX = 4096


def _same(x: TokenArray, y: TokenArray) -> bool:
    """Whether two equal-length token runs are equal: one C-level comparison, no Python loop."""
    if len(x) <= _BYTES_COMPARE_MAX:
        return x.tobytes() == y.tobytes()
    return bool(np.array_equal(x, y))


class RadixKey:
    __slots__ = ("token_ids", "extra_key")

    def __init__(self, token_ids: Sequence[int] | TokenArray, extra_key: Hashable | None = None) -> None:
        arr = token_ids if isinstance(token_ids, np.ndarray) else np.asarray(token_ids, dtype=np.int64)
        if arr.dtype != np.int64:
            arr = arr.astype(np.int64)
        if arr.ndim != 1:
            raise ValueError(f"token_ids must be one-dimensional, got shape {arr.shape}")
        self.token_ids: TokenArray = arr
        self.extra_key = extra_key

    def __len__(self) -> int:
        return len(self.token_ids)

    def __iter__(self) -> Iterator[int]:
        return iter(self.token_ids.tolist())

    def __getitem__(self, idx: int | slice) -> RadixKey:
        """A slice (step 1) or one token, as a RadixKey in the same namespace (as SGLang)."""
        if isinstance(idx, slice):
            if idx.step not in (None, 1):
                raise ValueError(f"RadixKey slices must have step 1, got step {idx.step}")
            return RadixKey(self.token_ids[idx], self.extra_key)
        n = len(self.token_ids)
        if not -n <= idx < n:
            raise IndexError(f"RadixKey index {idx} out of range for length {n}")
        i = idx % n
        return RadixKey(self.token_ids[i : i + 1], self.extra_key)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, RadixKey)
            and self.extra_key == other.extra_key
            and np.array_equal(self.token_ids, other.token_ids)
        )

    __hash__ = None  # type: ignore[assignment]  # mutable-looking array content: not a dict key

    def tolist(self) -> list[int]:
        return self.token_ids.tolist()  # type: ignore[no-any-return]

    def page_aligned(self, page_size: int) -> RadixKey:
        """The key truncated to whole pages (``len // page * page`` tokens)."""
        return self[: len(self) // page_size * page_size]

    def match(self, other: RadixKey, page_size: int = 1) -> int:
        """Length of the common prefix with ``other``, rounded down to whole pages.

        Galloping: compare windows of 1, 2, 4, 8 ... tokens, each as one slice comparison, then
        binary-search inside the first window that differs. About 2n tokens compared in the
        worst case and O(log n) numpy calls, never one Python step per token.
        """
        if self.extra_key != other.extra_key:
            raise ValueError(
                f"RadixKey.match across namespaces: extra_key={self.extra_key!r} != {other.extra_key!r}"
            )
        a, b = self.token_ids, other.token_ids
        n = min(len(a), len(b))
        lo, width = 0, 1  # invariant: a[:lo] == b[:lo]
        while lo < n:
            hi = min(lo + width, n)
            if not _same(a[lo:hi], b[lo:hi]):
                # the first difference lies in [lo, hi): halve until one token is left
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    if _same(a[lo:mid], b[lo:mid]):
                        lo = mid
                    else:
                        hi = mid
                break
            lo, width = hi, width * 2
        return lo // page_size * page_size

    def child_key(self, page_size: int = 1) -> ChildKey:
        """The dict key a parent files this edge under: first token, or first page as a tuple;
        ``(extra_key, plain)`` in a namespace, so namespaces get disjoint subtrees."""
        if len(self.token_ids) == 0:
            raise ValueError("an empty RadixKey has no child key")
        ids = self.token_ids
        plain: ChildKey = int(ids[0]) if page_size == 1 else tuple(ids[:page_size].tolist())
        return plain if self.extra_key is None else (self.extra_key, plain)

    def __repr__(self) -> str:
        preview = self.token_ids[:10].tolist()
        more = "..." if len(self) > 10 else ""
        return f"RadixKey(extra_key={self.extra_key!r}, token_ids={preview}{more}, len={len(self)})"
