import os

# The kernel runs under Triton's interpreter unless a GPU is there; set before triton imports.
os.environ.setdefault("TRITON_INTERPRET", "1")
# Trace runs keep prompt block hashes in a store (experiments/inputs/trace_hashes.py): the
# tests' go to a folder of their own, never the user's cache.
if "PREFIXCACHE_CACHE" not in os.environ:
    import tempfile

    os.environ["PREFIXCACHE_CACHE"] = tempfile.mkdtemp(prefix="prefixcache-test-cache-")

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile(
    "ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
settings.register_profile("dev", max_examples=200, deadline=None)
settings.register_profile(
    "thorough",
    max_examples=2000,
    stateful_step_count=100,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


def _import_every_module() -> None:
    """Import all of prefixcache before any test runs. Hypothesis (6.13x+) also draws, now and
    then, constants it reads from the project modules loaded so far, so a derandomized test's
    examples hung on which modules the tests before it imported: under xdist a stateful
    machine's coverage counters (a hit, a moved window) came out 0 in one worker order and
    not in another. With every module loaded first, the pool is the same in every order."""
    import importlib
    import pkgutil

    # (backends, kernels and experiments are mapped into the package: each walked on its own)
    for root in ("prefixcache", "prefixcache.backends", "prefixcache.kernels", "prefixcache.experiments"):
        package = importlib.import_module(root)
        for module in pkgutil.walk_packages(package.__path__, f"{root}."):
            if module.name.endswith("__main__"):  # (the CLI runs on import)
                continue
            try:
                importlib.import_module(module.name)
            except ModuleNotFoundError as e:  # the upstream drivers, in .venv-upstream only
                if (e.name or "").partition(".")[0] not in ("vllm", "sglang"):
                    raise


_import_every_module()


@pytest.fixture
def trace_data():  # type: ignore[no-untyped-def]
    """The real traces' folder; the test is skipped where it is absent (a clone outside the
    workspace, without ../shared/data or $PREFIXCACHE_DATA)."""
    from prefixcache.experiments.inputs.traces import data_dir

    try:
        return data_dir()
    except FileNotFoundError as e:
        pytest.skip(f"trace data not available: {e}")


@pytest.fixture
def vllm_hash_seed(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """NONE_HASH from PYTHONHASHSEED=0, as the upstream recorders fixed it (vLLM's default seed
    string differs from ours, so without it event hashes would not be vLLM's); restored after."""
    from prefixcache.backends.hashchain import hashing

    saved = dict(hashing._NONE_HASHES)
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    hashing.init_none_hash(hashing.sha256)
    yield
    hashing._NONE_HASHES.clear()
    hashing._NONE_HASHES.update(saved)
