"""Hypothesis strategies for request workloads with controlled sharing.

Small vocabularies make token-level coincidences (accidental shared prefixes, divergence in the
middle of a block) common, which is where the two designs differ.
"""

from __future__ import annotations

from typing import NamedTuple

from hypothesis import strategies as st

# (cache_salt, lora_name); the LoRA name equals a salt string on purpose: tags must keep them apart.
NAMESPACES: list[tuple[str | None, str | None]] = [(None, None), ("s1", None), ("s2", None), (None, "s1")]
SHAPES = ("fresh", "system_prompt", "multi_turn", "branch", "repeat", "block_boundary")


class Spec(NamedTuple):
    """A request to be made: its tokens and namespace."""

    tokens: tuple[int, ...]
    salt: str | None = None
    lora: str | None = None

    @property
    def namespace(self) -> tuple[str | None, str | None]:
        return (self.salt, self.lora)


def token_lists(vocab: int, min_size: int, max_size: int) -> st.SearchStrategy[list[int]]:
    return st.lists(st.integers(0, vocab - 1), min_size=min_size, max_size=max_size)


@st.composite
def request_specs(
    draw: st.DrawFn,
    *,
    max_requests: int = 8,
    vocab: int = 3,
    block: int = 4,
    max_blocks: int = 5,
    namespaces: bool = True,
) -> list[Spec]:
    """A sequence of requests whose prompts share prefixes in the shapes of real workloads:
    a shared system prompt, multi-turn continuation (previous prompt + answer + question),
    branching from any point, exact repeats, and branching exactly at a block boundary."""
    system = tuple(draw(token_lists(vocab, 1, 2 * block)))
    specs: list[Spec] = []
    for _ in range(draw(st.integers(1, max_requests))):
        shape = draw(st.sampled_from(SHAPES)) if specs else "fresh"
        suffix = tuple(draw(token_lists(vocab, 1, 2 * block)))
        base = draw(st.sampled_from(specs)).tokens if specs else ()
        if shape == "fresh":
            tokens = tuple(draw(token_lists(vocab, 1, max_blocks * block)))
        elif shape == "system_prompt":
            tokens = system + suffix
        elif shape == "multi_turn":
            tokens = base + suffix
        elif shape == "branch":
            tokens = base[: draw(st.integers(0, len(base)))] + suffix
        elif shape == "repeat":
            tokens = base
        else:
            tokens = base[: block * draw(st.integers(0, len(base) // block))] + suffix
        tokens = tokens[: max_blocks * block + block] or suffix
        salt, lora = draw(st.sampled_from(NAMESPACES)) if namespaces else (None, None)
        specs.append(Spec(tokens, salt, lora))
    return specs


def common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """Brute-force longest common prefix (the oracle the tree must agree with)."""
    n = 0
    for x, y in zip(a, b):  # noqa: B905 - lengths differ on purpose
        if x != y:
            break
        n += 1
    return n


def reference_hits(specs: list[Spec]) -> list[int]:
    """Token-level hit of each request when everything before it is cached (one after another):
    min(longest common prefix with an earlier request of the same namespace, n - 1)."""
    hits = []
    for i, s in enumerate(specs):
        earlier = [p.tokens for p in specs[:i] if p.namespace == s.namespace]
        lcp = max((common_prefix(s.tokens, p) for p in earlier), default=0)
        hits.append(min(lcp, len(s.tokens) - 1))
    return hits
