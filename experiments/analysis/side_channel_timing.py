"""Model mode of the side-channel study: the probes of ``side_channel`` timed on the wall clock.

The same scenario (victims, decoys, probes; ``side_channel.build_scenario``) is served one
request at a time by the engine in model mode: a random-weight Llama computes the KV of each
request's uncached tokens on this CPU (``attention_impl="reference"``, PyTorch SDPA, not the
Triton interpreter), and a probe's TTFT is the wall time from handing it to the engine to its
first token (lookup, allocation, the prefill of its missed tokens, the logits, the commit). No
background traffic: the noise is the machine's own. The attacker calibrates and calls hits
exactly as in simulation (``side_channel.evaluate``, applied by the figure).

Model size (``MODEL``): 2 layers of width 512 with an 8k vocabulary. Small enough that a cell
takes seconds, large enough that one prefill token costs a measurable fraction of a millisecond
on one core (the whole-candidate attack's hit/miss gap, divided by the tokens it saves, is the
per-token cost; the figure reports it). A 32k vocabulary would make every step mostly the
output projection, the same for hit and miss. One torch thread and the garbage collector
paused while timing: less jitter from the machine, none from Python.

Wall-clock numbers cannot be byte-reproduced, so the result is committed and only this script
rewrites it (``make side-channel-timing``; run it on a quiet machine, under 2 minutes):

    python -m prefixcache.experiments.analysis.side_channel_timing [--quick] [--out PATH]

writes ``results/bench/side_channel_model_mode.csv`` (one row per probe) and, beside it, a
``.json`` with the machine, versions, model and attack configs and the date.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from prefixcache.experiments.analysis.side_channel import (
    DESIGNS,
    PROBE_COLUMNS,
    AttackConfig,
    build_scenario,
    evaluate,
    make_design_cache,
)
from prefixcache.experiments.bench.ops import collector_off
from prefixcache.experiments.figures.common import REPO_ROOT

from prefixcache import Engine, Request
from prefixcache.model import Model, ModelConfig

MODEL = ModelConfig(vocab_size=8192, n_layers=2, dim=512, n_heads=8, n_kv_heads=4, intermediate_size=1376)
# Fewer probes than the simulation's (the run must stay under 2 minutes): a 16-token secret,
# so the token attack's last guess completes a 16-token block.
ATTACK = AttackConfig(secret_len=16, whole_victims=6, token_victims=1, vocab_size=MODEL.vocab_size)
SEEDS = 5
# --quick (the test's): a tiny model and few probes, to check the pipeline, not to measure.
QUICK_MODEL = ModelConfig(vocab_size=512, n_layers=1, dim=64, n_heads=4, n_kv_heads=2, intermediate_size=172)
QUICK_ATTACK = AttackConfig(prefix_len=16, secret_len=16, question_len=4, filler_len=4, whole_victims=2,
                            token_victims=1, vocab_size=QUICK_MODEL.vocab_size)
CAPACITY_TOKENS = 1 << 14  # holds a cell's every request (checked: nothing is evicted)
WARMUP_REQUESTS = 3
OUT = REPO_ROOT / "results" / "bench" / "side_channel_model_mode.csv"
LABEL = "model-mode wall-clock CPU timing (random-weight Llama, reference attention, 1 thread)"


def serve(engine: Engine, req: Request) -> float:
    """Wall seconds from handing ``req`` to an idle engine to its first (only) token."""
    t0 = time.perf_counter()
    engine.add_request(req)
    while engine.has_unfinished():
        engine.step()
    return time.perf_counter() - t0


def time_cell(design: str, seed: int, salted: bool, model_config: ModelConfig,
              attack: AttackConfig) -> pd.DataFrame:
    """One (design, salt, seed) cell: warm-up, plants, then every probe timed; the probes'
    rows as ``side_channel.probe_frame`` makes them, ``ttft_s`` being wall time."""
    cache = make_design_cache(design, CAPACITY_TOKENS)
    model = Model(model_config, cache.config.num_pages, cache.page_size, attention_impl="reference",
                  seed=seed)
    engine = Engine(cache, "fcfs", model=model, seed=seed)
    scenario = build_scenario(attack, seed, salted)
    half = attack.vocab_size // 2
    for i in range(WARMUP_REQUESTS):  # first steps are slow (allocations); a namespace of their own
        prompt = [half + (7 * i + j) % half for j in range(attack.probe_len)]
        serve(engine, Request(f"warmup-{i}", prompt, cache_salt="warmup", max_new_tokens=1))
    for req in scenario.plants:
        serve(engine, req)
    rows = []
    for p in scenario.probes:
        ttft = serve(engine, p.request)
        rec = engine.records[p.request.request_id]
        rows.append((p.attack, p.phase, p.truth, p.guess_end, p.pair, rec.hit_tokens, ttft))
    if cache.stats.evicted_tokens:
        raise RuntimeError(f"{design} seed {seed}: the pool evicted {cache.stats.evicted_tokens} tokens")
    df = pd.DataFrame(rows, columns=PROBE_COLUMNS)
    df.insert(0, "design", design)
    df.insert(1, "salted", salted)
    df.insert(2, "seed", seed)
    return df


def measure(model_config: ModelConfig, attack: AttackConfig, seeds: int) -> pd.DataFrame:
    """Every cell, seed-major (a slow spell of the machine then hits every design alike)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with collector_off():
            frames = [time_cell(design, seed, salted, model_config, attack)
                      for seed in range(seeds) for design in DESIGNS for salted in (False, True)]
    finally:
        torch.set_num_threads(threads)
    return pd.concat(frames, ignore_index=True)


def metadata(model_config: ModelConfig, attack: AttackConfig, seeds: int, wall_s: float) -> dict[str, Any]:
    return dict(
        label=LABEL, date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        machine=dict(platform=platform.platform(), processor=platform.processor() or platform.machine(),
                     cpu_count=os.cpu_count(), load_average=list(os.getloadavg())),
        torch=torch.__version__, threads=1, model=dataclasses.asdict(model_config),
        attack=dataclasses.asdict(attack), seeds=seeds, wall_s=round(wall_s, 1),
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny model, few probes, 1 seed: a smoke run")
    ap.add_argument("--seeds", type=int, default=None)
    ap.add_argument("--out", type=Path, default=OUT, help="the CSV (a .json of metadata beside it)")
    a = ap.parse_args(argv)
    model_config, attack = (QUICK_MODEL, QUICK_ATTACK) if a.quick else (MODEL, ATTACK)
    seeds = a.seeds if a.seeds is not None else (1 if a.quick else SEEDS)
    t0 = time.perf_counter()
    df = measure(model_config, attack, seeds)
    wall = time.perf_counter() - t0
    a.out.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(a.out, index=False, float_format="%.9g")
    meta = metadata(model_config, attack, seeds, wall)
    a.out.with_suffix(".json").write_text(json.dumps(meta, indent=2) + "\n")
    for (design, salted), g in df.groupby(["design", "salted"], sort=False):
        scores = [evaluate(s, DESIGNS[design][1]) for _, s in g.groupby("seed")]
        acc = {r["attack"]: sum(x[i]["accuracy"] for x in scores) / len(scores)
               for i, r in enumerate(scores[0])}
        print(f"{design:14s} salt={salted!s:5s} "
              + " ".join(f"{k}={v:.3f}" for k, v in acc.items()))
    print(f"side-channel timing: {len(df)} probes in {wall:.0f} s -> {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
