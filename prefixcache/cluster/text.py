"""How a router sees a prompt: as text, not as the engine's tokens.

SGLang's router, production-stack, Ray Serve and llm-d's approximate scorer match characters
(or bytes) of the request text; the engines cache tokens. Our requests carry tokens only, so
``TokenText`` spells each token id as a fixed, seeded string of 1-8 lowercase letters (4.5
characters a token on average, close to BPE tokenizers on English text). Two prompts that
share k tokens share at least their spelled prefix, and may share a few characters more (two
different tokens can start with the same letters): that surplus is the text-vs-token mismatch
a character router over-predicts by.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate

import numpy as np
import numpy.typing as npt
import xxhash

ALPHABET = "abcdefghijklmnopqrstuvwxyz"
# Ids below this are spelled once into a table on first use (a router spells millions of
# tokens per trace: a whole prompt is then spelled and measured by numpy gathers, not a
# Python step per token).
TABLE_SIZE = 1 << 16
TokenIds = Sequence[int] | npt.NDArray[np.integer]


class SpellingTable:
    """The spellings of ids ``0..n-1`` as rows of character codes padded to one width, and their
    lengths, so that a prompt's text and its character offsets are array operations. Each row
    is gathered as one opaque item (a void view: one copy of ``width`` codes, not a 2-D fancy
    index), then a mask of each row's leading ``length`` codes drops the padding."""

    def __init__(self, spellings: Sequence[str]) -> None:
        width = max(map(len, spellings), default=1)
        self.lengths = np.fromiter(map(len, spellings), dtype=np.int64, count=len(spellings))
        joined = "".join(s.ljust(width, "\0") for s in spellings)
        wide = any(ord(c) > 0xFF for c in set(joined))
        self.codec = "utf-32-le" if wide else "latin-1"
        self.dtype: type[np.unsignedinteger] = np.uint32 if wide else np.uint8
        codes = np.frombuffer(joined.encode(self.codec, "surrogatepass"), dtype=self.dtype)
        self._rows = codes.view(f"V{width * codes.itemsize}")  # one item per spelling
        leading = np.arange(width) < np.arange(width + 1)[:, None]  # [k]: the first k of width
        self._masks = leading.view(f"V{width}").reshape(-1)

    def text(self, ids: npt.NDArray[np.int64]) -> str:
        """The spellings of ``ids`` one after another."""
        codes = self._rows[ids].view(self.dtype)
        kept = self._masks[self.lengths[ids]].view(np.bool_)
        return codes[kept].tobytes().decode(self.codec, "surrogatepass")

    def tokens_within(self, ids: npt.NDArray[np.int64], num_chars: int) -> int:
        """Leading ids whose spellings end within the first ``num_chars`` characters."""
        ends = np.cumsum(self.lengths[ids])  # strictly increasing: every spelling has a character
        return int(np.searchsorted(ends, num_chars, side="right"))


class TokenText:
    def __init__(self, seed: int = 0, max_chars: int = 8) -> None:
        if max_chars < 1:
            raise ValueError(f"max_chars must be >= 1, got {max_chars}")
        self.seed = seed
        self.max_chars = max_chars
        self._spelled: dict[int, str] = {}
        self._table: SpellingTable | None = None

    def spell(self, token: int) -> str:
        s = self._spelled.get(token)
        if s is None:
            h = xxhash.xxh64_intdigest(token.to_bytes(8, "little", signed=True), seed=self.seed)
            n = 1 + h % self.max_chars
            h //= self.max_chars
            chars = []
            for _ in range(n):
                h, c = divmod(h, len(ALPHABET))
                chars.append(ALPHABET[c])
            s = self._spelled[token] = "".join(chars)
        return s

    def text(self, tokens: TokenIds) -> str:
        ids = self._in_table(tokens)
        if ids is not None:
            return self._spellings().text(ids)
        return "".join(self.spell(int(t)) for t in tokens)

    def tokens_within(self, tokens: TokenIds, num_chars: int) -> int:
        """Leading tokens whose whole spelling lies in the first ``num_chars`` characters: the
        token count a character match of that length stands for."""
        ids = self._in_table(tokens)
        if ids is not None:
            return self._spellings().tokens_within(ids, num_chars)
        n = 0
        for end in accumulate(len(self.spell(int(t))) for t in tokens):
            if end > num_chars:
                break
            n += 1
        return n

    @staticmethod
    def _in_table(tokens: TokenIds) -> npt.NDArray[np.int64] | None:
        """``tokens`` as an id array if every one of them is spelled in the table, else None."""
        ids = np.asarray(tokens, dtype=np.int64)
        if ids.ndim != 1 or not ids.size or ids.min() < 0 or ids.max() >= TABLE_SIZE:
            return None
        return ids

    def _spellings(self) -> SpellingTable:
        if self._table is None:
            self._table = SpellingTable([self.spell(t) for t in range(TABLE_SIZE)])
        return self._table
