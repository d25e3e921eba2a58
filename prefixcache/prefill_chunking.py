"""How many of the prefill tokens a step offers a request it computes: a policy a cache carries
(``PrefixCache.prefill_chunking``) and the engine reads once. The plain policy takes them all;
vLLM's Mamba "align" mode ends chunks on block boundaries, because a recurrent state is cached
only where a chunk ends (hashchain: mamba_chunking.py)."""

from __future__ import annotations

from prefixcache.request import Request


class PrefillChunking:
    """The plain policy (vLLM's and SGLang's for attention-only models): every token offered."""

    def chunk(
        self, req: Request, start: int, num_new_tokens: int, max_chunk: int, match: object | None = None
    ) -> int:
        """How many of the ``num_new_tokens`` from token ``start`` on that a scheduler offers
        ``req`` this step it should compute (``max_chunk``: the step's token limit; ``match``:
        the admission's ``Match``, for a request not yet live: typed ``object`` since the
        interface module imports this one); 0 means wait for a later step."""
        return num_new_tokens


TAKE_ALL = PrefillChunking()
