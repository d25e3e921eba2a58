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

Scales: ``default`` the first ``limit`` requests of each trace, host 0 or 10M tokens, the
variants at one point (about 15 minutes on 2 cores; the small default, in ``make reproduce``);
``full`` every request of both traces, device 1M or 3M, host 0, 10M, 50M or unbounded, every
write policy of each design at every host point and the pooled replay at every point (host 0
included: the device pool alone, replayed), and one pool of the host's size alone, replayed (a
host that keeps a copy of everything on the device holds at most that much: the inclusive
bound). "Unbounded": there is no host tier without a size
(vLLM sizes its CPU blocks and SGLang its host pool from a byte count), so it is a host of
``trace_tokens`` tokens, every prompt and output token of the trace, page-aligned: more than any
run can store (vLLM stores prompt blocks only, SGLang a token once per tree path), so it never
evicts, which the full table checks. The default scale writes ``results/tiers/summary``;
``--scale full`` (``make tiers-full``, hours: ``--traces``/``--gpus`` run part of the grid, and a
rerun skips finished cells) writes the committed ``results/tiers_full/``: ``summary.csv`` (hit
rates over the prompt tokens of the whole trace, the engine study's denominator, with 95%
intervals over conversations, and each tier cell's paired gap to its pooled bound),
``runtime.csv`` (each cell's wall time) and ``meta.json`` (the part of the grid it holds, the
executor, the wall time).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from prefixcache.experiments.figures.common import (
    MOONCAKE_TRACES,
    cell_config,
    check_scale,
    executor_options,
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
POLICIES = {**DESIGNS, **VARIANTS}  # every write policy of each design
UNBOUNDED = "unbounded"  # a host size: every token of the trace (``trace_tokens``)
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
        hosts=[0, 10_000_000, 50_000_000, UNBOUNDED],
        variant_at=None,  # every policy at every host point
    ),
}


def trace_tokens(source: str, limit: int | None) -> int:
    """Every prompt and output token of the trace's first ``limit`` requests, rounded up to a
    page: the "unbounded" host tier, which can never fill."""
    from prefixcache.experiments.inputs.traces import read_mooncake

    records = read_mooncake(MOONCAKE_TRACES[source])[:limit]
    tokens = sum(r.input_length + r.output_length for r in records)
    return -(-tokens // PAGE) * PAGE


def host_size(host: int | str, source: str, limit: int | None) -> int:
    return trace_tokens(source, limit) if host == UNBOUNDED else int(host)


def host_name(host: int, source: str, limit: int | None) -> str:
    """How the tables name a host size: "0", "10M", ..., or "unbounded"."""
    if host and host == trace_tokens(source, limit):
        return UNBOUNDED
    return f"{host / 1e6:g}M" if host else "0"


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


def pooled_cell(
    source: str, limit: int | None, label: str, backend: str, gpu: int, host: int
) -> dict[str, Any]:
    """The pooled bound of a (device, host) point: one device pool as large as both, replayed."""
    c = cell_config(
        STUDY,
        source=source,
        backend=backend,
        page_size=PAGE,
        capacity_tokens=gpu + host,
        mode="replay",
        label=f"pooled-{label}",
        limit=limit,
    )
    c.update(part="pooled", gpu_tokens=gpu, host_tokens=host)
    return c


def host_pool_cell(source: str, limit: int | None, label: str, backend: str, host: int) -> dict[str, Any]:
    """The inclusive bound of a host size: one device pool of the host's size alone, replayed."""
    c = cell_config(
        STUDY,
        source=source,
        backend=backend,
        page_size=PAGE,
        capacity_tokens=host,
        mode="replay",
        label=f"host-pool-{label}",
        limit=limit,
    )
    c.update(part="host-pool", host_tokens=host)
    return c


def configs(
    scale: str, clock: str = CLOCK, traces: list[str] | None = None, gpus: list[int] | None = None
) -> list[dict[str, Any]]:
    """Every cell of ``scale``; engine cells under ``clock`` (a ``named_clock`` name); of the
    full grid, only ``traces`` and ``gpus`` if given (a part of it, run first)."""
    s = SCALE[check_scale(scale)]
    for name, asked, grid in (("trace", traces, s["traces"]), ("device size", gpus, s["gpus"])):
        stray = set(asked or ()) - set(grid)
        if stray:
            raise ValueError(f"{sorted(stray)}: not a {name} of the {scale} scale; valid: {grid}")
    cost = named_clock(clock)
    everywhere = s["variant_at"] is None
    out = []
    for source in s["traces"]:
        if traces is not None and source not in traces:
            continue
        factor = trace_arrival_scale(source, s["limit"], cost, LOAD)
        for label, (backend, fields) in (POLICIES if everywhere else DESIGNS).items():
            for gpu in s["gpus"]:
                if gpus is not None and gpu not in gpus:
                    continue
                for name in s["hosts"]:
                    host = host_size(name, source, s["limit"])
                    if host == 0 and label not in DESIGNS:
                        continue  # no host tier: no write policy
                    out.append(tier_cell(source, s["limit"], factor, label, backend, gpu, host, fields, cost))
                    if label in DESIGNS and (host or everywhere):
                        out.append(pooled_cell(source, s["limit"], label, backend, gpu, host))
        if everywhere:  # the inclusive bound, one a host size (it has no device part)
            for label, (backend, _) in DESIGNS.items():
                for name in s["hosts"]:
                    if host := host_size(name, source, s["limit"]):
                        out.append(host_pool_cell(source, s["limit"], label, backend, host))
        else:
            gpu, host = s["variant_at"]
            for label, (backend, fields) in VARIANTS.items():
                out.append(tier_cell(source, s["limit"], factor, label, backend, gpu, host, fields, cost))
    return out


def run(
    out: Path,
    scale: str = "default",
    force: bool = False,
    jobs: int = 2,
    clock: str = CLOCK,
    executor: str = "joblib",
    address: str | None = None,
    traces: list[str] | None = None,
    gpus: list[int] | None = None,
) -> Path:
    s = SCALE[check_scale(scale)]
    if scale != "full" and (traces or gpus):
        raise ValueError("--traces and --gpus pick a part of the full grid: they need --scale full")
    t0 = time.perf_counter()
    cfgs = configs(scale, clock, traces, gpus)
    df = run_cells(cfgs, out, force=force, jobs=jobs, executor=executor, address=address)
    if scale == "full":
        part = dict(traces=traces or s["traces"], gpus=gpus or s["gpus"])
        meta = dict(
            command=" ".join(sys.argv),
            date=time.strftime("%Y-%m-%d"),
            executor=executor,
            jobs=jobs,
            clock=clock,
            **part,
            cells=len(cfgs),
            grid_cells=len(configs(scale, clock)),
        )
        from prefixcache.experiments.figures.study_tiers_full import write_full

        return write_full(out, cfgs, df, meta, time.perf_counter() - t0)
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


def full_options(ap: argparse.ArgumentParser) -> None:
    executor_options(ap)
    ap.add_argument(
        "--traces", nargs="+", choices=list(MOONCAKE_TRACES), help="full scale: only these traces"
    )
    ap.add_argument("--gpus", nargs="+", type=int, help="full scale: only these device sizes (tokens)")


def main(argv: list[str] | None = None) -> int:
    return study_main(run, SCALE, __doc__, argv, CLOCK, more=full_options)


if __name__ == "__main__":
    raise SystemExit(main())
