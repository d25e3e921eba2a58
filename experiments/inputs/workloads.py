"""Built-in synthetic workloads: each a small seeded dataclass whose ``generate()`` returns
Requests. Token ids are random (the cache sees only ids); what matters is which prefixes
repeat. Outputs that a later prompt repeats (a chat answer, an agent's action) are planned:
they are the request's ``planned_output_ids``, so the engine emits exactly those tokens.

Arrivals: ``request_rate`` > 0 draws Poisson arrivals (requests/s); 0 puts independent requests
at time 0. Dependent steps (the next chat turn, the next agent step, a child thought) arrive
``think_time_s`` after their parent, so the parent has normally finished.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import numpy as np

from prefixcache import Request

ARRIVAL_STREAM = 0xA771  # the arrival draws' own seed sequence, apart from the prompts'


@dataclass
class Workload(ABC):
    """seed: every random choice; vocab_size: token ids in [0, vocab_size)."""

    name: ClassVar[str]
    seed: int = 0
    vocab_size: int = 32_000
    request_rate: float = 0.0
    think_time_s: float = 5.0

    @abstractmethod
    def generate(self) -> list[Request]: ...

    # helpers ------------------------------------------------------------
    def _rng(self) -> np.random.Generator:
        return np.random.default_rng(self.seed)

    def _tokens(self, rng: np.random.Generator, n: int) -> list[int]:
        return rng.integers(0, self.vocab_size, n).tolist()  # type: ignore[no-any-return]

    def _arrivals(self, n: int) -> list[float]:
        """Poisson arrival times from a stream of their own (seeded by ``seed`` alone): every
        sweep point with the same seed, rate and count gets the same arrival sample (common
        random numbers), whatever the prompts; at another rate the same draws are rescaled."""
        if self.request_rate <= 0:
            return [0.0] * n
        gaps = np.random.default_rng((self.seed, ARRIVAL_STREAM)).exponential(1.0, n)
        return (np.cumsum(gaps) / self.request_rate).tolist()  # type: ignore[no-any-return]

    def _request(self, i: int, prompt: list[int], output: list[int] | int, arrival: float) -> Request:
        planned = output if isinstance(output, list) else None
        n_out = len(output) if isinstance(output, list) else output
        return Request(
            f"{self.name}-{i}", prompt, arrival_time=arrival, max_new_tokens=n_out, planned_output_ids=planned
        )


@dataclass
class MultiTurnChat(Workload):
    """``conversations`` chats of ``turns`` turns; turn t's prompt = turn t-1's prompt + its
    answer (``answer_len`` planned tokens) + a new question (``question_len``), after a shared
    ``system_len``-token system prompt."""

    name: ClassVar[str] = "multi-turn-chat"
    conversations: int = 8
    turns: int = 4
    system_len: int = 128
    question_len: int = 64
    answer_len: int = 64

    def generate(self) -> list[Request]:
        rng = self._rng()
        system = self._tokens(rng, self.system_len)
        starts = self._arrivals(self.conversations)
        out: list[tuple[float, list[int], list[int]]] = []
        for c in range(self.conversations):
            context = list(system)
            for t in range(self.turns):
                prompt = context + self._tokens(rng, self.question_len)
                answer = self._tokens(rng, self.answer_len)
                out.append((starts[c] + t * self.think_time_s, prompt, answer))
                context = prompt + answer
        out.sort(key=lambda x: x[0])  # stable: interleaves conversations turn by turn
        return [self._request(i, p, a, t) for i, (t, p, a) in enumerate(out)]


@dataclass
class FewShot(Workload):
    """``tasks`` tasks, each an instruction (``instruction_len``) + ``shots`` fixed exemplars
    (``exemplar_len`` each) shared by its ``requests_per_task`` queries (``query_len``)."""

    name: ClassVar[str] = "few-shot"
    tasks: int = 4
    shots: int = 8
    instruction_len: int = 32
    exemplar_len: int = 64
    query_len: int = 32
    requests_per_task: int = 16
    output_len: int = 16

    def generate(self) -> list[Request]:
        rng = self._rng()
        prefix_len = self.instruction_len + self.shots * self.exemplar_len
        prefixes = [self._tokens(rng, prefix_len) for _ in range(self.tasks)]
        picks = rng.permutation(np.repeat(np.arange(self.tasks), self.requests_per_task)).tolist()
        times = self._arrivals(len(picks))
        return [
            self._request(i, prefixes[k] + self._tokens(rng, self.query_len), self.output_len, times[i])
            for i, k in enumerate(picks)
        ]


@dataclass
class SharedDocumentQA(Workload):
    """``docs_per_request`` documents (``doc_len`` each) drawn from ``num_docs`` with Zipf
    popularity (exponent ``zipf_s``; 0 = uniform), after a system prompt, then a question.
    One document per request is shared-document QA; several is RAG (order matters: the
    retrieved set is sorted by document id, so equal sets share the whole context)."""

    name: ClassVar[str] = "shared-doc-qa"
    num_docs: int = 8
    doc_len: int = 1024
    docs_per_request: int = 1
    num_requests: int = 64
    system_len: int = 64
    question_len: int = 32
    output_len: int = 32
    zipf_s: float = 1.0

    def generate(self) -> list[Request]:
        rng = self._rng()
        system = self._tokens(rng, self.system_len)
        docs = [self._tokens(rng, self.doc_len) for _ in range(self.num_docs)]
        weights = 1.0 / np.arange(1, self.num_docs + 1) ** self.zipf_s
        weights /= weights.sum()
        times = self._arrivals(self.num_requests)
        reqs = []
        for i in range(self.num_requests):
            picked = rng.choice(self.num_docs, self.docs_per_request, replace=False, p=weights)
            chosen = sorted(picked.tolist())
            prompt = system + [t for d in chosen for t in docs[d]] + self._tokens(rng, self.question_len)
            reqs.append(self._request(i, prompt, self.output_len, times[i]))
        return reqs


@dataclass
class RAG(SharedDocumentQA):
    """Shared-document QA with ``docs_per_request`` = 3 retrieved chunks of 256 tokens."""

    name: ClassVar[str] = "rag"
    num_docs: int = 32
    doc_len: int = 256
    docs_per_request: int = 3


@dataclass
class TreeOfThought(Workload):
    """``trees`` trees of depth ``depth`` and fan-out ``branching``: a node's prompt is the
    root problem (``root_len``) + the thoughts on its path; it emits a planned ``thought_len``
    thought that its children extend. Children arrive ``think_time_s`` after the parent."""

    name: ClassVar[str] = "tree-of-thought"
    trees: int = 2
    branching: int = 3
    depth: int = 3
    root_len: int = 256
    thought_len: int = 48

    def generate(self) -> list[Request]:
        rng = self._rng()
        starts = self._arrivals(self.trees)
        out: list[tuple[float, list[int], list[int]]] = []
        for t in range(self.trees):
            frontier = [self._tokens(rng, self.root_len)]
            for d in range(self.depth):
                nxt = []
                for prompt in frontier:
                    thoughts = [self._tokens(rng, self.thought_len) for _ in range(self.branching)]
                    for thought in thoughts:
                        out.append((starts[t] + d * self.think_time_s, prompt, thought))
                        nxt.append(prompt + thought)
                frontier = nxt
        out.sort(key=lambda x: x[0])
        return [self._request(i, p, a, t) for i, (t, p, a) in enumerate(out)]


@dataclass
class ReActAgent(Workload):
    """``agents`` agents sharing a tool-description prompt (``system_len``); each runs
    ``steps`` steps: prompt = previous prompt + its planned action (``action_len``) + a tool
    observation (``observation_len``), so the context grows every step."""

    name: ClassVar[str] = "react-agent"
    agents: int = 4
    steps: int = 6
    system_len: int = 512
    task_len: int = 64
    action_len: int = 32
    observation_len: int = 128

    def generate(self) -> list[Request]:
        rng = self._rng()
        system = self._tokens(rng, self.system_len)
        starts = self._arrivals(self.agents)
        out: list[tuple[float, list[int], list[int]]] = []
        for a in range(self.agents):
            context = system + self._tokens(rng, self.task_len)
            for s in range(self.steps):
                action = self._tokens(rng, self.action_len)
                out.append((starts[a] + s * self.think_time_s, list(context), action))
                context = context + action + self._tokens(rng, self.observation_len)
        out.sort(key=lambda x: x[0])
        return [self._request(i, p, a, t) for i, (t, p, a) in enumerate(out)]


@dataclass
class GeneratedSharedPrefix(Workload):
    """SGLang bench_serving ``generated-shared-prefix``: ``num_groups`` groups of
    ``prompts_per_group`` prompts; each prompt = the group's system prompt
    (``system_prompt_len``) + its own question (``question_len``); ``output_len`` out.
    SGLang's defaults are 64 x 16, 2048, 128, 256; ours are smaller so a run takes seconds.
    Requests come group by group unless ``shuffle``."""

    name: ClassVar[str] = "generated-shared-prefix"
    num_groups: int = 8
    prompts_per_group: int = 8
    system_prompt_len: int = 512
    question_len: int = 64
    output_len: int = 32
    shuffle: bool = False

    def generate(self) -> list[Request]:
        rng = self._rng()
        prompts = []
        for _ in range(self.num_groups):
            system = self._tokens(rng, self.system_prompt_len)
            prompts += [system + self._tokens(rng, self.question_len) for _ in range(self.prompts_per_group)]
        if self.shuffle:
            prompts = [prompts[i] for i in rng.permutation(len(prompts))]
        times = self._arrivals(len(prompts))
        return [self._request(i, p, self.output_len, times[i]) for i, p in enumerate(prompts)]


@dataclass
class PrefixRepetition(Workload):
    """vLLM benchmarks' ``prefix_repetition`` dataset: ``num_prefixes`` random prefixes of
    ``prefix_len``; ``num_requests`` prompts split evenly among them, each + a random
    ``suffix_len`` suffix, shuffled; ``output_len`` out (vLLM's defaults: 256, 256, 10, 128)."""

    name: ClassVar[str] = "prefix-repetition"
    num_requests: int = 60
    prefix_len: int = 256
    suffix_len: int = 256
    num_prefixes: int = 10
    output_len: int = 32

    def generate(self) -> list[Request]:
        rng = self._rng()
        prefixes = [self._tokens(rng, self.prefix_len) for _ in range(self.num_prefixes)]
        per = self.num_requests // self.num_prefixes
        prompts = [p + self._tokens(rng, self.suffix_len) for p in prefixes for _ in range(per)]
        prompts = [prompts[i] for i in rng.permutation(len(prompts))]
        times = self._arrivals(len(prompts))
        return [self._request(i, p, self.output_len, times[i]) for i, p in enumerate(prompts)]


WORKLOADS: dict[str, type[Workload]] = {
    w.name: w
    for w in (
        MultiTurnChat,
        FewShot,
        SharedDocumentQA,
        RAG,
        TreeOfThought,
        ReActAgent,
        GeneratedSharedPrefix,
        PrefixRepetition,
    )
}


def available_workloads() -> list[str]:
    return sorted(WORKLOADS)


def make_workload(name: str, **params: Any) -> Workload:
    """Build workload ``name`` with its dataclass fields as keywords (ValueError otherwise)."""
    try:
        cls = WORKLOADS[name]
    except KeyError:
        raise ValueError(f"unknown workload {name!r}; valid: {', '.join(available_workloads())}") from None
    valid = {f.name for f in fields(cls)}
    unknown = sorted(set(params) - valid)
    if unknown:
        raise ValueError(f"workload {name!r} has no parameter(s) {unknown}; valid: {sorted(valid)}")
    return cls(**params)
