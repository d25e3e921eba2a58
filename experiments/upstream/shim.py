"""Import shim for driving vLLM and SGLang on a CPU-only machine.

The one stub: ``torchvision``. SGLang's config package imports multimodal helpers
(``sglang.srt.multimodal.internvl_utils`` -> ``torchvision.transforms``) on the way to
``radix_cache``; PyPI's torchvision wheels are CUDA builds that cannot load next to the CPU
torch, and no cache code uses it. We install an inert module so the import chain goes through;
touching anything in it returns a dummy. Everything else is the real upstream code.

SGLang stamps tree nodes with ``time.monotonic()``; ``deterministic_clock`` swaps the radix
module's clock for a counter (strictly increasing, so the LRU order is the call order) so that
recorded fixtures do not depend on clock resolution.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import itertools
import sys
import types


class _Dummy:
    def __init__(self, name: str) -> None:
        self._name = name

    def __call__(self, *args: object, **kwargs: object) -> _Dummy:
        return _Dummy(self._name + "()")

    def __getattr__(self, name: str) -> _Dummy:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Dummy(f"{self._name}.{name}")

    def __mro_entries__(self, bases: tuple) -> tuple:
        return (object,)


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> _Dummy:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Dummy(f"{self.__name__}.{name}")


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, roots: set[str]) -> None:
        self.roots = roots

    def find_spec(self, name, path, target=None):  # type: ignore[no-untyped-def]
        if name.split(".")[0] in self.roots:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):  # type: ignore[no-untyped-def]
        module = _StubModule(spec.name)
        module.__version__ = "0.28.0"  # transformers parses it
        return module

    def exec_module(self, module):  # type: ignore[no-untyped-def]
        module.__path__ = []


STUBBED = {"torchvision"}
if not any(isinstance(f, _StubFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _StubFinder(STUBBED))


def deterministic_clock(module: types.ModuleType) -> None:
    counter = itertools.count(1)
    names = [k for k in dir(module.time) if not k.startswith("_")]
    fake = types.SimpleNamespace(**{k: getattr(module.time, k) for k in names})
    fake.monotonic = lambda: float(next(counter))
    module.time = fake


def unavailable_reason() -> dict[str, str]:
    """{system: why it cannot be imported}, empty entries omitted."""
    out: dict[str, str] = {}
    probes = (("vllm", "vllm.v1.core.kv_cache_manager"), ("sglang", "sglang.srt.mem_cache.radix_cache"))
    for system, probe in probes:
        if importlib.util.find_spec(system) is None:
            out[system] = f"{system} is not installed (run experiments/upstream/setup_venv.sh)"
            continue
        try:
            importlib.import_module(probe)
        except Exception as exc:  # noqa: BLE001 - any import failure means "not drivable here"
            out[system] = f"import {probe} failed: {type(exc).__name__}: {exc}"
    return out
