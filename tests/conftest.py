import os

# The kernel runs under Triton's interpreter unless a GPU is there; set before triton imports.
os.environ.setdefault("TRITON_INTERPRET", "1")
# Trace runs keep prompt block hashes in a store (experiments/inputs/trace_hashes.py): the
# tests' go to a folder of their own, never the user's cache.
if "PREFIXCACHE_CACHE" not in os.environ:
    import tempfile

    os.environ["PREFIXCACHE_CACHE"] = tempfile.mkdtemp(prefix="prefixcache-test-cache-")

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
