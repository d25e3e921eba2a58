"""A small Llama-style decoder whose attention runs over the paged KV pool (gpt-fast in spirit).

RMSNorm, rotary embeddings, grouped-query attention through ``paged_attention``, SwiGLU MLP;
random weights from a seed. It exists so that a cache hit can be checked against recompute:
the engine hands ``step`` the new tokens of each running sequence with the page table the
prefix cache gave it, and the model writes their K/V into those pages and attends over them.

With ``batch_invariant=True`` a token's logits are bit-identical however the prompt was split
into steps (a cache hit or a recompute, any chunking, any page size): see ``Model``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from prefixcache.config import check_positive_int
from prefixcache.kernels.paged_attention import paged_attention, store_kv
from prefixcache.kernels.reference import paged_attention_reference

AttentionImpl = Literal["triton", "reference"]
ATTENTION_IMPLS = {"triton": paged_attention, "reference": paged_attention_reference}


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Shape of the decoder. Tiny defaults (for the Triton interpreter) but a real vocabulary:
    the built-in workloads and the engine draw token ids from Llama-2's 32k."""

    vocab_size: int = 32_000
    n_layers: int = 2
    dim: int = 64
    n_heads: int = 4
    n_kv_heads: int = 2
    intermediate_size: int = 172  # ~ 8/3 * dim, Llama's SwiGLU width
    rope_base: float = 10_000.0
    norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        for name in ("vocab_size", "n_layers", "dim", "n_heads", "n_kv_heads", "intermediate_size"):
            check_positive_int(name, getattr(self, name))
        if self.dim % self.n_heads:
            raise ValueError(f"dim={self.dim} must be a multiple of n_heads={self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_heads={self.n_heads} must be a multiple of n_kv_heads={self.n_kv_heads} (GQA groups)"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for rotary embeddings")
        if self.rope_base <= 1 or self.norm_eps <= 0:
            raise ValueError(f"need rope_base > 1 and norm_eps > 0, got {self.rope_base}, {self.norm_eps}")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


class SeqChunk(NamedTuple):
    """One sequence's share of a step."""

    token_ids: Sequence[int]  # the NEW tokens of this sequence in this step
    start_pos: int  # position of the first new token (= tokens already in the KV cache)
    page_table: Sequence[int]  # physical page ids covering positions [0, start_pos + len(token_ids))


class StepBatch(NamedTuple):
    """The kernel inputs of one step, built once and shared by every layer."""

    positions: torch.Tensor  # int64 [T]
    slot_mapping: torch.Tensor  # int64 [T]  page * page_size + offset of each new token
    page_table: torch.Tensor  # int32 [B, max_pages]
    cu_seqlens_q: torch.Tensor  # int32 [B + 1]
    seq_lens: torch.Tensor  # int32 [B]
    max_q_len: int
    max_seq_len: int  # the longest seq_len: the kernel's split heuristic needs no device sync
    cos: torch.Tensor  # fp32 [T, 1, D/2]  rotary angles of each new token's position
    sin: torch.Tensor  # fp32 [T, 1, D/2]
    attention_impl: AttentionImpl
    invariant_ops: bool  # per-token ops one token at a time (batch-invariant mode)
    invariant_attention: bool  # the kernel's fixed-tile mode (batch-invariant mode)


def per_token(invariant: bool, fn: Callable[..., torch.Tensor], *xs: torch.Tensor) -> torch.Tensor:
    """``fn(*xs)`` for ops that act on each row (token) alone; if ``invariant``, one row at a
    time, so that every row's result comes from the same [1, ...]-shaped computation."""
    if not invariant:
        return fn(*xs)
    # clone: each row in a fresh buffer, so not even its alignment depends on its index
    return torch.cat([fn(*(x[i : i + 1].clone() for x in xs)) for i in range(xs[0].shape[0])])


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [T, dim]
        xf = x.float()  # normalise in fp32 whatever the model dtype
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[..., i], x[..., i + D/2]) by each token's angles (Llama's rotate_half)."""
    # x: [T, H, D]; cos, sin: [T, 1, D/2]
    x1, x2 = x.float().chunk(2, dim=-1)  # [T, H, D/2] each
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).type_as(x)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        kv_dim = config.n_kv_heads * config.head_dim
        self.wqkv = nn.Linear(config.dim, config.dim + 2 * kv_dim, bias=False)
        self.wo = nn.Linear(config.dim, config.dim, bias=False)

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x: [T, dim] -> q, rotated k, v side by side: [T, dim + 2 * kv_dim] (per token)."""
        c = self.config
        kv_dim = c.n_kv_heads * c.head_dim
        q, k, v = self.wqkv(x).split([c.dim, kv_dim, kv_dim], dim=-1)  # [T, dim], [T, kv_dim] x 2
        q = apply_rope(q.view(-1, c.n_heads, c.head_dim), cos, sin)  # [T, Hq, D]
        k = apply_rope(k.view(-1, c.n_kv_heads, c.head_dim), cos, sin)  # [T, Hkv, D]
        return torch.cat([q.flatten(1), k.flatten(1), v], dim=-1)

    def forward(
        self, x: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: StepBatch
    ) -> torch.Tensor:
        """x: [T, dim]; k/v_cache: [num_pages, page_size, Hkv, D] of this layer. Returns [T, dim]."""
        c = self.config
        kv_dim = c.n_kv_heads * c.head_dim
        qkv = per_token(batch.invariant_ops, self.project, x, batch.cos, batch.sin)
        q, k, v = qkv.split([c.dim, kv_dim, kv_dim], dim=-1)  # [T, dim], [T, kv_dim] x 2
        q = q.reshape(-1, c.n_heads, c.head_dim)  # [T, Hq, D]
        k = k.reshape(-1, c.n_kv_heads, c.head_dim)  # [T, Hkv, D]
        v = v.reshape(-1, c.n_kv_heads, c.head_dim)  # [T, Hkv, D]
        store_kv(k, v, k_cache, v_cache, batch.slot_mapping)  # new KV first: the queries see it
        o = ATTENTION_IMPLS[batch.attention_impl](
            q, k_cache, v_cache, batch.page_table, batch.cu_seqlens_q, batch.seq_lens,
            max_q_len=batch.max_q_len, max_seq_len=batch.max_seq_len,
            batch_invariant=batch.invariant_attention,
        )  # fmt: skip
        return per_token(batch.invariant_ops, self.wo, o.flatten(1))  # o: [T, Hq, D] -> [T, dim]


class FeedForward(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.w13 = nn.Linear(config.dim, 2 * config.intermediate_size, bias=False)  # gate, up
        self.w2 = nn.Linear(config.intermediate_size, config.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [T, dim]
        gate, up = self.w13(x).chunk(2, dim=-1)  # [T, inter] each
        return self.w2(F.silu(gate) * up)  # [T, dim]


class Block(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(config.dim, config.norm_eps)
        self.attention = Attention(config)
        self.ffn_norm = RMSNorm(config.dim, config.norm_eps)
        self.feed_forward = FeedForward(config)

    def forward(
        self, x: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: StepBatch
    ) -> torch.Tensor:  # x: [T, dim]
        invariant = batch.invariant_ops
        h = x + self.attention(per_token(invariant, self.attention_norm, x), k_cache, v_cache, batch)
        return h + per_token(invariant, self.mlp, h)  # [T, dim]

    def mlp(self, h: torch.Tensor) -> torch.Tensor:  # h: [T, dim]
        return self.feed_forward(self.ffn_norm(h))


class Model(nn.Module):
    """The decoder plus its per-layer K/V pools of ``num_pages`` pages of ``page_size`` slots.

    ``batch_invariant=True`` fixes every reduction order so that a token's outputs depend only
    on its position and its context, not on how many tokens share the step (so a cache hit's
    logits equal a recompute's bit for bit, whatever the chunking or page size). Op by op:

    * linear layers (wqkv, wo, w13, w2, output): a GEMM's kernel and blocking depend on M, the
      number of rows (on our 2-core VM, MKL's fp32 rows for M < 8 differ from M >= 8). Invariant
      mode runs them one token at a time (M = 1 always), through ``per_token``.
    * RMSNorm: a mean over each row only, but how a vectorised reduction is laid out may depend
      on the tensor's shape; one token at a time too (then nothing needs arguing).
    * cos/sin of the rotary angles, SiLU: elementwise, but ATen runs the tail of a vectorised
      loop through scalar code, and scalar and vector ``exp`` can differ in the last bit (seen
      here for SiLU: a token's bits depended on where its elements fell in the tensor). One
      token at a time, so every token's elements sit at the same offsets every time.
    * residual adds: single IEEE additions, correctly rounded in scalar and vector code alike,
      so exact batched.
    * embedding lookup, ``store_kv``, splits, reshapes, ``torch.cat``: copies, exact.
    * attention: the only op that mixes tokens. The kernel's ``batch_invariant=True`` uses one
      tile shape whatever the query length and never splits KV, so each query row sees the same
      KV tiles in the same order; the reference (SDPA per sequence, batched over q_len) makes
      no such promise, so invariant mode needs ``attention_impl="triton"``.

    Off by default: the per-token loop costs one launch per token and op.
    """

    def __init__(
        self,
        config: ModelConfig,
        num_pages: int,
        page_size: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        seed: int = 0,
        attention_impl: AttentionImpl = "triton",
        batch_invariant: bool = False,
    ) -> None:
        super().__init__()
        check_positive_int("num_pages", num_pages)
        check_positive_int("page_size", page_size)
        if attention_impl not in ATTENTION_IMPLS:
            raise ValueError(
                f"attention_impl must be one of {sorted(ATTENTION_IMPLS)}, got {attention_impl!r}"
            )
        if batch_invariant and attention_impl != "triton":
            raise ValueError("batch_invariant=True needs attention_impl='triton' (the reference's "
                             f"SDPA has no fixed reduction order), got {attention_impl!r}")
        self.config = config
        self.batch_invariant = batch_invariant
        self.num_pages = num_pages
        self.page_size = page_size
        self.attention_impl: AttentionImpl = attention_impl
        c = config
        self.tok_embeddings = nn.Embedding(c.vocab_size, c.dim)
        self.layers = nn.ModuleList(Block(c) for _ in range(c.n_layers))
        self.norm = RMSNorm(c.dim, c.norm_eps)
        self.output = nn.Linear(c.dim, c.vocab_size, bias=False)
        self._init_weights(seed)
        self.to(device=device, dtype=dtype)
        self.requires_grad_(False)
        cache_shape = (num_pages, page_size, c.n_kv_heads, c.head_dim)
        self.k_caches = [torch.zeros(cache_shape, dtype=dtype, device=device) for _ in range(c.n_layers)]
        self.v_caches = [torch.zeros(cache_shape, dtype=dtype, device=device) for _ in range(c.n_layers)]
        # inv_freq: [D/2], fp32 whatever the dtype (angles at large positions need the bits)
        exponents = torch.arange(0, c.head_dim, 2, dtype=torch.float32, device=device) / c.head_dim
        self.inv_freq = 1.0 / (c.rope_base**exponents)

    def _init_weights(self, seed: int) -> None:
        """N(0, 1/fan_in) so activations stay O(1) and attention is far from uniform: with
        random weights, a wrong KV read must move the logits well past the test tolerance."""
        g = torch.Generator().manual_seed(seed)
        for name, p in sorted(self.named_parameters()):
            if name.endswith("norm.weight"):
                continue  # RMSNorm gains stay 1
            fan_in = p.shape[1] if p.dim() == 2 and "tok_embeddings" not in name else 1
            with torch.no_grad():
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(fan_in))

    @property
    def device(self) -> torch.device:
        return self.output.weight.device

    def _batch(self, chunks: list[SeqChunk]) -> tuple[torch.Tensor, StepBatch]:
        """Token ids [T] and the kernel inputs for ``chunks``, validated against the pool."""
        if not chunks:
            raise ValueError("step needs at least one SeqChunk")
        ps = self.page_size
        tokens: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        q_lens: list[int] = []
        for i, (token_ids, start_pos, pages) in enumerate(chunks):
            end = start_pos + len(token_ids)
            if not token_ids or start_pos < 0:
                raise ValueError(
                    f"chunk {i}: needs >= 1 new token and start_pos >= 0, got {len(token_ids)}, {start_pos}"
                )
            if len(pages) * ps < end:
                raise ValueError(
                    f"chunk {i}: page table of {len(pages)} pages of {ps} cannot hold {end} tokens"
                )
            if any(not 0 <= p < self.num_pages for p in pages):
                raise ValueError(f"chunk {i}: page ids must be in [0, {self.num_pages}), got {list(pages)}")
            tokens.extend(token_ids)
            positions.extend(range(start_pos, end))
            slots.extend(pages[t // ps] * ps + t % ps for t in range(start_pos, end))
            q_lens.append(len(token_ids))
        if len(set(slots)) != len(slots):  # shared prefix pages are read-only; new KV never is
            raise ValueError("two new tokens of this step would write the same KV slot")
        if not all(0 <= t < self.config.vocab_size for t in tokens):
            raise ValueError(f"token ids must be in [0, {self.config.vocab_size})")
        max_pages = max(len(c.page_table) for c in chunks)
        table = torch.zeros(len(chunks), max_pages, dtype=torch.int32)  # padding: page 0, never read
        for b, c in enumerate(chunks):
            table[b, : len(c.page_table)] = torch.tensor(list(c.page_table), dtype=torch.int32)
        dev = self.device
        positions_t = torch.tensor(positions, device=dev)  # [T]
        angles = positions_t.float()[:, None] * self.inv_freq[None, :]  # [T, D/2]
        seq_lens = [c.start_pos + len(c.token_ids) for c in chunks]
        batch = StepBatch(
            positions=positions_t,
            slot_mapping=torch.tensor(slots, device=dev),
            page_table=table.to(dev),
            cu_seqlens_q=torch.tensor([0, *q_lens], device=dev).cumsum(0).int(),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
            max_q_len=max(q_lens),
            max_seq_len=max(seq_lens),
            cos=per_token(self.batch_invariant, torch.cos, angles)[:, None, :],
            sin=per_token(self.batch_invariant, torch.sin, angles)[:, None, :],
            attention_impl=self.attention_impl,
            invariant_ops=self.batch_invariant,
            invariant_attention=self.batch_invariant,
        )
        return torch.tensor(tokens, device=dev), batch

    @torch.no_grad()
    def step(self, chunks: list[SeqChunk]) -> torch.Tensor:
        """Write the KV of every chunk's new tokens; return fp32 logits [B, vocab] at each
        sequence's last new token. One batched attention launch per layer."""
        token_ids, batch = self._batch(chunks)  # token_ids: [T]
        x = self.tok_embeddings(token_ids)  # [T, dim]
        for layer, k_cache, v_cache in zip(self.layers, self.k_caches, self.v_caches, strict=True):
            x = layer(x, k_cache, v_cache, batch)  # [T, dim]
        last = batch.cu_seqlens_q[1:].long() - 1  # [B] index of each sequence's last new token
        return per_token(batch.invariant_ops, self.head, x[last]).float()  # [B, vocab]

    def head(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, dim] -> [B, vocab]
        return self.output(self.norm(x))
