"""RadixKey: an edge label of the radix tree (SGLang's ``RadixKey``).

Token ids live in a compact int64 numpy array so that comparing two runs of tokens is one C
call over a slice, not a Python loop per token; slices are views, so walking a key costs no
copies. ``extra_key`` is the namespace (LoRA, cache salt): keys of different namespaces never
share a node.

EAGLE (SGLang's ``is_bigram``): an EAGLE draft model's KV at position i is computed from token
i + 1 as well, so SGLang keys its tree by bigrams (t[i], t[i+1]). A bigram key keeps the raw
tokens (N + 1 for N bigrams) and measures everything in bigrams: its length, slices (bigrams
[a, b) span raw tokens [a, b + 1), so neighbouring slices share one boundary token), matches,
child keys and page alignment; the KV slot of bigram i is the slot of token i.

``request_key``: a request's key, its multimodal spans replaced by values no token id reaches.
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable, Iterator, Sequence

import numpy as np
import numpy.typing as npt

from prefixcache.request import Request

TokenArray = npt.NDArray[np.int64]
SlotArray = npt.NDArray[np.int64]
ChildKey = Hashable

# Up to this many tokens, comparing raw bytes settles the common case (the whole overlap
# equal) fastest; past it, or once they differ, one elementwise compare finds the first
# difference (make bench: experiments/bench/radix_match.py).
_BYTES_COMPARE_MAX = 4096


def common_prefix_length(a: TokenArray, b: TokenArray) -> int:
    """How many leading tokens ``a`` and ``b`` share: at most two C-level passes over the
    overlap, whatever its length."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    x, y = a[:n], b[:n]
    if n <= _BYTES_COMPARE_MAX and x.tobytes() == y.tobytes():
        return n
    differs = x != y
    first = int(differs.argmax())
    return first if differs[first] else n


class RadixKey:
    __slots__ = ("token_ids", "extra_key", "is_bigram")

    def __init__(
        self,
        token_ids: Sequence[int] | TokenArray,
        extra_key: Hashable | None = None,
        is_bigram: bool = False,
    ) -> None:
        arr = token_ids if isinstance(token_ids, np.ndarray) else np.asarray(token_ids, dtype=np.int64)
        if arr.dtype != np.int64:
            arr = arr.astype(np.int64)
        if arr.ndim != 1:
            raise ValueError(f"token_ids must be one-dimensional, got shape {arr.shape}")
        if is_bigram and len(arr) == 1:
            raise ValueError("a bigram RadixKey needs 0 or at least 2 raw tokens, got 1")
        self.token_ids: TokenArray = arr  # raw tokens in both modes
        self.extra_key = extra_key
        self.is_bigram = is_bigram

    def __len__(self) -> int:
        """Tokens, or bigrams (raw tokens - 1) for a bigram key."""
        n = len(self.token_ids)
        return n - 1 if self.is_bigram and n else n

    def __iter__(self) -> Iterator[int] | Iterator[tuple[int, int]]:
        ids = self.token_ids.tolist()
        return zip(ids, ids[1:], strict=False) if self.is_bigram else iter(ids)

    def __getitem__(self, idx: int | slice) -> RadixKey:
        """A slice (step 1) or one token (bigram), as a RadixKey in the same namespace and
        mode (as SGLang)."""
        if type(idx) is slice and idx.step is None and not self.is_bigram:  # the tree walk's case
            return _view(self.token_ids[idx], self.extra_key)
        n = len(self)
        if isinstance(idx, slice):
            if idx.step not in (None, 1):
                raise ValueError(f"RadixKey slices must have step 1, got step {idx.step}")
            if not self.is_bigram:
                return RadixKey(self.token_ids[idx], self.extra_key)
            start, stop, _ = idx.indices(n)
        else:
            if not -n <= idx < n:
                raise IndexError(f"RadixKey index {idx} out of range for length {n}")
            start = idx % n
            stop = start + 1
        if not self.is_bigram:
            return RadixKey(self.token_ids[start:stop], self.extra_key)
        # bigrams [start, stop) span raw [start, stop + 1); an empty slice holds no raw token
        raw = self.token_ids[start : stop + 1] if stop > start else self.token_ids[:0]
        return RadixKey(raw, self.extra_key, is_bigram=True)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, RadixKey)
            and self.extra_key == other.extra_key
            and self.is_bigram == other.is_bigram
            and np.array_equal(self.token_ids, other.token_ids)
        )

    __hash__ = None  # type: ignore[assignment]  # mutable-looking array content: not a dict key

    def tolist(self) -> list[int]:
        """The raw token ids (a bigram key's N + 1 tokens for its N bigrams)."""
        return self.token_ids.tolist()  # type: ignore[no-any-return]

    def copy(self) -> RadixKey:
        """An own copy of the tokens (a view would keep a caller's whole array alive)."""
        return RadixKey(self.token_ids.copy(), self.extra_key, self.is_bigram)

    def maybe_to_bigram_view(
        self, is_eagle: bool, value: SlotArray | None = None
    ) -> tuple[RadixKey, SlotArray | None]:
        """SGLang's conversion at the tree's door: for an EAGLE tree, the bigram view of these
        raw tokens and ``value`` (per raw token) cut to one slot per bigram; otherwise both
        unchanged. Ours returns a new key where SGLang flips the caller's flag in place."""
        if not is_eagle or self.is_bigram:
            return self, value
        raw = self.token_ids if len(self.token_ids) != 1 else self.token_ids[:0]  # 1 token: 0 bigrams
        key = RadixKey(raw, self.extra_key, is_bigram=True)
        return key, (value[: len(key)] if value is not None else None)

    def page_aligned(self, page_size: int) -> RadixKey:
        """The key truncated to whole pages (``len // page * page`` tokens or bigrams); itself
        when it is whole pages already."""
        n = len(self)
        return self if n % page_size == 0 else self[: n // page_size * page_size]

    def match(self, other: RadixKey, page_size: int = 1) -> int:
        """Length of the common prefix with ``other``, rounded down to whole pages.

        One vectorised comparison of the overlap (``common_prefix_length``), never a Python
        step per token.
        """
        if self.extra_key != other.extra_key:
            raise ValueError(
                f"RadixKey.match across namespaces: extra_key={self.extra_key!r} != {other.extra_key!r}"
            )
        if self.is_bigram != other.is_bigram:
            raise ValueError("RadixKey.match of a bigram key with a plain one (is_bigram differs)")
        lo = common_prefix_length(self.token_ids, other.token_ids)
        if self.is_bigram:  # m equal raw tokens hold m - 1 equal bigrams
            lo = max(0, lo - 1)
        return lo // page_size * page_size

    def child_key(self, page_size: int = 1) -> ChildKey:
        """The dict key a parent files this edge under: first token, or first page as a tuple;
        ``(extra_key, plain)`` in a namespace, so namespaces get disjoint subtrees. A bigram
        key's first page of bigrams is its first page_size + 1 raw tokens (SGLang: as pairs)."""
        if len(self) == 0:
            raise ValueError("an empty RadixKey has no child key")
        ids = self.token_ids
        if self.is_bigram:
            plain: ChildKey = tuple(ids[: page_size + 1].tolist())
        else:
            plain = int(ids[0]) if page_size == 1 else tuple(ids[:page_size].tolist())
        return plain if self.extra_key is None else (self.extra_key, plain)

    def __repr__(self) -> str:
        preview = self.token_ids[:10].tolist()
        more = "..." if len(self) > 10 else ""
        bigram = ", is_bigram=True" if self.is_bigram else ""
        return f"RadixKey(extra_key={self.extra_key!r}, token_ids={preview}{more}, len={len(self)}{bigram})"


def _view(token_ids: TokenArray, extra_key: Hashable | None) -> RadixKey:
    """A plain key over ``token_ids``, a slice of a checked key's own array (so no check)."""
    key = object.__new__(RadixKey)
    key.token_ids, key.extra_key, key.is_bigram = token_ids, extra_key, False
    return key


# Multimodal placeholder tokens are replaced by values from here up, which no real token id
# reaches (SGLang likewise swaps an image's pad tokens for values derived from its hash).
MM_VALUE_BASE = 1 << 40
_MM_VALUE_SPAN = 1 << 61  # MM_VALUE_BASE + _MM_VALUE_SPAN < 2**63: fits int64


def extra_key(req: Request) -> Hashable | None:
    """SGLang's extra_key: the request's namespace (LoRA, salt), None when it has neither."""
    return None if req.namespace == (None, None) else req.namespace


def mm_values(identifier: str, length: int) -> TokenArray:
    """Key values for a multimodal span: one per position, from (identifier, position)."""
    h = int.from_bytes(hashlib.blake2b(identifier.encode(), digest_size=8).digest(), "little")
    return MM_VALUE_BASE + (h + np.arange(length, dtype=np.uint64)) % _MM_VALUE_SPAN  # type: ignore[return-value]


def _token_array(token_ids: object, req: Request) -> TokenArray:
    arr = np.asarray(token_ids, dtype=np.int64)
    if len(arr) and int(arr.max()) >= MM_VALUE_BASE:
        raise ValueError(f"token ids of {req.request_id!r} must be < 2**40 (multimodal values live above)")
    return arr


def request_key(req: Request, known: RadixKey | None = None) -> RadixKey:
    """RadixKey of all of ``req``'s tokens (multimodal spans substituted), in its namespace.

    Built from the request's int64 prompt array (kept on the request) and its output tokens.
    known: a key this function built of the request's first tokens (its whole prompt at
    least; tokens only grow): only the tokens after it are read and checked.
    """
    if known is not None and len(known) >= req.num_prompt_tokens:
        new = req.output_token_ids[len(known) - req.num_prompt_tokens :]
        if not new:
            return known
        return RadixKey(np.concatenate([known.token_ids, _token_array(new, req)]), known.extra_key)
    arr = _token_array(req.prompt_array, req)
    if req.mm_hashes:
        arr = arr.copy()  # the request's prompt array is read-only and stays unsubstituted
    for span in req.mm_hashes:
        arr[span.offset : span.offset + span.length] = mm_values(span.identifier, span.length)
    if req.num_output_tokens:
        arr = np.concatenate([arr, _token_array(req.output_token_ids, req)])
    return RadixKey(arr, extra_key(req))
