"""The simulated clock: seconds per engine step from the tokens computed in it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CostModel:
    """Simulated seconds per engine step: ``step_overhead_s + prefill_token_s * prefill tokens
    + decode_token_s * decode tokens``.

    Defaults are rough figures for an 8B model on one H100-class GPU (about 20k prefill
    tokens/s, 5 ms to stream the weights once per step). Attention over the cached context is
    not charged: this model compares how much prefill a cache saves, not kernel speed.
    """

    step_overhead_s: float = 0.005
    prefill_token_s: float = 5e-5
    decode_token_s: float = 2e-5

    def step_time(self, prefill_tokens: int, decode_tokens: int) -> float:
        prefill = self.prefill_token_s * prefill_tokens
        return self.step_overhead_s + prefill + self.decode_token_s * decode_tokens
