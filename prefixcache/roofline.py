"""A GPU-grounded simulated clock: the roofline of one engine step for a named GPU and model.

Per step, with T tokens computed (prefill and decode), S sequences sampled (one logit row
each, as vLLM and SGLang compute logits only at each scheduled request's last position),
A query-key pairs of causal attention and K context tokens (computed before the step):

    time = step overhead
         + max(linear FLOPs / peak FLOP/s, weight bytes / HBM bandwidth)
         + max(attention FLOPs / peak FLOP/s, KV bytes / (HBM bandwidth x kv_read_efficiency))

    linear FLOPs    = 2 x (linear parameters) x T + 2 x (lm_head parameters) x S
    weight bytes    = (linear + lm_head parameters) x bytes per parameter   (read once a step)
    attention FLOPs = 4 x layers x query heads x head dim x A              (QK^T and PV)
    KV bytes        = KV bytes per token x (K + 2T)   (read every key and value, write the new ones)

A request computing n tokens after c cached or computed ones contributes n x c + n(n+1)/2
to A, c to K and n to T: its attention reads c + n tokens' KV and writes n.

What is left out, on purpose: activations' memory traffic, the
embedding gather, norms, rotary and sampling, kernel launch gaps beyond the step overhead,
and any overlap between the linear and the attention parts (they add). It is a lower bound
of a real step's time, in the GPU's units, not a prediction of a deployed engine's.

Constants come from public datasheets and model configs, each named where it is defined.
The step overhead is no datasheet number: it is the CPU-side gap per step that vLLM's
multi-step RFC measured (vllm-project/vllm#6854, 2024: about 4 ms of GPU idle per decode
step, 5-13 ms across its runs), stated here as a parameter. ``kv_read_efficiency`` is the
stated page-size parameter: the share of HBM bandwidth the attention kernel reaches when it
gathers KV pages (1.0 by default: no loss assumed; lower it to study page size 1's gathers).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

CLOCK_KIND = "roofline"


@dataclass(frozen=True, slots=True)
class GPUSpec:
    """What the roofline needs of a GPU: dense BF16 tensor throughput and HBM bandwidth."""

    name: str
    peak_flops: float  # dense BF16 tensor FLOP/s (the datasheets' sparse figure halved)
    hbm_bytes_per_s: float
    source: str = field(default="", compare=False)


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A dense decoder-only transformer's shape (a Hugging Face config's fields)."""

    name: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    vocab_size: int
    bytes_per_param: int = 2  # bf16 weights
    bytes_per_kv: int = 2  # bf16 KV cache
    source: str = field(default="", compare=False)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def linear_params(self) -> int:
        """Parameters of every layer's projections (q, k, v, o; gate, up, down): what each
        token multiplies through."""
        d, kv = self.hidden_size, self.num_kv_heads * self.head_dim
        per_layer = d * d + 2 * d * kv + d * d + 3 * d * self.intermediate_size
        return self.num_layers * per_layer

    @property
    def lm_head_params(self) -> int:
        return self.hidden_size * self.vocab_size

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of one token in every layer."""
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim * self.bytes_per_kv

    @property
    def attention_flops_per_pair(self) -> int:
        """QK^T and PV for one (query, key) pair in every layer and query head."""
        return 4 * self.num_layers * self.num_heads * self.head_dim


# NVIDIA H100 Tensor Core GPU datasheet (SXM5): BF16 tensor 1,979 TFLOPS with sparsity, HBM3 3.35 TB/s.
H100_SXM = GPUSpec("H100 SXM", 1979e12 / 2, 3.35e12, source="NVIDIA H100 Tensor Core GPU datasheet (SXM)")
# NVIDIA H200 Tensor Core GPU datasheet (SXM): BF16 tensor 1,979 TFLOPS with sparsity, HBM3e 4.8 TB/s.
H200_SXM = GPUSpec("H200 SXM", 1979e12 / 2, 4.8e12, source="NVIDIA H200 Tensor Core GPU datasheet (SXM)")
# meta-llama/Meta-Llama-3-8B config.json: untied embeddings, bf16.
LLAMA3_8B = ModelSpec("Llama-3-8B", hidden_size=4096, intermediate_size=14336, num_layers=32, num_heads=32,
                      num_kv_heads=8, vocab_size=128256, source="meta-llama/Meta-Llama-3-8B config.json")
GPUS = {"h100": H100_SXM, "h200": H200_SXM}
MODELS = {"llama3-8b": LLAMA3_8B}
ROOFLINE_NAMES = tuple(f"{g}-{m}" for g in GPUS for m in MODELS)
STEP_OVERHEAD_S = 0.004  # vllm-project/vllm#6854: ~4 ms of GPU idle per decode step (see above)


@dataclass(frozen=True, slots=True)
class StepWork:
    """What one step computes, in the units the roofline charges (see the module docstring)."""

    linear_flops: float
    weight_bytes: float
    attention_flops: float
    kv_bytes: float


@dataclass(frozen=True, slots=True)
class RooflineClock:
    """The engine's clock (``Engine(cost_model=...)``) for ``model`` on ``gpu``."""

    gpu: GPUSpec
    model: ModelSpec
    step_overhead_s: float = STEP_OVERHEAD_S
    kv_read_efficiency: float = 1.0
    source: str = field(default="", compare=False)
    reads_context = True  # the engine passes sequences, attention pairs and context tokens

    def __post_init__(self) -> None:
        overhead = self.step_overhead_s
        if not (math.isfinite(overhead) and overhead >= 0):
            raise ValueError(f"step_overhead_s must be a finite number >= 0 (seconds), got {overhead!r}")
        if not 0 < self.kv_read_efficiency <= 1:
            raise ValueError(f"kv_read_efficiency must be in (0, 1], got {self.kv_read_efficiency!r}")
        if not self.source:
            object.__setattr__(self, "source", f"roofline: {self.model.name} on {self.gpu.name}")

    @classmethod
    def named(cls, name: str, **kwargs: Any) -> RooflineClock:
        """``<gpu>-<model>``, e.g. ``h100-llama3-8b``; ValueError listing the valid names."""
        gpu, _, model = name.partition("-")
        if gpu not in GPUS or model not in MODELS:
            raise ValueError(f"unknown roofline clock {name!r}; valid: {', '.join(ROOFLINE_NAMES)}")
        return cls(GPUS[gpu], MODELS[model], **kwargs)

    def constants(self) -> dict[str, Any]:
        """Everything the clock computes from (what a study cell's config records and hashes);
        ``from_constants`` rebuilds the same clock."""
        gpu = {k: v for k, v in asdict(self.gpu).items() if k != "source"}
        model = {k: v for k, v in asdict(self.model).items() if k != "source"}
        return {"clock": CLOCK_KIND, "gpu": gpu, "model": model, "step_overhead_s": self.step_overhead_s,
                "kv_read_efficiency": self.kv_read_efficiency}

    @classmethod
    def from_constants(cls, constants: dict[str, Any]) -> RooflineClock:
        if constants.get("clock") != CLOCK_KIND:
            raise ValueError(f"not a roofline clock's constants: {constants!r}")
        return cls(GPUSpec(**constants["gpu"]), ModelSpec(**constants["model"]),
                   constants["step_overhead_s"], constants["kv_read_efficiency"])

    def work(self, tokens: int, sequences: int, attention_pairs: int, context_tokens: int) -> StepWork:
        m = self.model
        return StepWork(
            linear_flops=2.0 * m.linear_params * tokens + 2.0 * m.lm_head_params * sequences,
            weight_bytes=float((m.linear_params + m.lm_head_params) * m.bytes_per_param),
            attention_flops=float(m.attention_flops_per_pair) * attention_pairs,
            kv_bytes=float(m.kv_bytes_per_token) * (context_tokens + 2 * tokens),
        )

    def step_time(
        self, prefill_tokens: int, decode_tokens: int, sequences: int = 0, attention_pairs: int = 0,
        context_tokens: int = 0,
    ) -> float:
        """Seconds of a step (see the module docstring); a step that computes nothing costs the
        overhead only."""
        tokens = prefill_tokens + decode_tokens
        if tokens == 0:
            return self.step_overhead_s
        return float(self._seconds(self.work(tokens, sequences, attention_pairs, context_tokens), max))

    def _seconds(self, w: StepWork, larger: Any) -> Any:
        """The roofline of ``w``: overhead + the larger of each part's compute and memory time
        (``larger``: ``max`` for one step, ``np.maximum`` for arrays of steps)."""
        peak, bw = self.gpu.peak_flops, self.gpu.hbm_bytes_per_s
        linear = larger(w.linear_flops / peak, w.weight_bytes / bw)
        attention = larger(w.attention_flops / peak, w.kv_bytes / (bw * self.kv_read_efficiency))
        return self.step_overhead_s + linear + attention

    def saturated_request_s(self, prompt_tokens: int, output_tokens: int, token_budget: int) -> float:
        """Seconds one request adds to an engine kept busy by others (the inverse of its
        no-cache capacity): its prompt prefilled (the first output token sampled there) and
        ``output_tokens - 1`` decode steps, after growing contexts. Each computed token pays
        its projections at peak FLOP/s (a full step is compute-bound) and its share of the step
        overhead (``tokens / token_budget`` of it); each prefill and decode pays its own
        attention roofline and each sample its lm_head row. The weights' read is the step's,
        hidden under its compute, and not charged."""
        m, peak, bw = self.model, self.gpu.peak_flops, self.gpu.hbm_bytes_per_s
        kv_bw = bw * self.kv_read_efficiency
        p, decodes = prompt_tokens, max(output_tokens - 1, 0)
        tokens = p + decodes
        seconds = 2.0 * m.linear_params * tokens / peak + 2.0 * m.lm_head_params * (1 + decodes) / peak
        seconds += self.step_overhead_s * tokens / token_budget
        pair_s, kv_s = m.attention_flops_per_pair / peak, m.kv_bytes_per_token / kv_bw
        seconds += max(pair_s * p * (p + 1) / 2, kv_s * 2 * p)
        return seconds + _decode_attention_s(pair_s, kv_s, p, decodes)

    def isolated_prefill_s(self, prompt_tokens: Any, hit_tokens: Any) -> Any:
        """A prefill of ``prompt - hit`` tokens after ``hit`` cached ones, alone in its step
        (array-wise): what its TTFT would be with nothing else running."""
        prompt, hit = np.asarray(prompt_tokens, dtype=np.float64), np.asarray(hit_tokens, dtype=np.float64)
        n = prompt - hit
        work = self.work(n, 1, n * hit + n * (n + 1) / 2, hit)  # type: ignore[arg-type]  # arrays
        return self._seconds(work, np.maximum)


def _decode_attention_s(pair_s: float, kv_s: float, first: int, steps: int) -> float:
    """Sum over the decode steps after ``first`` .. ``first + steps - 1`` tokens (one token after
    c: c + 1 query-key pairs, c + 2 tokens of KV traffic) of max(pair_s (c + 1), kv_s (c + 2)),
    in closed form: the compute roof wins from the crossing context on, if ever."""

    def ramp(lo: int, hi: int, offset: int) -> int:  # sum of c + offset over lo <= c < hi
        return (hi - lo) * (lo + hi - 1) // 2 + (hi - lo) * offset

    end = first + steps
    if pair_s <= kv_s:  # memory-bound at every context
        return kv_s * ramp(first, end, 2)
    cross = min(max(first, math.ceil((2 * kv_s - pair_s) / (pair_s - kv_s))), end)
    return kv_s * ramp(first, cross, 2) + pair_s * ramp(cross, end, 1)
