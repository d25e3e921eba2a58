"""What the engine records of each request: the tidy rows the research layer analyses."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class RequestRecord:
    """What happened to one request. Times are simulated seconds, steps engine step numbers."""

    request_id: str
    arrival_time: float
    prompt_tokens: int
    max_new_tokens: int
    admission_step: int | None = None
    admission_time: float | None = None
    hit_tokens: int = 0  # reused at first admission (resumptions are not hits of the workload)
    computed_prefill_tokens: int = 0  # KV computed in prefill, recomputation after preemption included
    output_tokens: int = 0
    preemptions: int = 0
    evicted_tokens: int = 0  # cached tokens the cache evicted to make room for this request
    first_token_step: int | None = None
    first_token_time: float | None = None
    finish_step: int | None = None
    finish_time: float | None = None
    cache_op_ns: int = 0  # wall time inside cache calls made for this request
    rejected: bool = False  # could never fit in the cache; never admitted
