"""The simulated clock: seconds per engine step from the tokens computed in it.

Its three constants are measured, never typed: ``make calibrate``
(``experiments/bench/cost_model.py``) times model-mode engine steps, fits this linear model by
least squares and writes ``cost_model_measured.json`` beside this module (package data), with a
``label`` saying what was timed (e.g. model-mode CPU timing of a tiny Llama, not a GPU), the
machine, the model config and the fit quality. ``CostModel.measured()`` reads that file, and the
engine uses it unless handed constants of its own. A missing or malformed file is an error:
there are no fallback numbers.

The other clock is ``roofline.RooflineClock`` (a GPU and a model from public constants), with
the same ``step_time``; it also reads each step's attention work, which this one ignores
(``reads_context``). ``named_clock`` builds either by name, ``clock_from_constants`` from what
a study cell recorded.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from prefixcache.roofline import ROOFLINE_NAMES, RooflineClock

MEASURED_PATH = Path(__file__).with_name("cost_model_measured.json")
CONSTANTS = ("step_overhead_s", "prefill_token_s", "decode_token_s")
# Top-level fields every calibration record carries (see experiments/bench/cost_model.py).
RECORD_FIELDS = ("label", "constants", "machine", "model", "fit", "date")


@dataclass(frozen=True, slots=True)
class CostModel:
    """Simulated seconds per engine step: ``step_overhead_s + prefill_token_s * prefill tokens
    + decode_token_s * decode tokens``.

    Attention over the cached context is not charged: this model compares how much prefill a
    cache saves, not kernel speed. ``source`` says where the constants come from (the
    calibration label for ``measured()``); it does not take part in equality.
    """

    step_overhead_s: float
    prefill_token_s: float
    decode_token_s: float
    source: str = field(default="explicit constants", compare=False)
    reads_context = False  # charges tokens only: the engine need not count attention work

    def __post_init__(self) -> None:
        for name in CONSTANTS:
            value = getattr(self, name)
            ok = isinstance(value, int | float) and not isinstance(value, bool)
            if not ok or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0 (seconds), got {value!r}")

    @classmethod
    def measured(cls, path: Path | None = None) -> CostModel:
        """The constants of the calibration record at ``path`` (default: the packaged one)."""
        record = read_measured(path)
        return cls(**record["constants"], source=record["label"])

    def constants(self) -> dict[str, float]:
        """The three constants as a plain dict (what a study cell's config records)."""
        return {name: float(getattr(self, name)) for name in CONSTANTS}

    def step_time(
        self, prefill_tokens: int, decode_tokens: int, sequences: int = 0, attention_pairs: int = 0,
        context_tokens: int = 0,
    ) -> float:
        """Seconds of a step; the attention counts a context-reading clock takes
        (``roofline.RooflineClock``) are not charged here."""
        prefill = self.prefill_token_s * prefill_tokens
        return self.step_overhead_s + prefill + self.decode_token_s * decode_tokens

    def saturated_request_s(self, prompt_tokens: int, output_tokens: int, token_budget: int) -> float:
        """Seconds one request adds to an engine kept busy by others: its tokens' costs, the
        step overheads amortised by batching (not charged; ``token_budget`` is the roofline's
        concern)."""
        return self.prefill_token_s * prompt_tokens + self.decode_token_s * output_tokens

    def isolated_prefill_s(self, prompt_tokens: Any, hit_tokens: Any) -> Any:
        """A prefill of ``prompt - hit`` tokens alone in its step (array-wise)."""
        missed = np.asarray(prompt_tokens) - np.asarray(hit_tokens)
        return self.step_overhead_s + self.prefill_token_s * missed


# The engine's clocks: the measured linear one and the GPU roofline (same step_time signature).
Clock = CostModel | RooflineClock


def clock_from_constants(constants: dict[str, Any]) -> Clock:
    """The clock a study cell's config recorded (``constants()`` of either kind)."""
    if "clock" in constants:
        return RooflineClock.from_constants(constants)
    return CostModel(**constants)


def named_clock(name: str) -> Clock:
    """``cpu`` (the measured CPU clock, ``CostModel.measured()``) or a roofline preset such as
    ``h100-llama3-8b`` (``RooflineClock.named``); ValueError listing the valid names."""
    if name == "cpu":
        return CostModel.measured()
    if name not in ROOFLINE_NAMES:
        valid = ", ".join(("cpu (measured on a CPU)", *ROOFLINE_NAMES))
        raise ValueError(f"unknown clock {name!r}; valid: {valid}")
    return RooflineClock.named(name)


def read_measured(path: Path | None = None) -> dict[str, Any]:
    """The calibration record at ``path`` (default ``MEASURED_PATH``), checked: every field of
    ``RECORD_FIELDS``, a non-empty label and the three constants as finite numbers >= 0.
    FileNotFoundError if it is absent, ValueError if it is malformed."""
    path = MEASURED_PATH if path is None else Path(path)
    redo = "(write it with `make calibrate`)"
    if not path.is_file():
        raise FileNotFoundError(f"no cost-model calibration file {path} {redo}")
    try:
        record = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"cost-model calibration file {path} is not valid JSON: {e} {redo}") from e
    if not isinstance(record, dict):
        raise ValueError(f"cost-model calibration file {path} must hold a JSON object {redo}")
    missing = [name for name in RECORD_FIELDS if name not in record]
    if missing:
        raise ValueError(f"cost-model calibration file {path} lacks {missing} {redo}")
    if not isinstance(record["label"], str) or not record["label"].strip():
        raise ValueError(f"cost-model calibration file {path}: label must be a non-empty string")
    constants = record["constants"]
    if not isinstance(constants, dict) or sorted(constants) != sorted(CONSTANTS):
        raise ValueError(
            f"cost-model calibration file {path}: constants must have exactly {list(CONSTANTS)}, "
            f"got {constants!r}"
        )
    try:
        CostModel(**constants)
    except ValueError as e:
        raise ValueError(f"cost-model calibration file {path}: {e}") from e
    return record
