"""What each backend accepts, per layout and host tier: one table.

A row is a backend over a layout, with or without a host tier (the "mix", as SGLang 0.5.23's
UnifiedRadixCache names its components); it says which ``eviction_policy`` names, whether
``kv_events=True`` and EAGLE (hashchain ``use_eagle``, radix ``is_eagle``) are accepted there,
and the page size the mix needs. A mix with no row is refused as a whole. ``make_cache`` checks
every call against this table (``check``) and refuses with one message that says what the mix
accepts; ``eviction_policies`` lists a row's names; the README and ``prefixcache run --help``
print the table (``markdown``, ``summary``). A backend that gains a feature flips its cell here.

    layout   dense   full attention only (no ``layout``, or only full layers)
             swa     sliding-window + full layers
             mamba   Mamba + full layers
             hybrid  Mamba + sliding-window + full layers
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from prefixcache.config import CacheConfig
from prefixcache.eviction import CAPACITY_POLICIES, LEAF_LRU, POLICIES, USER_POLICIES

LAYOUTS = ("dense", "swa", "mamba", "hybrid")
BACKENDS = ("none", "hashchain", "radix")
EAGLE_OPTION = {"hashchain": "use_eagle", "radix": "is_eagle"}


@dataclass(frozen=True, slots=True)
class Mix:
    """What one backend accepts over one layout, with or without a host tier."""

    policies: tuple[str, ...] = ()  # built-in eviction_policy names, the default (lru) first
    registered: bool = False  # also register_policy's names and "package.module:Class"
    kv_events: bool = False
    eagle: bool = False
    events_with_eagle: bool = True  # kv_events and EAGLE together (where both are accepted)
    page_size: int | None = None  # the only page size accepted (None: any)
    why: str = ""  # why it takes no more, in the refusal's words


_HASHCHAIN = (*POLICIES, *CAPACITY_POLICIES, LEAF_LRU)  # POLICIES starts with the default, lru
_RADIX = (*POLICIES, *CAPACITY_POLICIES)

# (backend, layout, host tier) -> what it accepts; a mix in neither table is refused too.
TABLE: dict[tuple[str, str, bool], Mix] = {
    **{("none", layout, False): Mix(why="it caches nothing") for layout in LAYOUTS},
    ("hashchain", "dense", False): Mix(_HASHCHAIN, True, kv_events=True, eagle=True),
    ("hashchain", "dense", True): Mix(
        _HASHCHAIN, True, kv_events=True, why="use_eagle with a host_tier is not modelled"
    ),
    ("hashchain", "swa", False): Mix(_HASHCHAIN, True, kv_events=True, eagle=True),
    ("hashchain", "mamba", False): Mix(
        _HASHCHAIN, True, kv_events=True, why="vLLM 0.33 has no EAGLE Mamba checkpoints"
    ),
    ("hashchain", "hybrid", False): Mix(
        _HASHCHAIN, True, kv_events=True, why="vLLM 0.33 has no EAGLE Mamba checkpoints"
    ),
    ("radix", "dense", False): Mix(
        _RADIX,
        True,
        kv_events=True,
        eagle=True,
        events_with_eagle=False,
        why="kv_events with is_eagle (bigram-keyed pages) is not modelled",
    ),
    ("radix", "dense", True): Mix(
        tuple(p for p in _RADIX if p not in CAPACITY_POLICIES),
        True,
        kv_events=True,  # device and host media
        why="SGLang's HiCache tree keeps no ghost (arc, s3fifo) and lrp learns from each request's "
        "lookup, which this cache does not feed; it keys no EAGLE bigrams",
    ),
    ("radix", "swa", False): Mix(
        ("lru",),
        kv_events=True,
        eagle=True,
        events_with_eagle=False,
        why="SGLang's SWA tree evicts by LRU only; kv_events with is_eagle is not modelled",
    ),
    ("radix", "mamba", False): Mix(
        ("lru", "marconi"),
        kv_events=True,
        page_size=1,
        why="SGLang 0.5.23's no_buffer Mamba tree needs page_size 1 and drops is_eagle (Marconi's "
        "eviction beside its LRU)",
    ),
}
REFUSED: dict[tuple[str, str, bool], str] = {
    **{("none", layout, True): "it caches nothing a host tier could keep" for layout in LAYOUTS},
    **{
        ("hashchain", layout, True): "the hashchain host tier (vLLM 0.33's OffloadingConnector) "
        "supports a dense layout only (one full-attention group)"
        for layout in LAYOUTS[1:]
    },
    **{
        ("radix", layout, True): "the radix host tier (SGLang's HiCache) models full-attention layouts only"
        for layout in LAYOUTS[1:]
    },
    ("radix", "hybrid", False): "SGLang 0.5.23 has no tree for sliding-window + Mamba layouts",
}
assert not TABLE.keys() & REFUSED.keys(), "a mix both accepted and refused"

# The backends that take ``eviction_policy`` over some layout.
BACKENDS_WITH_POLICIES = tuple(dict.fromkeys(b for (b, _, _), mix in TABLE.items() if mix.policies))


def layout_of(config: CacheConfig) -> str:
    """The table's name for ``config``'s layout."""
    if not config.is_hybrid:
        return "dense"
    mamba, window = config.model_layout.count("mamba"), config.model_layout.count("sliding_window")
    if mamba and window:
        return "hybrid"
    return "mamba" if mamba else "swa"


def _where(backend: str, layout: str, host_tier: bool) -> str:
    return f"{backend} over a {layout} layout" + (" with a host tier" if host_tier else "")


def accepted(mix: Mix, backend: str) -> str:
    """What ``mix`` accepts, in words."""
    if not mix.policies:
        parts = ["no eviction_policy"]
    else:
        names = ", ".join(mix.policies) + (" or a registered class" if mix.registered else "")
        parts = [f"eviction_policy: {names}"]
    parts.append("kv_events" if mix.kv_events else "no kv_events")
    eagle = EAGLE_OPTION.get(backend, "EAGLE")
    if mix.eagle:
        parts.append(eagle if mix.events_with_eagle else f"{eagle} (not with kv_events)")
    else:
        parts.append(f"no {eagle}")
    if mix.page_size is not None:
        parts.append(f"page_size {mix.page_size} only")
    return "; ".join(parts)


def mixes(backend: str) -> dict[tuple[str, bool], Mix]:
    """The rows of ``backend``: (layout, host tier) -> what it accepts."""
    return {(layout, tier): mix for (b, layout, tier), mix in TABLE.items() if b == backend}


def _takes_policy(mix: Mix, name: object) -> bool:
    """Whether ``mix`` takes ``eviction_policy=name`` (case-insensitive, as make_policy reads it)."""
    if not isinstance(name, str):
        return False
    key = name.lower()
    return key in mix.policies or (mix.registered and (key in USER_POLICIES or ":" in key))


def _refused(backend: str, config: CacheConfig, options: Mapping[str, Any]) -> str | None:
    """What the table refuses in this call (None: nothing)."""
    host_tier = options.get("host_tier") is not None
    layout = layout_of(config)
    mix = TABLE.get((backend, layout, host_tier))
    if mix is None:
        rows = mixes(backend)
        layouts = ", ".join(dict.fromkeys(f"{lay} with a host tier" if t else lay for lay, t in rows))
        why = REFUSED.get((backend, layout, host_tier), "no backend class models it")
        return f"{_where(backend, layout, host_tier)} is not supported ({why}); {backend} takes: {layouts}"
    where = _where(backend, layout, host_tier)
    problems = []
    if "eviction_policy" in options and not _takes_policy(mix, options["eviction_policy"]):
        name = options["eviction_policy"]
        if not any(_takes_policy(m, name) for m in TABLE.values()):  # not a limit of this mix
            return f"unknown eviction policy {name!r} for {where}; it takes: {accepted(mix, backend)}"
        problems.append(f"eviction_policy={name!r}")
    if options.get("kv_events") is True and not mix.kv_events:
        problems.append("kv_events=True")
    eagle = EAGLE_OPTION.get(backend)
    if eagle is not None and options.get(eagle) is True:
        if not mix.eagle:
            problems.append(f"{eagle}=True")
        elif options.get("kv_events") is True and mix.kv_events and not mix.events_with_eagle:
            problems.append(f"{eagle}=True with kv_events=True")
    if mix.page_size is not None and config.page_size != mix.page_size:
        problems.append(f"page_size {config.page_size}")
    if not problems:
        return None
    where += f" ({mix.why})" if mix.why else ""
    return f"{', '.join(problems)} not supported for {where}; it takes: {accepted(mix, backend)}"


def check(backend: str, config: CacheConfig, options: Mapping[str, Any]) -> None:
    """ValueError with one message if the table refuses ``make_cache(backend, config,
    **options)``; a backend the table does not list (a registered one) judges for itself."""
    if backend not in BACKENDS:
        return
    why = _refused(backend, config, options)
    if why is not None:
        raise ValueError(f"make_cache({backend!r}): {why} (prefixcache/capabilities.py)")


def eviction_policies(backend: str, layout: str = "dense", host_tier: bool = False) -> list[str]:
    """The ``eviction_policy`` names ``make_cache(backend, ...)`` accepts over ``layout`` (with
    a host tier): the built-in ones, then those registered (ValueError where none is taken)."""
    mix = TABLE.get((backend, layout, host_tier))
    if mix is None or not mix.policies:
        takers = ", ".join(BACKENDS_WITH_POLICIES)
        raise ValueError(
            f"{_where(backend, layout, host_tier)} takes no eviction_policy; those that do: {takers}"
        )
    return [*mix.policies, *(USER_POLICIES if mix.registered else ())]


def markdown() -> str:
    """The table as the README shows it."""
    lines = [
        "| backend | layout | host tier | eviction_policy | kv_events | EAGLE | page size |",
        "|---|---|---|---|---|---|---|",
    ]
    for (backend, layout, tier), mix in TABLE.items():
        names = ", ".join(mix.policies) + (", registered" if mix.registered else "") or "-"
        eagle = "no" if not mix.eagle else "yes" if mix.events_with_eagle else "yes, without kv_events"
        page = "any" if mix.page_size is None else str(mix.page_size)
        cells = [
            backend,
            layout,
            "yes" if tier else "no",
            names,
            "yes" if mix.kv_events else "no",
            eagle,
            page,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary() -> str:
    """The table in a few lines of text (``prefixcache run --help``)."""
    lines = []
    for backend in BACKENDS:
        for (layout, tier), mix in mixes(backend).items():
            lines.append(f"{_where(backend, layout, tier)}: {accepted(mix, backend)}")
    return "\n".join(lines)
