"""A request as every backend sees it: tokens (prompt, then appended output) and namespaces."""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt


class MultiModalSpan(NamedTuple):
    """A multimodal item occupying ``length`` placeholder tokens from ``offset`` in the prompt.

    ``identifier`` is the item's content hash: equal placeholder tokens of different images must
    not share KV, so both backends fold it into their keys.
    """

    identifier: str
    offset: int
    length: int


def _check_token_ids(token_ids: Iterable[object], what: str) -> list[int]:
    """``token_ids`` as a list of non-negative Python ints; ValueError naming the first bad one.

    The common inputs are checked without a Python step per token: an integer numpy array by
    its dtype and minimum, a list or tuple by the set of its element types (exact ``int`` only,
    so a bool, which is an int subclass, takes the slow path and is refused there).
    """
    if isinstance(token_ids, np.ndarray):
        fast = token_ids.ndim == 1 and token_ids.dtype.kind in "iu"
        if fast and (token_ids.size == 0 or token_ids.min() >= 0):
            return token_ids.tolist()  # type: ignore[no-any-return]
    elif isinstance(token_ids, (list, tuple)):
        fast = set(map(type, token_ids)) <= {int}
        if fast and (not token_ids or min(token_ids) >= 0):
            return list(token_ids)
    return _check_token_ids_slowly(token_ids, what)


_PACK_CHUNK = 4096  # ids per struct call: its argument tuple stays in cache
_pack_chunk_into = struct.Struct(f"={_PACK_CHUNK}q").pack_into  # native order, as np.int64


def _int64_array(token_ids: Sequence[int]) -> npt.NDArray[np.int64]:
    """Checked token ids (Python ints in int64's range) as a read-only int64 array, written by
    ``struct`` in chunks: C with no numpy scalar per id, 1.8x ``np.fromiter``'s speed on a
    14,000-token prompt (tests/bench/test_bench_request.py)."""
    n = len(token_ids)
    out = np.empty(n, dtype=np.int64)
    view = out.data.cast("B")
    full = n - n % _PACK_CHUNK
    for i in range(0, full, _PACK_CHUNK):
        _pack_chunk_into(view, 8 * i, *token_ids[i : i + _PACK_CHUNK])
    if full < n:
        struct.pack_into(f"={n - full}q", view, 8 * full, *token_ids[full:])
    out.flags.writeable = False
    return out


def _check_token_ids_slowly(token_ids: Iterable[object], what: str) -> list[int]:
    out: list[int] = []
    for i, t in enumerate(token_ids):
        # numpy integers are accepted; bools and floats are not token ids.
        if isinstance(t, bool) or not hasattr(t, "__index__"):
            raise ValueError(f"{what}[{i}] = {t!r} is not an integer token id")
        t = int(t)  # type: ignore[call-overload]
        if t < 0:
            raise ValueError(f"{what}[{i}] = {t} is negative; token ids are >= 0")
        out.append(t)
    return out


class Request:
    """One request's tokens and cache namespace.

    Tokens are append-only: the prompt is fixed at creation and output tokens are appended
    (``append_output_token_ids``). That is what makes vLLM's incremental block hashes valid
    forever: a full block never changes once its tokens exist.

    ``num_computed_tokens`` is the number of leading tokens whose KV is in the cache. The first
    successful ``PrefixCache.allocate`` sets it to the hit; the engine advances it after the
    model wrote new KV and resets it to 0 on preemption (as vLLM's scheduler does).
    """

    __slots__ = (
        "request_id",
        "lora_name",
        "cache_salt",
        "mm_hashes",
        "num_computed_tokens",
        "num_preemptions",
        "arrival_time",
        "max_new_tokens",
        "_all_token_ids",
        "_early_output",
        "_prompt_array",
        "_prompt_tuple",
        "_num_prompt_tokens",
        "_make_prompt",
        "_make_range",
        "planned_output_ids",
        "__weakref__",  # a backend may key its own per-request memo on the request, weakly
    )

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int] | npt.NDArray[np.integer],
        *,
        lora_name: str | None = None,
        cache_salt: str | None = None,
        mm_hashes: Iterable[tuple[str, int, int]] = (),
        arrival_time: float = 0.0,
        max_new_tokens: int = 0,
        planned_output_ids: Sequence[int] | None = None,
        num_deferred_tokens: int = 0,
    ) -> None:
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request_id must be a non-empty str, got {request_id!r}")
        self.request_id = request_id
        self._make_prompt: Callable[[], Sequence[int] | npt.NDArray[np.integer]] | None = None
        self._make_range: Callable[[int, int], Sequence[int] | npt.NDArray[np.integer]] | None = None
        # Output tokens appended while the token list is not built (a deferred prompt, or one
        # kept as an array only): they join the list when it is built (``_tokens``).
        self._early_output: list[int] = []
        if callable(prompt_token_ids):  # deferred (see ``deferred``): only its length now
            self._make_prompt = prompt_token_ids
            num_prompt_tokens = num_deferred_tokens
            self._all_token_ids: list[int] | None = None
            self._prompt_array: npt.NDArray[np.int64] | None = None
        else:
            num_prompt_tokens = self._set_prompt(prompt_token_ids)
        if type(num_prompt_tokens) is not int or num_prompt_tokens < 1:
            raise ValueError(f"request {request_id!r} has an empty prompt")
        self._num_prompt_tokens = num_prompt_tokens
        self._prompt_tuple: tuple[int, ...] | None = None
        for name, value in (("lora_name", lora_name), ("cache_salt", cache_salt)):
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"{name} must be None or a non-empty str, got {value!r}")
        spans = tuple(MultiModalSpan(*s) for s in mm_hashes)
        for s in sorted(spans, key=lambda s: s.offset):
            if s.offset < 0 or s.length <= 0 or s.offset + s.length > num_prompt_tokens:
                raise ValueError(f"multimodal span {s} does not fit in the {num_prompt_tokens}-token prompt")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
        self.lora_name = lora_name
        self.cache_salt = cache_salt
        self.mm_hashes: tuple[MultiModalSpan, ...] = tuple(sorted(spans, key=lambda s: s.offset))
        self.num_computed_tokens = 0
        self.num_preemptions = 0
        self.arrival_time = float(arrival_time)
        self.max_new_tokens = max_new_tokens
        # The output a workload planned (so that the next turn of a conversation repeats it);
        # the engine emits these tokens instead of simulated ones. None: nothing planned.
        self.planned_output_ids: tuple[int, ...] | None = (
            None
            if planned_output_ids is None
            else tuple(_check_token_ids(planned_output_ids, "planned_output_ids"))
        )

    @classmethod
    def deferred(
        cls,
        request_id: str,
        num_prompt_tokens: int,
        make_prompt: Callable[[], Sequence[int] | npt.NDArray[np.integer]],
        make_range: Callable[[int, int], Sequence[int] | npt.NDArray[np.integer]] | None = None,
        **kwargs: Any,
    ) -> Request:
        """A request whose prompt ``make_prompt()`` builds on first use of its tokens: a trace
        run keeps thousands of requests waiting, and only those a cache looks at need their
        tokens (checked then, and against ``num_prompt_tokens``). ``make_range(start, end)``,
        if given, makes the prompt's tokens [start, end) alone, so that reading a few of them
        (``token_ids``: a hasher's block across the prompt's end) does not build it all."""
        req = cls(request_id, make_prompt, num_deferred_tokens=num_prompt_tokens, **kwargs)  # type: ignore[arg-type]
        req._make_range = make_range
        return req

    def _set_prompt(self, prompt_token_ids: Sequence[int] | npt.NDArray[np.integer]) -> int:
        tokens = _check_token_ids(prompt_token_ids, "prompt_token_ids")
        self._all_token_ids = tokens
        # Kept when the caller already had the prompt as an array (a trace reader does), so a
        # backend wanting one (radix keys) does not convert the list back token by token.
        self._prompt_array = None
        if isinstance(prompt_token_ids, np.ndarray) and prompt_token_ids.dtype == np.int64:
            arr = prompt_token_ids.astype(np.int64)  # a copy of ours: the caller may mutate theirs
            arr.flags.writeable = False
            self._prompt_array = arr
        return len(tokens)

    def _build_prompt(self) -> None:
        """Build a deferred prompt: as its int64 array alone when it comes as one (a trace's:
        a backend reading arrays, and a run that reads no tokens, never pay for a Python list),
        else as the token list."""
        assert self._make_prompt is not None
        prompt = self._make_prompt()
        if isinstance(prompt, np.ndarray) and prompt.dtype == np.int64 and prompt.ndim == 1:
            if prompt.size and prompt.min() < 0:
                _check_token_ids_slowly(prompt, "prompt_token_ids")  # names the first bad id
            arr = prompt.astype(np.int64)  # a copy of ours: the maker may mutate its own
            arr.flags.writeable = False
            self._prompt_array, n = arr, len(arr)
        else:
            n = self._set_prompt(prompt)
        if n != self._num_prompt_tokens:
            self._all_token_ids = self._prompt_array = None
            raise ValueError(
                f"request {self.request_id!r}: its deferred prompt has {n} tokens, "
                f"{self._num_prompt_tokens} were announced"
            )
        self._make_prompt = self._make_range = None
        if self._all_token_ids is not None:
            self._join_early_output(self._all_token_ids)

    def _join_early_output(self, tokens: list[int]) -> None:
        tokens.extend(self._early_output)
        self._early_output = []

    def _tokens(self) -> list[int]:
        """The token list (prompt, then output), built on first use."""
        tokens = self._all_token_ids
        if tokens is None:
            if self._make_prompt is not None:
                self._build_prompt()
            tokens = self._all_token_ids
            if tokens is None:  # the prompt is an array alone so far
                assert self._prompt_array is not None
                tokens = self._all_token_ids = self._prompt_array.tolist()
                self._join_early_output(tokens)
        return tokens

    @property
    def all_token_ids(self) -> Sequence[int]:
        """Prompt then output tokens. Read-only view: append through the method below."""
        return self._tokens()

    def token_ids(self, start: int, end: int) -> list[int]:
        """``list(all_token_ids[start:end])`` (0 <= start), without building the whole token
        list while the prompt is an array alone: a hasher of decode blocks reads a few tokens
        past the prompt, and a list of a long prompt costs more than every block it hashes."""
        p = self._num_prompt_tokens
        in_prompt = start < min(end, p)
        if in_prompt and self._make_prompt is not None:  # (outputs alone need no prompt)
            if self._make_range is not None:  # the range alone, the prompt still unbuilt
                made = _check_token_ids(self._make_range(start, min(end, p)), "prompt_token_ids")
                return made + self._early_output[: end - p] if end > p else made
            self._build_prompt()  # (kept as an array when it comes as one)
        tokens = self._all_token_ids
        if tokens is not None:
            return tokens[start:end]
        out: list[int] = []  # no list yet: the outputs wait beside the prompt
        if in_prompt:
            assert self._prompt_array is not None
            out = self._prompt_array[start:end].tolist()
        if end > p:
            out += self._early_output[max(start - p, 0) : end - p]
        return out

    @property
    def prompt_token_ids(self) -> tuple[int, ...]:
        if self._prompt_tuple is None:
            self._prompt_tuple = tuple(self._tokens()[: self._num_prompt_tokens])
        return self._prompt_tuple

    @property
    def prompt_array(self) -> npt.NDArray[np.int64]:
        """The prompt as a read-only int64 array (built once, on first use)."""
        if self._make_prompt is not None:
            self._build_prompt()  # (a trace's prompt comes as the array: kept)
        if self._prompt_array is None:
            tokens = self._tokens()
            try:
                self._prompt_array = _int64_array(
                    tokens if len(tokens) == self._num_prompt_tokens else tokens[: self._num_prompt_tokens]
                )
            except struct.error:
                raise ValueError(
                    f"request {self.request_id!r}: a prompt token id is past int64 "
                    f"(max {max(tokens[: self._num_prompt_tokens])}); it has no int64 array"
                ) from None
        return self._prompt_array

    @property
    def namespace(self) -> tuple[str | None, str | None]:
        """Equal tokens under another LoRA or salt share nothing, in either backend."""
        return (self.lora_name, self.cache_salt)

    @property
    def output_token_ids(self) -> Sequence[int]:
        tokens = self._all_token_ids
        if tokens is None:  # (a copy, as the slice below is)
            return list(self._early_output)
        return tokens[self._num_prompt_tokens :]

    @property
    def num_tokens(self) -> int:
        tokens = self._all_token_ids
        return self._num_prompt_tokens + len(self._early_output) if tokens is None else len(tokens)

    @property
    def num_prompt_tokens(self) -> int:
        return self._num_prompt_tokens

    @property
    def num_output_tokens(self) -> int:
        tokens = self._all_token_ids
        return len(self._early_output) if tokens is None else len(tokens) - self._num_prompt_tokens

    def append_output_token_ids(self, token_ids: int | Iterable[int]) -> None:
        tokens = self._all_token_ids
        if tokens is None:  # the list is not built: they wait beside the prompt (``_tokens``)
            tokens = self._early_output
        if type(token_ids) is int and token_ids >= 0:  # one decode step: the engine's hot path
            tokens.append(token_ids)
            return
        if isinstance(token_ids, int) and not isinstance(token_ids, bool):
            token_ids = (token_ids,)
        tokens.extend(_check_token_ids(token_ids, "output_token_ids"))  # type: ignore[arg-type]

    def append_known_output(self, token_ids: list[int]) -> None:
        """Append output tokens that were checked where they were made (a planned output, or
        ``synthesis.simulated_tokens``): the engine's catch-up after deferred decode steps,
        without ``append_output_token_ids``' per-token check of outside input."""
        tokens = self._all_token_ids
        (self._early_output if tokens is None else tokens).extend(token_ids)

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, prompt={self.num_prompt_tokens}, "
            f"output={self.num_output_tokens}, computed={self.num_computed_tokens})"
        )
