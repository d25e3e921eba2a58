"""A small Llama-style decoder whose attention runs over the paged KV pool (gpt-fast in spirit).

RMSNorm, rotary embeddings, grouped-query attention through ``paged_attention``, SwiGLU MLP;
random weights from a seed. It exists so that a cache hit can be checked against recompute:
the engine hands ``step`` the new tokens of each running sequence with the page table the
prefix cache gave it, and the model writes their K/V into those pages and attends over them.

With ``batch_invariant=True`` a token's logits are bit-identical however the prompt was split
into steps (a cache hit or a recompute, any chunking, any page size): see ``Model``.

Hybrid mode (``Model.for_cache``): the layers follow the cache's ``ModelLayout``, full and
sliding-window attention, and their KV lives where the cache's ``kv_groups()`` say: each group
has its own page table per sequence (``SeqChunk.page_tables``, as ``cache.page_tables(req)``
gives them), and the groups of one pool share its page ids, so they share its memory too: the
j-th layer of every group in a pool reads and writes one tensor (vLLM's layout, where one block
id is the same memory in one layer of each group). A sliding-window layer attends to the last W
positions only, so the pages of its table left of the window may be 0 (freed).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from prefixcache.config import check_positive_int
from prefixcache.interface import KVGroup, PrefixCache
from prefixcache.kernels.paged_attention import paged_attention, store_kv
from prefixcache.kernels.reference import paged_attention_reference
from prefixcache.layout import ModelLayout

MODEL_LAYER_KINDS = ("full", "sliding_window")  # the layer kinds model mode runs

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
    # One table per KV group of the model, in ``kv_groups`` order (``cache.page_tables(req)``);
    # page_table must then be the first. Empty: ``(page_table,)``, a one-group model's.
    page_tables: Sequence[Sequence[int]] = ()

    def tables(self) -> Sequence[Sequence[int]]:
        return self.page_tables if self.page_tables else (self.page_table,)


class GroupTables(NamedTuple):
    """One KV group's kernel inputs for a step, shared by the layers of the group."""

    slot_mapping: torch.Tensor  # int64 [T]  page * page_size + offset of each new token
    page_table: torch.Tensor  # int32 [B, max_pages]
    sliding_window: int | None  # the group's window (None: full attention)


class StepBatch(NamedTuple):
    """The kernel inputs of one step, built once and shared by every layer."""

    positions: torch.Tensor  # int64 [T]
    groups: tuple[GroupTables, ...]  # one per KV group, in the model's kv_groups order
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
        self, x: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: StepBatch, kv: GroupTables
    ) -> torch.Tensor:
        """x: [T, dim]; k/v_cache: [num_pages, page_size, Hkv, D] of this layer, addressed by its
        group's tables ``kv``. Returns [T, dim]."""
        c = self.config
        kv_dim = c.n_kv_heads * c.head_dim
        qkv = per_token(batch.invariant_ops, self.project, x, batch.cos, batch.sin)
        q, k, v = qkv.split([c.dim, kv_dim, kv_dim], dim=-1)  # [T, dim], [T, kv_dim] x 2
        q = q.reshape(-1, c.n_heads, c.head_dim)  # [T, Hq, D]
        k = k.reshape(-1, c.n_kv_heads, c.head_dim)  # [T, Hkv, D]
        v = v.reshape(-1, c.n_kv_heads, c.head_dim)  # [T, Hkv, D]
        store_kv(k, v, k_cache, v_cache, kv.slot_mapping)  # new KV first: the queries see it
        o = ATTENTION_IMPLS[batch.attention_impl](
            q, k_cache, v_cache, kv.page_table, batch.cu_seqlens_q, batch.seq_lens,
            max_q_len=batch.max_q_len, max_seq_len=batch.max_seq_len,
            batch_invariant=batch.invariant_attention, sliding_window=kv.sliding_window,
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
        self, x: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: StepBatch, kv: GroupTables
    ) -> torch.Tensor:  # x: [T, dim]
        invariant = batch.invariant_ops
        h = x + self.attention(per_token(invariant, self.attention_norm, x), k_cache, v_cache, batch, kv)
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
        num_pages: int | None = None,
        page_size: int | None = None,
        *,
        kv_groups: Sequence[KVGroup] | None = None,
        layout: ModelLayout | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        seed: int = 0,
        attention_impl: AttentionImpl = "triton",
        batch_invariant: bool = False,
    ) -> None:
        """A dense model: ``num_pages`` pages of ``page_size`` slots per layer. A hybrid one:
        ``kv_groups`` (a cache's ``kv_groups()``, which carry the pages) instead, and the
        ``layout`` they came from to check them against; ``Model.for_cache`` gives both."""
        super().__init__()
        if kv_groups is None:
            if layout is not None:
                raise ValueError("a layout needs the cache's kv_groups too (see Model.for_cache)")
            check_positive_int("num_pages", num_pages)
            check_positive_int("page_size", page_size)
            assert num_pages is not None and page_size is not None  # for mypy
            kv_groups = (KVGroup("full", None, "kv", page_size, num_pages, tuple(range(config.n_layers))),)
        elif num_pages is not None or page_size is not None:
            raise ValueError("give num_pages and page_size, or kv_groups (which carry them), not both")
        if attention_impl not in ATTENTION_IMPLS:
            raise ValueError(
                f"attention_impl must be one of {sorted(ATTENTION_IMPLS)}, got {attention_impl!r}"
            )
        if batch_invariant and attention_impl != "triton":
            raise ValueError(
                "batch_invariant=True needs attention_impl='triton' (the reference's "
                f"SDPA has no fixed reduction order), got {attention_impl!r}"
            )
        self.config = config
        self.kv_groups = check_kv_groups(config, kv_groups, layout)
        self.layer_groups = [0] * config.n_layers  # the KV group of each layer
        for g, group in enumerate(self.kv_groups):
            for layer in group.layers:
                self.layer_groups[layer] = g
        self.batch_invariant = batch_invariant
        self.num_pages = self.kv_groups[0].num_pages  # group 0's (a dense model's only group)
        self.page_size = self.kv_groups[0].page_size
        self.attention_impl: AttentionImpl = attention_impl
        c = config
        self.tok_embeddings = nn.Embedding(c.vocab_size, c.dim)
        self.layers = nn.ModuleList(Block(c) for _ in range(c.n_layers))
        self.norm = RMSNorm(c.dim, c.norm_eps)
        self.output = nn.Linear(c.dim, c.vocab_size, bias=False)
        self._init_weights(seed)
        self.to(device=device, dtype=dtype)
        self.requires_grad_(False)
        self.k_caches, self.v_caches = _kv_tensors(c, self.kv_groups, dtype, device)  # one per layer
        # inv_freq: [D/2], fp32 whatever the dtype (angles at large positions need the bits)
        exponents = torch.arange(0, c.head_dim, 2, dtype=torch.float32, device=device) / c.head_dim
        self.inv_freq = 1.0 / (c.rope_base**exponents)

    @classmethod
    def for_cache(cls, config: ModelConfig, cache: PrefixCache, **kwargs: object) -> Model:
        """The model that runs over ``cache``'s KV: a dense model as ``Model(config, num_pages,
        page_size)`` for a cache with one full-attention group; for a hybrid layout, one layer
        per layer of ``cache.config.model_layout`` (``n_layers`` is the layout's) over the
        cache's ``kv_groups()``. ``kwargs``: dtype, device, seed, attention_impl, batch_invariant."""
        layout = cache.config.model_layout
        check_runnable_layout(layout)
        groups = cache.kv_groups()
        if not cache.config.is_hybrid and len(groups) == 1 and groups[0].kind == "full":
            return cls(config, groups[0].num_pages, groups[0].page_size, **kwargs)  # type: ignore[arg-type]
        config = replace(config, n_layers=layout.num_layers)
        return cls(config, kv_groups=groups, layout=layout, **kwargs)  # type: ignore[arg-type]

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
        """Token ids [T] and the kernel inputs for ``chunks``, validated against the pools."""
        if not chunks:
            raise ValueError("step needs at least one SeqChunk")
        groups = self.kv_groups
        tokens: list[int] = []
        positions: list[int] = []
        slots: list[list[int]] = [[] for _ in groups]  # per group
        q_lens: list[int] = []
        for i, chunk in enumerate(chunks):
            token_ids, start_pos = chunk.token_ids, chunk.start_pos
            end = start_pos + len(token_ids)
            if not token_ids or start_pos < 0:
                raise ValueError(
                    f"chunk {i}: needs >= 1 new token and start_pos >= 0, got {len(token_ids)}, {start_pos}"
                )
            tables = chunk.tables()
            if len(tables) != len(groups):
                raise ValueError(f"chunk {i}: {len(tables)} page tables for {len(groups)} KV groups")
            if chunk.page_tables and list(chunk.page_table) != list(chunk.page_tables[0]):
                raise ValueError(f"chunk {i}: page_table must be page_tables[0]")
            for g, (group, pages) in enumerate(zip(groups, tables, strict=True)):
                slots[g].extend(_new_slots(f"chunk {i}" + (f", group {g}" if len(groups) > 1 else ""),
                                           group, pages, start_pos, end))  # fmt: skip
            tokens.extend(token_ids)
            positions.extend(range(start_pos, end))
            q_lens.append(len(token_ids))
        # Shared prefix pages are read-only; new KV never is. Groups of one pool share memory.
        for pool in {group.pool for group in groups}:
            written = [x for group, s in zip(groups, slots, strict=True) if group.pool == pool for x in s]
            if len(set(written)) != len(written):
                raise ValueError("two new tokens of this step would write the same KV slot")
        if not all(0 <= t < self.config.vocab_size for t in tokens):
            raise ValueError(f"token ids must be in [0, {self.config.vocab_size})")
        dev = self.device
        positions_t = torch.tensor(positions, device=dev)  # [T]
        angles = positions_t.float()[:, None] * self.inv_freq[None, :]  # [T, D/2]
        seq_lens = [c.start_pos + len(c.token_ids) for c in chunks]
        group_tables = tuple(
            GroupTables(
                slot_mapping=torch.tensor(slots[g], device=dev),
                page_table=_padded_table([c.tables()[g] for c in chunks]).to(dev),
                sliding_window=group.window,
            )
            for g, group in enumerate(groups)
        )
        batch = StepBatch(
            positions=positions_t,
            groups=group_tables,
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
        layers = zip(self.layers, self.k_caches, self.v_caches, self.layer_groups, strict=True)
        for layer, k_cache, v_cache, g in layers:
            x = layer(x, k_cache, v_cache, batch, batch.groups[g])  # [T, dim]
        last = batch.cu_seqlens_q[1:].long() - 1  # [B] index of each sequence's last new token
        return per_token(batch.invariant_ops, self.head, x[last]).float()  # [B, vocab]

    def head(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, dim] -> [B, vocab]
        return self.output(self.norm(x))


# %%
# KV groups: checks, storage, per-step tables
# -------------------------------------------


def check_runnable_layout(layout: ModelLayout) -> None:
    """Model mode runs attention layers only."""
    if layout.count("mamba"):
        raise ValueError(
            f"model mode does not run an SSM: layout {layout.describe()!r} has {layout.count('mamba')} "
            "mamba layer(s); use full and sliding_window layers only"
        )


def check_kv_groups(
    config: ModelConfig, groups: Sequence[KVGroup], layout: ModelLayout | None
) -> tuple[KVGroup, ...]:
    """Every layer in exactly one group of a kind the model runs, groups of one pool agreeing
    on its shape, and (given the layout) each group's kind and window its layers'."""
    groups = tuple(groups)
    if not groups:
        raise ValueError("kv_groups needs at least one group")
    if layout is not None:
        check_runnable_layout(layout)
        if layout.num_layers != config.n_layers:
            raise ValueError(f"the layout has {layout.num_layers} layers, the model {config.n_layers}")
    owner: dict[int, int] = {}
    pools: dict[str, tuple[int, int]] = {}
    for g, group in enumerate(groups):
        if group.kind == "mamba":
            raise ValueError(f"model mode does not run an SSM: KV group {g} is a mamba group")
        if group.kind not in MODEL_LAYER_KINDS:
            raise ValueError(f"KV group {g}: kind must be one of {MODEL_LAYER_KINDS}, got {group.kind!r}")
        if (group.kind == "full") != (group.window is None):
            raise ValueError(f"KV group {g}: a {group.kind} group with window {group.window!r}")
        if group.window is not None:
            check_positive_int(f"KV group {g}'s window", group.window)
        check_positive_int(f"KV group {g}'s page_size", group.page_size)
        check_positive_int(f"KV group {g}'s num_pages", group.num_pages)
        shape = pools.setdefault(group.pool, (group.num_pages, group.page_size))
        if shape != (group.num_pages, group.page_size):
            raise ValueError(
                f"KV group {g}: pool {group.pool!r} has {shape[0]} pages of {shape[1]} in another group, "
                f"{group.num_pages} of {group.page_size} here (groups of one pool share its pages)"
            )
        for layer in group.layers:
            if not 0 <= layer < config.n_layers:
                raise ValueError(f"KV group {g}: layer {layer} is not in [0, {config.n_layers})")
            if layer in owner:
                raise ValueError(f"layer {layer} is in KV groups {owner[layer]} and {g}")
            owner[layer] = g
            if layout is not None and (layout.layers[layer].kind, layout.layers[layer].window) != (
                group.kind,
                group.window,
            ):
                raise ValueError(f"KV group {g} ({group.kind}, window {group.window}) serves layer {layer}, "
                                 f"which the layout makes {layout.layers[layer].as_tuple()}")  # fmt: skip
    missing = sorted(set(range(config.n_layers)) - set(owner))
    if missing:
        raise ValueError(f"layers {missing} are in no KV group")
    return groups


def _kv_tensors(
    config: ModelConfig, groups: tuple[KVGroup, ...], dtype: torch.dtype, device: torch.device | str
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """K and V caches [num_pages, page_size, Hkv, D] per layer. One pool's groups share them:
    the j-th layer of each group gets the pool's j-th tensor (a page id is one memory region in
    one layer of every group, as in vLLM), so a page handed to two groups at once would show."""
    shared: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {}
    k_caches: list[torch.Tensor] = [torch.empty(0)] * config.n_layers
    v_caches: list[torch.Tensor] = [torch.empty(0)] * config.n_layers
    for group in groups:
        tensors = shared.setdefault(group.pool, [])
        shape = (group.num_pages, group.page_size, config.n_kv_heads, config.head_dim)
        while len(tensors) < len(group.layers):
            tensors.append((torch.zeros(shape, dtype=dtype, device=device),
                            torch.zeros(shape, dtype=dtype, device=device)))  # fmt: skip
        for j, layer in enumerate(group.layers):
            k_caches[layer], v_caches[layer] = tensors[j]
    return k_caches, v_caches


def _new_slots(what: str, group: KVGroup, pages: Sequence[int], start: int, end: int) -> list[int]:
    """The slots of positions [start, end) in ``pages``, after checking that the table covers
    them, that its ids are in the pool, and that every page the step reads or writes is real:
    positions [0, end), or for a sliding window [start - W + 1, end) (the rest may be 0)."""
    ps = group.page_size
    if len(pages) * ps < end:
        raise ValueError(f"{what}: page table of {len(pages)} pages of {ps} cannot hold {end} tokens")
    if any(not 0 <= p < group.num_pages for p in pages):
        raise ValueError(f"{what}: page ids must be in [0, {group.num_pages}), got {list(pages)}")
    # [read_lo, end)  read or written by this step; [0, read_lo) left of every window
    read_lo = 0 if group.window is None else max(0, start - group.window + 1)
    if 0 in pages[read_lo // ps : -(-end // ps)]:
        raise ValueError(f"{what}: the null page 0 holds a position the step reads or writes "
                         f"(positions [{read_lo}, {end}) of table {list(pages)})")  # fmt: skip
    return [pages[t // ps] * ps + t % ps for t in range(start, end)]


def _padded_table(tables: list[Sequence[int]]) -> torch.Tensor:
    """int32 [B, max_pages]; padding is page 0, never read."""
    table = torch.zeros(len(tables), max(len(t) for t in tables), dtype=torch.int32)
    for b, t in enumerate(tables):
        table[b, : len(t)] = torch.tensor(list(t), dtype=torch.int32)
    return table
