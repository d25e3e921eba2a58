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

import xxhash

ALPHABET = "abcdefghijklmnopqrstuvwxyz"
# Ids below this are spelled once into a table on first use (a router spells millions of
# tokens per trace; a list index is several times cheaper than the dict and the hash).
TABLE_SIZE = 1 << 16


class TokenText:
    def __init__(self, seed: int = 0, max_chars: int = 8) -> None:
        if max_chars < 1:
            raise ValueError(f"max_chars must be >= 1, got {max_chars}")
        self.seed = seed
        self.max_chars = max_chars
        self._spelled: dict[int, str] = {}
        self._table: list[str] | None = None

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

    def text(self, tokens: Sequence[int]) -> str:
        table = self._spellings(tokens)
        if table is not None:
            return "".join(map(table.__getitem__, tokens))
        return "".join(self.spell(t) for t in tokens)

    def _spellings(self, tokens: Sequence[int]) -> list[str] | None:
        """The table of spellings if every id of ``tokens`` is in it (else None)."""
        if not len(tokens) or min(tokens) < 0 or max(tokens) >= TABLE_SIZE:
            return None
        if self._table is None:
            self._table = [self.spell(t) for t in range(TABLE_SIZE)]
        return self._table

    def tokens_within(self, tokens: Sequence[int], num_chars: int) -> int:
        """Leading tokens whose whole spelling lies in the first ``num_chars`` characters: the
        token count a character match of that length stands for."""
        table = self._spellings(tokens)
        spell = table.__getitem__ if table is not None else self.spell
        n = 0
        for end in accumulate(len(spell(t)) for t in tokens):
            if end > num_chars:
                break
            n += 1
        return n
