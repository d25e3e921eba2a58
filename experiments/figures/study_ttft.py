"""Study: time to first token against the cache hit rate (SGLang Fig. 8a/b analogue).

SGLang varies how much of each prompt is shared and plots TTFT against the hit rate that
results. Here: SGLang's generated-shared-prefix workload with a fixed prompt length and a
shared system prompt of ``fraction`` of it, Poisson arrivals at a utilisation of the clock's
no-cache capacity, prefill and decode (the same arrival sample at every sweep point: common
random numbers), several seeds, served by the simulated engine (queueing included) under two
clocks: the GPU roofline of Llama-3-8B on an H100 SXM (``roofline.RooflineClock``, the
default) and the clock measured on this CPU (``CostModel``: a fixed step overhead plus
per-token prefill and decode costs). Beside the measured TTFT, ``metrics.isolated_ttft_s``
gives the no-queue estimate: the missed tokens prefilled alone in one step. Backends at their
native page sizes, and the no-reuse baseline.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefixcache.experiments.analysis.metrics import isolated_ttft_s
from prefixcache.experiments.figures.common import (
    cell_config,
    cell_name,
    check_scale,
    read_table,
    run_cells,
    save_study,
    study_main,
)

from prefixcache.cost_model import Clock, clock_from_constants, named_clock

STUDY = "ttft"
BACKENDS = [("radix", 1), ("hashchain", 16), ("none", 16)]
PROMPT_LEN = 1024
OUTPUT_LEN = 16
SCALE = {
    "tiny": dict(fractions=[0.0, 0.75], utilisations=[0.6], groups=2, per_group=6, seeds=2),
    "default": dict(fractions=[0.0, 0.5, 0.875], utilisations=[0.3, 0.6, 0.9], groups=4, per_group=32,
                    seeds=5),
    "full": dict(fractions=[0.0, 0.25, 0.5, 0.75, 0.875, 0.95], utilisations=[0.3, 0.45, 0.6, 0.75, 0.9],
                 groups=8, per_group=64, seeds=10),
}
CAPACITY_TOKENS = 1 << 17
TOKEN_BUDGET = 2048  # the cells' (cell_config's default)
CLOCKS = ("h100-llama3-8b", "cpu")  # cost_model.named_clock names; the first is the paper's main one


def no_cache_capacity_rps(cost: Clock) -> float:
    """Requests per second ``cost``'s engine can serve with no cache at all: each request's
    prompt prefilled and its answer decoded, in steps kept full by other requests
    (``saturated_request_s``): utilisation 1.0. Decode counts: under the measured CPU clock a
    decoded token costs several prefilled ones, so a prefill-only capacity would put the top
    sweep point past saturation."""
    return 1.0 / cost.saturated_request_s(PROMPT_LEN, OUTPUT_LEN, TOKEN_BUDGET)


def configs(scale: str) -> list[dict[str, Any]]:
    """Every (clock, shared fraction, utilisation, seed, backend) cell. With one seed, every
    cell sees the same arrival sample scaled to its rate (workloads draw arrivals from a stream
    of their own), so sweep points differ only in what they sweep."""
    s = SCALE[check_scale(scale)]
    out = []
    for clock_name in CLOCKS:
        clock = named_clock(clock_name)
        for frac in s["fractions"]:
            shared = round(frac * PROMPT_LEN)
            for util in s["utilisations"]:
                params = dict(num_groups=s["groups"], prompts_per_group=s["per_group"],
                              system_prompt_len=shared, question_len=PROMPT_LEN - shared,
                              output_len=OUTPUT_LEN, shuffle=True,
                              request_rate=round(util * no_cache_capacity_rps(clock), 6))
                if shared == 0:  # no system prompt at all: the workload needs a non-empty one
                    params.update(system_prompt_len=1, question_len=PROMPT_LEN - 1)
                for seed in range(s["seeds"]):
                    for backend, page in BACKENDS:
                        c = cell_config(STUDY, source="generated-shared-prefix", backend=backend,
                                        page_size=page, capacity_tokens=CAPACITY_TOKENS, scheduler="lpm",
                                        params=params, seed=seed, token_budget=TOKEN_BUDGET, clock=clock)
                        c["shared_fraction"], c["utilisation"], c["clock"] = frac, util, clock_name
                        out.append(c)
    return out


def isolated_estimates(configs_: list[dict[str, Any]], out: Path) -> list[float]:
    """Mean no-queue TTFT per cell, from its stored per-request table, under its own clock."""
    values = []
    for c in configs_:
        df = read_table(out / STUDY / cell_name(c) / "requests")
        df = df[~df["rejected"]]
        cost = clock_from_constants(c["cost_model"])
        values.append(float(isolated_ttft_s(df["prompt_tokens"], df["hit_tokens"], cost).mean()))
    return values


def run(out: Path, scale: str = "default", force: bool = False, jobs: int = 2) -> Path:
    cfgs = configs(scale)
    df = run_cells(cfgs, out, force=force, jobs=jobs)
    df["isolated_ttft_mean_s"] = isolated_estimates(cfgs, out)
    save_study(df, out, STUDY, {"scale": scale, **SCALE[scale], "prompt_len": PROMPT_LEN,
                                "capacity_tokens": CAPACITY_TOKENS,
                                "clocks": {name: str(named_clock(name)) for name in CLOCKS}})
    return out / STUDY


def main(argv: list[str] | None = None) -> int:
    return study_main(run, SCALE, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
