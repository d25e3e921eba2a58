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
