"""Study: the prefix cache as a timing side channel between tenants, and what salt costs.

Attack cells: each design (radix page 1, radix page 16, hashchain B=16) x salt (none, one
``cache_salt`` per tenant) x background load (a fraction of the no-cache prefill capacity) x
seed runs ``side_channel.simulate``: a victim's secret is cached, the attacker calibrates on
its own decoys (one threshold per guess position) and probes with whole candidates and token
by token, amid other tenants' Poisson traffic, under the simulated clock: by default the GPU
roofline of Llama-3-8B on an H100 SXM (``CLOCK``, as in the TTFT and engine-trace studies),
``--clock cpu`` the clock measured on this CPU (each cell records its clock's constants);
``side_channel.evaluate`` scores it (balanced accuracy, chance 0.5; bits per probe). Salt
cells: the token hit rate of a multi-tenant shared-document workload with and without
per-tenant salt, per design, tenant count and seed. Seeds vary the secrets, the probes and
the background arrivals.

The model-mode (wall-clock) version of the attack is not part of this study: its numbers are
measured, so ``make side-channel-timing`` writes them to results/bench/ and the figure reads
them from there.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
from prefixcache.experiments.analysis.side_channel import (
    CAPACITY_TOKENS,
    DESIGNS,
    AttackConfig,
    evaluate,
    salt_cost_hit_rate,
    simulate,
)
from prefixcache.experiments.figures.common import (
    cell_name,
    check_scale,
    save_study,
    study_main,
    write_table,
)
from prefixcache.experiments.run_store import flat_config

from prefixcache.cost_model import clock_from_constants, named_clock

STUDY = "side_channel"
HEADLINE_LOAD = 0.1  # the load the paper's per-design numbers are quoted at (in every scale)
SCALE: dict[str, dict[str, Any]] = {
    "tiny": dict(loads=[0.0, HEADLINE_LOAD], seeds=2, tenants=[4], salt_requests=32,
                 attack=dict(whole_victims=4, token_victims=1)),
    "default": dict(loads=[0.0, HEADLINE_LOAD, 0.3], seeds=5, tenants=[4, 16], salt_requests=128, attack={}),
    "full": dict(loads=[0.0, 0.05, HEADLINE_LOAD, 0.2, 0.3, 0.5], seeds=10, tenants=[2, 4, 16, 64],
                 salt_requests=256, attack={}),
}
CELL_VERSION = 2  # bump when a cell's rows change meaning: stored cells of another version rerun
CLOCK = "h100-llama3-8b"  # the default clock (cost_model.named_clock); "cpu" is the other


def clock_constants(clock: str = CLOCK) -> dict[str, Any]:
    """``clock``'s constants, as a cell's config records them (so cells stored under another
    clock are rerun, never reused)."""
    return named_clock(clock).constants()


def _base(mode: str, design: str, seed: int, salted: bool, clock: dict[str, Any]) -> dict[str, Any]:
    backend, page_size = DESIGNS[design]
    return dict(study=STUDY, source=mode, mode=mode, label=design, backend=backend, page_size=page_size,
                capacity_tokens=CAPACITY_TOKENS, design=design, salted=salted, seed=seed,
                cost_model=clock, version=CELL_VERSION)


def attack_configs(scale: str, clock_name: str = CLOCK) -> list[dict[str, Any]]:
    s = SCALE[check_scale(scale)]
    attack, clock = dataclasses.asdict(AttackConfig(**s["attack"])), clock_constants(clock_name)
    return [{**_base("attack", design, seed, salted, clock), "load": load, "attack_config": attack}
            for load in s["loads"] for seed in range(s["seeds"]) for design in DESIGNS
            for salted in (False, True)]


def salt_configs(scale: str, clock_name: str = CLOCK) -> list[dict[str, Any]]:
    s = SCALE[check_scale(scale)]
    clock = clock_constants(clock_name)
    return [{**_base("salt-cost", design, seed, salted, clock), "tenants": tenants,
             "num_requests": s["salt_requests"]}
            for tenants in s["tenants"] for seed in range(s["seeds"]) for design in DESIGNS
            for salted in (False, True)]


def attack_rows(config: dict[str, Any], folder: Path) -> list[dict[str, Any]]:
    """One attack cell: its probes (kept in ``folder``) and a row per attack."""
    probes = simulate(config["design"], AttackConfig(**config["attack_config"]), config["seed"],
                      config["salted"], config["load"], clock_from_constants(config["cost_model"]))
    write_table(probes, folder / "probes")
    return evaluate(probes, config["page_size"])


def salt_rows(config: dict[str, Any], folder: Path) -> list[dict[str, Any]]:
    rate = salt_cost_hit_rate(config["design"], config["seed"], config["tenants"], config["salted"],
                              config["num_requests"], cost=clock_from_constants(config["cost_model"]))
    return [dict(hit_rate=rate)]


def run_cell(config: dict[str, Any], out: Path, force: bool,
             compute: Callable[[dict[str, Any], Path], list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """``compute``'s rows for one cell, read back from its folder if it holds the same config;
    each row carries the cell's config fields."""
    folder = out / STUDY / cell_name(config)
    summary = folder / "summary.json"
    stored = folder / "config.json"
    if not force and summary.exists() and json.loads(stored.read_text()) == json.loads(json.dumps(config)):
        return list(json.loads(summary.read_text())["rows"])
    folder.mkdir(parents=True, exist_ok=True)
    rows = [{**flat_config(config), **r, "cell": folder.name} for r in compute(config, folder)]
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    summary.write_text(json.dumps({"rows": rows}, indent=2))
    return rows


def run_all(configs: list[dict[str, Any]], out: Path, force: bool, jobs: int,
            compute: Callable[[dict[str, Any], Path], list[dict[str, Any]]]) -> pd.DataFrame:
    from joblib import Parallel, delayed

    if jobs <= 1:
        results = [run_cell(c, out, force, compute) for c in configs]
    else:
        results = Parallel(n_jobs=jobs)(delayed(run_cell)(c, out, force, compute) for c in configs)
    return pd.DataFrame([row for rows in results for row in rows])


def run(out: Path, scale: str = "default", force: bool = False, jobs: int = 2, clock: str = CLOCK) -> Path:
    attacks = run_all(attack_configs(scale, clock), out, force, jobs, attack_rows)
    salts = run_all(salt_configs(scale, clock), out, force, jobs, salt_rows)
    write_table(salts, out / STUDY / "salt_cost")
    save_study(attacks, out, STUDY, {"scale": scale, **SCALE[scale], "headline_load": HEADLINE_LOAD,
                                     "capacity_tokens": CAPACITY_TOKENS, "cost_model": clock_constants(clock),
                                     "clock": clock, "clock_source": str(named_clock(clock))})
    return out / STUDY


def main(argv: list[str] | None = None) -> int:
    return study_main(run, SCALE, __doc__, argv, CLOCK)


if __name__ == "__main__":
    raise SystemExit(main())
