"""Study: a host-memory tier under the device pool, in both designs (issue 16).

One engine serves a Mooncake trace with its timestamps rescaled so that the offered work is
``LOAD`` of what it could serve with no cache (the same arrivals for every cell of a trace).
The device pool holds ``gpu`` tokens; the host tier ``host`` more (0: none). Designs:

- hashchain B=16 with vLLM 0.33's OffloadingConnector (chunks of one block, CPU LRU; ARC at
  one point): stored as prompt blocks fill, visible once the store is acknowledged, loaded
  asynchronously (the request computes from the step after its load);
- radix page 16 with SGLang 0.5.23's HiCache (write_through; write_through_selective and
  write_back at one point): host copies of tree nodes, loaded at admission in the same forward.

Per cell: device and host hit rates (``stats.hits`` / ``stats.host_hits`` over the prompt
tokens), TTFT p50/p90/p99 on the simulated clock (by default the GPU roofline of Llama-3-8B on
an H100 SXM, ``CLOCK``, as in the TTFT and engine-trace studies; ``--clock cpu`` the clock
measured on this CPU: each cell records its clock's constants, and its arrival rescale is that
clock's) with host loads on a PCIe Gen5 link
(``prefixcache.tiers.HostLink``: Llama-3-8B's 128 KiB a token at 50 GB/s), bytes moved per
host-hit token, host evictions. Beside them, one device pool of ``gpu + host`` tokens (a
replay): the pooled hit rate a local host tier could at most recover.

Scales: ``default`` the first ``limit`` requests of each trace, host 0 or 10M tokens (about 15
minutes on 2 cores); ``full`` every request, host 0, 10M or 50M tokens (hours).
Writes ``results/tiers/summary``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefixcache.experiments.figures.common import (
    MOONCAKE_TRACES,
    cell_config,
    check_scale,
    run_cells,
    save_study,
    study_main,
    trace_arrival_scale,
)

from prefixcache.cost_model import Clock, named_clock

STUDY = "tiers"
CLOCK = "h100-llama3-8b"  # the default clock (cost_model.named_clock); "cpu" is the other
LOAD = 0.7
PAGE = 16
# label -> (backend, host tier fields besides the size)
DESIGNS: dict[str, tuple[str, dict[str, Any]]] = {
    "hashchain": ("hashchain", {}),
    "radix": ("radix", {"write_policy": "write_through"}),
}
# Variants at one (gpu, host) point: the store trigger and the host policy.
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "hashchain-arc": ("hashchain", {"eviction_policy": "arc"}),
    "radix-selective": ("radix", {"write_policy": "write_through_selective"}),
    "radix-write-back": ("radix", {"write_policy": "write_back"}),
}
SCALE = {
    "tiny": dict(
        traces=["mooncake-synthetic"],
        limit=60,
        gpus=[1 << 17],
        hosts=[0, 1 << 19],
        variant_at=(1 << 17, 1 << 19),
    ),
    "default": dict(
        traces=list(MOONCAKE_TRACES),
        limit=1000,  # 13.7M prompt tokens (conversation): a 10M host tier already holds them
        gpus=[1_000_000, 3_000_000],
        hosts=[0, 10_000_000],
        variant_at=(1_000_000, 10_000_000),
    ),
    "full": dict(
        traces=list(MOONCAKE_TRACES),
        limit=None,
        gpus=[1_000_000, 3_000_000],
        hosts=[0, 10_000_000, 50_000_000],
        variant_at=(1_000_000, 10_000_000),
    ),
}


def tier_cell(
    source: str,
    limit: int | None,
    scale: float,
    label: str,
    backend: str,
    gpu: int,
    host: int,
    fields: dict[str, Any],
    clock: Clock,
) -> dict[str, Any]:
    options = {"host_tier": dict(fields, capacity_tokens=host)} if host else {}
    c = cell_config(
        STUDY,
        source=source,
        backend=backend,
        page_size=PAGE,
        capacity_tokens=gpu,
        options=options,
        label=label,
        limit=limit,
        clock=clock,
    )
    c.update(part="tiers", host_tokens=host, arrival_scale=scale)
    return c


def configs(scale: str, clock: str = CLOCK) -> list[dict[str, Any]]:
    """Every cell of ``scale``; engine cells under ``clock`` (a ``named_clock`` name)."""
    s = SCALE[check_scale(scale)]
    cost = named_clock(clock)
    out = []
    for source in s["traces"]:
        factor = trace_arrival_scale(source, s["limit"], cost, LOAD)
        for label, (backend, fields) in DESIGNS.items():
            for gpu in s["gpus"]:
                for host in s["hosts"]:
                    out.append(tier_cell(source, s["limit"], factor, label, backend, gpu, host, fields, cost))
                    if host:  # the pooled bound: one device pool as large as both tiers
                        c = cell_config(
                            STUDY,
                            source=source,
                            backend=backend,
                            page_size=PAGE,
                            capacity_tokens=gpu + host,
                            mode="replay",
                            label=f"pooled-{label}",
                            limit=s["limit"],
                        )
                        c.update(part="pooled", gpu_tokens=gpu, host_tokens=host)
                        out.append(c)
        gpu, host = s["variant_at"]
        for label, (backend, fields) in VARIANTS.items():
            out.append(tier_cell(source, s["limit"], factor, label, backend, gpu, host, fields, cost))
    return out


def run(out: Path, scale: str = "default", force: bool = False, jobs: int = 2, clock: str = CLOCK) -> Path:
    s = SCALE[check_scale(scale)]
    df = run_cells(configs(scale, clock), out, force=force, jobs=jobs)
    save_study(
        df,
        out,
        STUDY,
        {
            "scale": scale,
            "load": LOAD,
            "page_size": PAGE,
            "limit": s["limit"],
            "designs": list(DESIGNS),
            "variants": list(VARIANTS),
            "clock": clock,
            "clock_source": str(named_clock(clock)),
        },
    )
    return out / STUDY


def main(argv: list[str] | None = None) -> int:
    return study_main(run, SCALE, __doc__, argv, CLOCK)


if __name__ == "__main__":
    raise SystemExit(main())
