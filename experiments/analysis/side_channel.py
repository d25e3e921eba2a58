"""The prefix cache as a timing side channel between tenants, and what ``cache_salt`` costs.

A victim's prompt is ``public system prompt + secret + question``; once served, its KV is
cached. An attacker sharing the server sends probes and reads cache hits off its own time to
first token (TTFT: ``first_token_time - arrival_time``), with two attacks:

- ``whole``: whole-candidate. Each probe is ``public + candidate secret + filler``; per victim
  the attacker probes the true secret once and one wrong candidate once.
- ``token``: token-by-token extension. Knowing ``secret[:i]`` (we hand it the true prefix, so
  each step is scored on its own), a probe is ``public + secret[:i] + guess + filler``; per
  position it probes the true next token and one wrong token, positions in increasing order.

Balanced classes: every real probe has a wrong twin, and accuracy is *balanced* accuracy (the
mean of the hit and the miss recall), so chance is exactly 0.5 whatever the mix.

Probes must not hit the attacker's own earlier probes (else salt would seem to leak the
attacker's own cache): every candidate sequence is probed at most once; no two secrets or wrong
guesses share a first token, so no guess shares a token with another plant or probe; the
filler after a guess is fresh and drawn from a token range no secret, question or guess uses,
so a cached probe never extends a later guess; and a token attack goes position by position,
so at position ``i`` both twins find the same own-cached ``public + secret[:i]`` (from the true
probe at ``i - 1``).

Granularity: a guess shows only once the block it ends completes, so with 16-token pages a
token guess leaks at block-completing positions only, and a whole candidate only through the
whole pages it fills.

Calibration: the attacker plants its own decoy prompts (same shape, its own tenant), then
probes them exactly as it will probe the victim, so it knows which of those probes hit. Per
guess position (probes of one position cost the same to compute) its threshold is the one that
maximises balanced accuracy on those calibration probes; a probe is called a hit if its TTFT is
below it. With per-tenant salt the calibration still works (the
attacker's own namespace leaks to itself), but no probe of the victim can hit.

Bits per probe: a probe is a binary channel from the truth (right guess or not) to the call
(hit or not). ``1 - H2(accuracy)`` is the capacity of the binary symmetric channel with
crossover ``1 - accuracy``; for the real, possibly asymmetric channel with equiprobable inputs
and the same balanced accuracy it is a lower bound on the mutual information (symmetrising a
channel can only lose information: mutual information is convex in the channel).

Simulation runs ``Engine`` under the clock it is handed (a ``cost_model.Clock``: the study's
GPU roofline or the measured CPU clock; by default the engine's own, ``default_cost_model``) with
background tenants (SGLang's generated-shared-prefix workload, Poisson arrivals at a fraction
``load`` of the no-cache prefill capacity) so that probes queue behind real traffic.
``side_channel_timing`` runs the same probes through the model with wall-clock timing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pandas as pd
from prefixcache.experiments.analysis.metrics import mean_ci95
from prefixcache.experiments.figures.common import build_cache
from prefixcache.experiments.inputs.workloads import make_workload

from prefixcache import CacheConfig, Engine, PrefixCache, Request, make_cache
from prefixcache.cost_model import Clock

# name -> (backend, page size): the three designs the study compares.
DESIGNS: dict[str, tuple[str, int]] = {
    "radix-p1": ("radix", 1),
    "radix-p16": ("radix", 16),
    "hashchain-p16": ("hashchain", 16),
}
ATTACKS = ("whole", "token")
SCENARIO_STREAM = 0x51DE  # the scenario's own seed sequence, apart from the background's
BACKGROUND_PROMPT = (256, 256)  # system prompt, question of each background request
BACKGROUND_OUTPUT = 16
BACKGROUND_TENANTS = 4
CAPACITY_TOKENS = 1 << 16  # the smallest pool of a simulated cell (grown to hold all it sends)
PROBE_COLUMNS = ["attack", "phase", "truth", "guess_end", "pair", "hit_tokens", "ttft_s"]
TOKEN_BUDGET = 2048  # tokens per engine step (vLLM's default max_num_batched_tokens)


@dataclass(frozen=True, slots=True)
class AttackConfig:
    """Shape of the attack. ``prefix_len`` is block-aligned, and ``secret_len`` = 24 ends mid-block
    at 16-token pages, so the last 8 secret tokens share a block with the victim's question."""

    prefix_len: int = 64
    secret_len: int = 24
    question_len: int = 16
    filler_len: int = 8
    whole_victims: int = 16  # victims (and as many decoys) of the whole-candidate attack
    token_victims: int = 4  # secrets (and as many decoys) probed token by token
    # Simulation: probes arrive this many no-cache probe prefills apart (plus a jitter of up to
    # half of it), so that a probe never queues behind the attacker's previous one.
    probe_spacing: float = 10.0
    vocab_size: int = 32_000

    def __post_init__(self) -> None:
        for name in ("prefix_len", "secret_len", "question_len", "filler_len", "whole_victims",
                     "token_victims", "vocab_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"AttackConfig.{name} must be an int >= 1, got {value!r}")
        firsts = 4 * (self.whole_victims + self.token_victims)  # distinct first tokens drawn
        if self.vocab_size // 2 <= firsts:
            raise ValueError(f"vocab_size={self.vocab_size}: half of it (the guesses' tokens) must "
                             f"exceed the {firsts} distinct first tokens of secrets and wrong guesses")
        if not self.probe_spacing >= 0:
            raise ValueError(f"probe_spacing must be >= 0, got {self.probe_spacing!r}")

    @property
    def probe_len(self) -> int:
        """Tokens of a whole-candidate probe (a token probe is shorter)."""
        return self.prefix_len + self.secret_len + self.filler_len


class Probe(NamedTuple):
    """One attacker request and what the attacker knows about it."""

    request: Request
    attack: str  # "whole" | "token"
    phase: str  # "calibrate" (a decoy the attacker planted) | "attack" (the victim)
    truth: bool  # the guess is right: a hit is possible
    guess_end: int  # prompt tokens up to the end of the guess (a block completes if B divides it)
    pair: int  # the right guess and its wrong twin share it


class Scenario(NamedTuple):
    plants: list[Request]  # victims' prompts and the attacker's decoys, served before any probe
    probes: list[Probe]  # in the order sent


def salt_of(tenant: str, salted: bool) -> str | None:
    """Per-tenant salt (vLLM's ``cache_salt``): the tenant's name, or no salt at all."""
    return tenant if salted else None


def build_scenario(cfg: AttackConfig, seed: int, salted: bool, start_s: float = 0.0,
                   gap_s: float = 0.0) -> Scenario:
    """The victims, the decoys and the probes of one seed (plants arrive at 0, probes from
    ``start_s`` on, ``gap_s`` apart plus a jitter of up to half of it). Sent in this order:
    whole-candidate calibration, whole-candidate attack, token calibration, token attack."""
    rng = np.random.default_rng((seed, SCENARIO_STREAM))
    half = cfg.vocab_size // 2  # [0, half): prompt content and guesses; [half, V): fillers

    def content(n: int) -> list[int]:
        return rng.integers(0, half, n).tolist()  # type: ignore[no-any-return]

    public = content(cfg.prefix_len)
    first_tokens: set[int] = set()  # the first tokens of every secret and wrong guess so far

    def fresh_first() -> int:
        """A first token (after ``public``) that no secret or wrong guess has yet: so no probe
        ever shares a token with another guess, its own earlier probes included."""
        while (token := int(rng.integers(0, half))) in first_tokens:
            pass
        first_tokens.add(token)
        return token

    # (attack, phase) -> its secrets; the attacker's decoys calibrate, the victim's are attacked
    groups = [(attack, phase, [[fresh_first(), *content(cfg.secret_len - 1)] for _ in range(count)])
              for attack, count in (("whole", cfg.whole_victims), ("token", cfg.token_victims))
              for phase in ("calibrate", "attack")]
    plants: list[Request] = []
    for _, phase, secrets in groups:
        tenant = "attacker" if phase == "calibrate" else "victim"
        for secret in secrets:
            plants.append(Request(f"{tenant}-{len(plants)}", public + secret + content(cfg.question_len),
                                  cache_salt=salt_of(tenant, salted), max_new_tokens=1))

    def wrong_token(secret: list[int], i: int) -> int:
        """A wrong guess of ``secret[i]``. Past the first token only this secret has the known
        prefix (first tokens are all distinct), so only its own next token is ruled out."""
        if i == 0:
            return fresh_first()
        while (token := int(rng.integers(0, half))) == secret[i]:
            pass
        return token

    sent: list[tuple[str, str, bool, list[int]]] = []  # attack, phase, truth, guess (after public)
    for attack, phase, secrets in groups:
        if attack == "whole":
            twins = [[secret, [wrong_token(secret, 0), *content(cfg.secret_len - 1)]] for secret in secrets]
        else:  # position by position, so twins see the same own-cached prefix (module docstring)
            twins = [[secret[: i + 1], [*secret[:i], wrong_token(secret, i)]]
                     for i in range(cfg.secret_len) for secret in secrets]
        for right, wrong in twins:
            for k in rng.permutation(2):
                sent.append((attack, phase, k == 0, (right, wrong)[k]))
    probes = []
    for n, (attack, phase, truth, guess) in enumerate(sent):
        filler = rng.integers(half, cfg.vocab_size, cfg.filler_len).tolist()
        at = start_s + n * gap_s + float(rng.uniform(0, gap_s / 2))
        req = Request(f"probe-{n}", public + guess + filler, cache_salt=salt_of("attacker", salted),
                      arrival_time=at, max_new_tokens=1)
        probes.append(Probe(req, attack, phase, truth, len(public) + len(guess), n // 2))
    return Scenario(plants, probes)


# ------------------------------------------------------------------------------ simulation
def default_cost_model() -> Clock:
    """The clock the engine runs when handed none, asked of the engine itself: this module
    never types or picks constants of its own."""
    return Engine(make_cache("none", CacheConfig(32, 16))).cost_model


def make_design_cache(design: str, capacity_tokens: int = CAPACITY_TOKENS) -> PrefixCache:
    """A fresh cache of ``design`` (a key of DESIGNS); the default room holds everything a
    simulated cell sends, so nothing is evicted."""
    if design not in DESIGNS:
        raise ValueError(f"unknown design {design!r}; valid: {', '.join(DESIGNS)}")
    backend, page_size = DESIGNS[design]
    return build_cache(dict(backend=backend, options={}, capacity_tokens=capacity_tokens,
                            page_size=page_size))


def as_tenant(req: Request, request_id: str, tenant: str, salted: bool, delay_s: float = 0.0) -> Request:
    """A copy of a workload's fresh request under ``request_id``, sent by ``tenant``,
    ``delay_s`` later."""
    return Request(request_id, req.prompt_token_ids, cache_salt=salt_of(tenant, salted),
                   arrival_time=req.arrival_time + delay_s, max_new_tokens=req.max_new_tokens,
                   planned_output_ids=req.planned_output_ids)


def poisson_rate(load: float, prompt_len: int, cost: Clock) -> float:
    """Requests/s of ``prompt_len`` tokens that keep a fraction ``load`` of the no-cache prefill
    capacity busy (each prompt's prefill in a busy engine: ``saturated_request_s``; the linear
    CPU clock's is prefill_token_s a token)."""
    if not load >= 0:
        raise ValueError(f"load must be >= 0, got {load!r}")
    return load / cost.saturated_request_s(prompt_len, 0, TOKEN_BUDGET)


def background_requests(seed: int, salted: bool, load: float, start_s: float, end_s: float,
                        cost: Clock) -> list[Request]:
    """Other tenants' traffic over ``[start_s, end_s)``: generated-shared-prefix prompts (8
    groups sharing a system prompt each), spread over BACKGROUND_TENANTS tenants."""
    rate = poisson_rate(load, sum(BACKGROUND_PROMPT), cost)
    count = math.ceil(rate * (end_s - start_s))
    if count <= 0:
        return []
    groups = 8
    workload = make_workload("generated-shared-prefix", seed=seed, num_groups=groups,
                             prompts_per_group=-(-count // groups), system_prompt_len=BACKGROUND_PROMPT[0],
                             question_len=BACKGROUND_PROMPT[1], output_len=BACKGROUND_OUTPUT,
                             shuffle=True, request_rate=rate)
    reqs = workload.generate()[:count]
    return [as_tenant(r, f"bg-{i}", f"tenant-{i % BACKGROUND_TENANTS}", salted, start_s)
            for i, r in enumerate(reqs)]


def probe_frame(probes: Sequence[Probe], engine: Engine) -> pd.DataFrame:
    """One row per probe: what the attacker knows of it, its hit (for diagnosis, the attacker
    does not see it) and its TTFT."""
    rows = []
    for p in probes:
        rec = engine.records[p.request.request_id]
        assert rec.first_token_time is not None, f"{rec.request_id} never produced a token"
        rows.append((p.attack, p.phase, p.truth, p.guess_end, p.pair, rec.hit_tokens,
                     rec.first_token_time - rec.arrival_time))
    return pd.DataFrame(rows, columns=PROBE_COLUMNS)


def simulate(design: str, cfg: AttackConfig, seed: int, salted: bool, load: float,
             cost: Clock | None = None) -> pd.DataFrame:
    """Plants, then probes amid background traffic, through the engine under ``cost``
    (default: the engine's own, ``default_cost_model``); the probes' frame (``probe_frame``).
    The pool holds everything sent (checked: nothing is evicted), so the victims' KV is still
    there when probed: the attacker's best case."""
    cost = cost or default_cost_model()
    gap_s = cfg.probe_spacing * cost.step_time(cfg.probe_len, 0)
    plants = build_scenario(cfg, seed, salted).plants
    plant_tokens = sum(r.num_tokens for r in plants)
    # The plants are served before the first probe: every step they can take, and a gap.
    start_s = (plant_tokens // TOKEN_BUDGET + 2) * cost.step_time(TOKEN_BUDGET, len(plants)) + gap_s
    scenario = build_scenario(cfg, seed, salted, start_s, gap_s)
    end_s = scenario.probes[-1].request.arrival_time + gap_s
    reqs = scenario.plants + [p.request for p in scenario.probes]
    reqs += background_requests(seed, salted, load, start_s - gap_s, end_s, cost)
    reqs.sort(key=lambda r: r.arrival_time)  # stable: plants (at 0) first
    sent = sum(r.num_prompt_tokens + r.max_new_tokens for r in reqs)
    cache = make_design_cache(design, max(CAPACITY_TOKENS, 1 << math.ceil(math.log2(sent))))
    engine = Engine(cache, "fcfs", TOKEN_BUDGET, cost_model=cost, seed=seed)
    engine.run(reqs)
    if cache.stats.evicted_tokens:
        raise RuntimeError(f"{design} seed {seed}: {cache.stats.evicted_tokens} tokens evicted")
    last_plant = max(engine.records[r.request_id].finish_time or math.inf for r in scenario.plants)
    if last_plant > scenario.probes[0].request.arrival_time:
        raise RuntimeError(f"{design} seed {seed}: a plant was still running when probing began")
    return probe_frame(scenario.probes, engine)


# ------------------------------------------------------------------------------ the attacker's call
def balanced_accuracy(called_hit: Sequence[bool] | np.ndarray, truth: Sequence[bool] | np.ndarray) -> float:
    """Mean of the recall on right guesses and on wrong ones: 0.5 for any call that ignores
    the truth, whatever the class mix."""
    pred, y = np.asarray(called_hit, dtype=bool), np.asarray(truth, dtype=bool)
    if pred.shape != y.shape:
        raise ValueError(f"{pred.shape[0] if pred.ndim else 0} calls for {y.size} probes")
    if y.all() or not y.any():
        raise ValueError("balanced accuracy needs probes of both classes (right and wrong guesses)")
    return float((pred[y].mean() + (~pred[~y]).mean()) / 2)


def fit_threshold(ttft_s: Sequence[float] | np.ndarray, truth: Sequence[bool] | np.ndarray) -> float:
    """The attacker's calibration: the TTFT cut below which it calls a hit, chosen among the
    midpoints between consecutive distinct TTFTs of its calibration probes (and one cut below
    them all) to maximise their balanced accuracy; ties go to the lowest cut."""
    t, y = np.asarray(ttft_s, dtype=float), np.asarray(truth, dtype=bool)
    if t.shape != y.shape or t.ndim != 1:
        raise ValueError(f"ttft_s and truth must be equal-length 1-d, got {t.shape} and {y.shape}")
    balanced_accuracy(np.zeros_like(y), y)  # both classes present (ValueError otherwise)
    values = np.unique(t)
    cuts = np.concatenate([[values[0] - 1.0], (values[:-1] + values[1:]) / 2])
    called = t[None, :] < cuts[:, None]  # [cuts, probes]
    scores = (called[:, y].mean(axis=1) + (~called[:, ~y]).mean(axis=1)) / 2
    return float(cuts[int(np.argmax(scores))])


def channel_bits(accuracy: float) -> float:
    """``1 - H2(accuracy)``: bits per probe of the binary symmetric channel with that accuracy
    (a lower bound for the probe's real channel; see the module docstring)."""
    if not 0.0 <= accuracy <= 1.0:
        raise ValueError(f"accuracy must be in [0, 1], got {accuracy!r}")
    if accuracy in (0.0, 1.0):
        return 1.0
    q = 1.0 - accuracy
    return 1.0 + accuracy * math.log2(accuracy) + q * math.log2(q)


def hit_calls(calibration: pd.DataFrame, probes: pd.DataFrame) -> np.ndarray:
    """The attacker's hit calls on ``probes``: TTFT below the threshold it fitted on its
    calibration probes ending their guess at the same position (``guess_end``): those cost
    the same to compute, so one threshold per position (a token probe grows with it)."""
    cuts = {end: fit_threshold(g["ttft_s"], g["truth"]) for end, g in calibration.groupby("guess_end")}
    missing = set(probes["guess_end"]) - set(cuts)
    if missing:
        raise ValueError(f"no calibration probes end their guess at {sorted(missing)}")
    return probes["ttft_s"].to_numpy() < probes["guess_end"].map(cuts).to_numpy(dtype=float)


def evaluate(probes: pd.DataFrame, page_size: int) -> list[dict[str, float | int | str]]:
    """The attack's score on one run: per attack, the calls (``hit_calls``, calibrated on its
    decoy probes) on its probes of the victim. ``token-block`` scores the token guesses that end
    a ``page_size`` block (every guess at page 1; no row if none does)."""
    rows: list[dict[str, float | int | str]] = []
    for attack in ATTACKS:
        mine = probes[probes["attack"] == attack]
        cal = mine[mine["phase"] == "calibrate"]
        real = mine[mine["phase"] == "attack"]
        subsets = {attack: real}
        if attack == "token":
            subsets["token-block"] = real[real["guess_end"] % page_size == 0]
        for name, sub in subsets.items():
            if sub.empty:
                continue  # no token guess completes a block (a secret shorter than one)
            truth = sub["truth"].to_numpy(dtype=bool)
            accuracy = balanced_accuracy(hit_calls(cal, sub), truth)
            rows.append(dict(
                attack=name, probes=len(sub), accuracy=accuracy, bits=channel_bits(accuracy),
                calibration_accuracy=balanced_accuracy(hit_calls(cal, cal), cal["truth"]),
                right_ttft_median_s=float(sub.loc[truth, "ttft_s"].median()),
                wrong_ttft_median_s=float(sub.loc[~truth, "ttft_s"].median()),
                right_hit_tokens=float(sub.loc[truth, "hit_tokens"].mean()),
                wrong_hit_tokens=float(sub.loc[~truth, "hit_tokens"].mean()),
            ))
    return rows


def seed_ci(df: pd.DataFrame, by: list[str], column: str) -> pd.DataFrame:
    """Per group of ``by``: mean of ``column`` over its rows (one per seed), the half-width of
    its 95% confidence interval (Student's t) and the number of seeds."""
    rows = []
    for key, g in df.groupby(by, sort=True):
        mean, half = mean_ci95(g[column].tolist())
        rows.append({**dict(zip(by, key if isinstance(key, tuple) else (key,), strict=True)),
                     "mean": mean, "ci": half, "seeds": len(g)})
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------ what salt costs
TENANT_STREAM = 0x7E4A


def salt_cost_hit_rate(design: str, seed: int, tenants: int, salted: bool, num_requests: int = 128,
                       load: float = 0.5, cost: Clock | None = None) -> float:
    """Token hit rate of a multi-tenant shared-document QA workload (a common system prompt and
    8 documents of Zipf popularity, each request from one of ``tenants`` tenants at random)
    through the engine, with or without per-tenant salt."""
    if isinstance(tenants, bool) or not isinstance(tenants, int) or tenants < 1:
        raise ValueError(f"tenants must be an int >= 1, got {tenants!r}")
    cost = cost or default_cost_model()
    params = dict(num_docs=8, doc_len=512, system_len=256, question_len=32, output_len=16)
    prompt_len = params["system_len"] + params["doc_len"] + params["question_len"]
    workload = make_workload("shared-doc-qa", seed=seed, num_requests=num_requests,
                             request_rate=poisson_rate(load, prompt_len, cost), **params)
    owner = np.random.default_rng((seed, TENANT_STREAM)).integers(0, tenants, num_requests)
    reqs = [as_tenant(r, r.request_id, f"tenant-{k}", salted)
            for r, k in zip(workload.generate(), owner.tolist(), strict=True)]
    cache = make_design_cache(design)
    Engine(cache, "fcfs", cost_model=cost, seed=seed).run(reqs)
    return cache.stats.hit_rate
