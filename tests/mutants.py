"""Break one behaviour at a time and check that the property suites notice (``make mutants``).

Each mutant is a literal text substitution in one backend (or kernel) file. For each, the
property-based suites (the kernel's tests, for a kernel mutant) run in the ``ci`` profile; a
mutant that leaves them green is a hole in the proof. The source is restored afterwards
whatever happens.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUITES = [
    "tests/test_properties_equivalence.py",
    "tests/test_stateful.py",
    "tests/test_oracle_hashchain.py",
    "tests/test_match.py",
    "tests/test_radix_tree.py",
    "tests/test_scaling.py",
    "tests/test_engine.py::test_decode_steps_in_place_is_exact_and_tight",
    "tests/test_engine.py::test_decode_stretches_change_no_record_and_no_cache_state",
    "tests/test_engine.py::test_decode_stretch_stops_where_a_request_arrives",
]

# name -> (file, original text, mutated text); the original text occurs exactly once (checked by
# `python -m tests.mutants --check-texts` and tests/test_mutants.py)
MUTANTS: dict[str, tuple[str, str, str]] = {
    "hashchain: no n-1 cap": (
        "backends/hashchain/kv_cache_manager.py",
        "    return request.num_tokens - 1\n",
        "    return request.num_tokens\n",
    ),
    "radix: a key extended by output tokens skips the first of them": (
        "backends/radix/key.py",
        "        new = req.output_token_ids[len(known) - req.num_prompt_tokens :]\n",
        "        new = req.output_token_ids[len(known) - req.num_prompt_tokens + 1 :]\n",
    ),
    "radix: the prompt re-insert walks along a node that ends past the prompt": (
        "backends/radix/backend.py",
        "            while depth > prompt:\n",
        "            while depth - len(above.key) > prompt:\n",
    ),
    "radix: no n-1 cap": (
        "backends/radix/backend.py",
        "m = self.tree.match_prefix(key[: req.num_tokens - 1])",
        "m = self.tree.match_prefix(key)",
    ),
    "hashchain: forward-order free": (
        "backends/hashchain/single_type_kv_cache_manager.py",
        "self.block_pool.free_blocks(reversed(blocks) if reverse else blocks)",
        "self.block_pool.free_blocks(blocks)",
    ),
    "radix: match stops at the last whole node (drops the part of a split edge)": (
        "backends/radix/radix_cache.py",
        "        for child, n, diverged in self._walk(node, key, pos, end, now, stamp=False):\n"
        "            node, pos = child, pos + n\n",
        "        for child, n, diverged in self._walk(node, key, pos, end, now, stamp=False):\n"
        "            if diverged:\n                break\n"
        "            node, pos = child, pos + n\n",
    ),
    "radix: duplicates computed after re-pointing (frees slots still in use)": (
        "backends/radix/backend.py",
        "        mine = live.pages[start // p : cached // p]\n"
        "        # Past ``cached`` the tree holds our own slots (just inserted): only the duplicates'\n"
        "        # slots are gathered.\n"
        "        match = self.tree.match_prefix(key, along=end, indices_from=start, indices_to=cached)\n"
        '        assert match.length == aligned, f"re-match found {match.length} of {aligned} '
        'inserted tokens"\n'
        "        tree_pages = self._pages_of(match.indices)\n"
        "        # Re-point at the tree's pages first; only then free our duplicate copies.\n"
        "        live.pages[start // p : cached // p] = tree_pages\n",
        "        match = self.tree.match_prefix(key, along=end, indices_from=start, indices_to=cached)\n"
        "        tree_pages = self._pages_of(match.indices)\n"
        "        live.pages[start // p : cached // p] = tree_pages\n"
        "        mine = live.pages[start // p : cached // p]\n",
    ),
    "radix: a re-match from a token hands back the slots before it too": (
        "backends/radix/radix_cache.py",
        "    return value[max(start - first, 0) : min(stop, end) - first]\n",
        "    return value[: min(stop, end) - first]\n",
    ),
    "radix: duplicate slots never freed": (
        "backends/radix/backend.py",
        "        self.pool.free(self._duplicates(mine, tree_pages))\n",
        "",
    ),
    "hashchain: salt not hashed": (
        "backends/hashchain/hashing.py",
        "if start == 0 and req.cache_salt is not None:",
        "if False:",
    ),
    "interface: a stale match trusted (the version check skipped)": (
        "prefixcache/interface.py",
        "        if match.version == self._index_version():\n            return match\n",
        "        return match\n",
    ),
    "hashchain: allocation-path evictions do not move the index version": (
        "backends/hashchain/hash_map.py",
        "        self.version += len(hashed)\n",
        "",
    ),
    "radix: an evicted leaf does not move the index version": (
        "backends/radix/radix_cache.py",
        '        assert removed is node, f"parent does not file {node} under its child key"\n'
        "        self.version += 1\n",
        '        assert removed is node, f"parent does not file {node} under its child key"\n',
    ),
    "radix: every node collected before each evict (O(cache size), as SGLang's leaf scan)": (
        "backends/radix/radix_cache.py",
        "        while freed[0] < num_tokens and self._leaves:\n            if self.order is None:\n",
        "        self.iter_nodes()\n"
        "        while freed[0] < num_tokens and self._leaves:\n            if self.order is None:\n",
    ),
    "hashchain: the free queue walked on every allocation (O(cache size))": (
        "backends/hashchain/eviction.py",
        "        return pool.free_block_queue.popleft_n(num_blocks)\n",
        "        pool.free_block_queue.get_all_free_blocks()\n"
        "        return pool.free_block_queue.popleft_n(num_blocks)\n",
    ),
    "hashchain: a decode stretch reaches the token that fills a block": (
        "backends/hashchain/kv_cache_coordinator.py",
        "before_next_full = (manager.num_cached_block[request_id] + 1) * size - 1",
        "before_next_full = (manager.num_cached_block[request_id] + 1) * size",
    ),
    "engine: a decode stretch runs past an arrival": (
        "prefixcache/engine.py",
        "while taken < steps and not (taken and next_arrival is not None and next_arrival <= clock):",
        "while taken < steps:",
    ),
    "hashchain: a ranked eviction policy may evict a block in use": (
        "backends/hashchain/eviction.py",
        "        self._drop(block)\n        if self.learner is not None:\n            self.learner.reused(",
        "        if self.learner is not None:\n            self.learner.reused(",
    ),
    "radix: an eviction policy may evict a locked leaf": (
        "backends/radix/radix_cache.py",
        "return not node.evicted and node.lock_ref == 0 and not node.children",
        "return not node.evicted and not node.children",
    ),
    "radix: a checkpoint's lock move leaves the new last node itself unpinned": (
        "backends/radix/radix_cache.py",
        "        return sum(self._pin(node) for node in below)  # bottom up, as inc_lock_ref goes\n",
        "        return sum(self._pin(node) for node in below[1:])\n",
    ),
    "radix: salt not in the namespace": (
        "backends/radix/key.py",
        "return None if req.namespace == (None, None) else req.namespace",
        "return None if req.lora_name is None else req.lora_name",
    ),
    "kernel: the combine averages the splits instead of weighting them by log-sum-exp": (
        "kernels/paged_attention.py",
        "w = tl.math.exp2(lse - tl.max(lse, 0))",
        'w = tl.where(lse > float("-inf"), 1.0, 0.0)',
    ),
    "kernel: a split's range ends one tile early": (
        "kernels/paged_attention.py",
        "kv_hi = tl.minimum(kv_end, kv_lo + split_len)",
        "kv_hi = tl.minimum(kv_end, kv_lo + split_len - BLOCK_N)",
    ),
    "kernel: batch-invariant query blocks not aligned to absolute positions": (
        "kernels/paged_attention.py",
        "shift = prefix_len % BLOCK_Q if ALIGN_Q else 0",
        "shift = 0",
    ),
    "synthesis: a hash maps to the quotient's multiple, not the remainder": (
        "prefixcache/synthesis.py",
        "    x -= quotient\n",
        "    x = quotient\n",
    ),
    "synthesis: past a planned output, the simulated tokens start at their first position": (
        "prefixcache/synthesis.py",
        "    return planned + simulated_tokens(seed, req.request_id, n, vocab_size)[len(planned) :]\n",
        "    return planned + simulated_tokens(seed, req.request_id, n - len(planned), vocab_size)\n",
    ),
    "request: a range read past the prompt starts the output at its first token": (
        "prefixcache/request.py",
        "            out += self._early_output[max(start - p, 0) : end - p]\n",
        "            out += self._early_output[: end - p]\n",
    ),
    "request: the engine's known output put beside the prompt after the token list was built": (
        "prefixcache/request.py",
        "        (self._early_output if tokens is None else tokens).extend(token_ids)\n",
        "        self._early_output.extend(token_ids)\n",
    ),
    "metrics: a run's frame built from the records' first fields only (the last column lost)": (
        "experiments/analysis/metrics.py",
        "    names = [f.name for f in dataclasses.fields(rows[0])]\n",
        "    names = [f.name for f in dataclasses.fields(rows[0])][:-1]\n",
    ),
    "request: a list prompt's array leaves the ids past its last whole chunk unwritten": (
        "prefixcache/request.py",
        "    if full < n:\n        struct.pack_into(",
        "    if False:\n        struct.pack_into(",
    ),
    "trace hashes: a store saved again writes its earlier rows twice (the new file not re-read)": (
        "experiments/inputs/trace_hashes.py",
        '        self._row_of[rows["node"]] = np.arange(len(rows))\n',
        "",
    ),
    "trace hashes: a store whose rows name a node twice is read": (
        "experiments/inputs/trace_hashes.py",
        "        if np.unique(nodes).size != nodes.size:\n",
        "        if False:\n",
    ),
}
# A mutant of these files runs these suites instead of SUITES (the kernel's own tests).
SUITES_BY_FILE = {
    "kernels/paged_attention.py": ["tests/test_kernel.py"],
    "prefixcache/request.py": ["tests/test_request.py", "tests/test_trace_hashes.py"],
    "prefixcache/synthesis.py": ["tests/test_traces.py"],
    "experiments/analysis/metrics.py": ["tests/test_metrics.py"],
    "experiments/inputs/trace_hashes.py": ["tests/test_trace_hashes.py"],
}
# Mutant sets kept beside the suites that catch them: each module has MUTANTS (same shape as
# above) and SUITES (what a mutant of it runs instead).
MUTANT_MODULES = [
    "tests.mutants_hybrid_kernel",
    "tests.mutants_hybrid_hashchain",
    "tests.mutants_hybrid_radix",
    "tests.mutants_mamba_radix",
    "tests.mutants_kv_events",
    "tests.mutants_hicache",
    "tests.mutants_offload_hashchain",
    "tests.mutants_eviction_zoo",
    "tests.mutants_batch",
    "tests.mutants_roofline",
    "tests.mutants_decomposition",
    "tests.mutants_hybrid_causes",
    "tests.mutants_fidelity_vllm",
    "tests.mutants_fidelity_sglang",
]


def all_mutants() -> dict[str, tuple[str, str, str, list[str]]]:
    """name -> (file, original, mutated, the suites that must catch it)."""
    import importlib

    out = {name: (rel, a, b, SUITES_BY_FILE.get(rel, SUITES)) for name, (rel, a, b) in MUTANTS.items()}
    for module_name in MUTANT_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name != module_name:
                raise
            continue
        for name, (rel, a, b) in module.MUTANTS.items():
            if name in out:
                raise ValueError(f"mutant {name!r} is defined twice")
            out[name] = (rel, a, b, list(module.SUITES))
    return out


# The slowest caught mutant takes 204 s on 2 cores (2026-12-06); a suite still running long past
# that is taken to hang (a mutant that loops for ever), and counts as not caught: look at it.
SUITE_TIMEOUT_S = 1800


def run_suites(suites: list[str]) -> bool | None:
    """Whether the suites pass (True: the mutant survived); None if they ran past the timeout."""
    env = dict(os.environ, HYPOTHESIS_PROFILE="ci", TRITON_INTERPRET="1")
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *suites]
    try:
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, timeout=SUITE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return None
    return done.returncode == 0


def why_stale(rel: str, original: str, mutated: str) -> str | None:
    """Why a mutant cannot be applied to its source as it is now (None: it can): its text must
    occur exactly once (a text that moved would otherwise be counted as not caught, or mutate
    a second place) and the mutated source must parse (one that cannot even import would be
    "caught" for nothing)."""
    if not (ROOT / rel).is_file():
        return f"NO FILE {rel}; update the mutant"
    source = (ROOT / rel).read_text()
    count = source.count(original)
    if count != 1:
        return f"ORIGINAL TEXT FOUND {count} TIMES in {rel} (must be once); update the mutant"
    try:
        compile(source.replace(original, mutated), rel, "exec")
    except SyntaxError as e:
        return f"THE MUTATED SOURCE DOES NOT PARSE ({e}); update the mutant"
    return None


def stale_mutants() -> dict[str, str]:
    """name -> why, for every mutant that cannot be applied (``--check-texts``; no test runs)."""
    out = {}
    for name, (rel, original, mutated, _) in all_mutants().items():
        why = why_stale(rel, original, mutated)
        if why is not None:
            out[name] = why
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m tests.mutants [SUBSTRING]``: every mutant, or those whose name contains it.
    ``python -m tests.mutants --check-texts``: only check that every mutant applies."""
    only = (sys.argv[1:] if argv is None else argv) or [""]
    if only[0] == "--check-texts":
        stale = stale_mutants()
        for name, why in stale.items():
            print(f"{name}: {why}")
        print(f"{len(all_mutants()) - len(stale)} of {len(all_mutants())} mutants apply")
        return 1 if stale else 0
    mutants = {k: v for k, v in all_mutants().items() if only[0] in k}
    survivors = []
    for name, (rel, original, mutated, suites) in mutants.items():
        why = why_stale(rel, original, mutated)
        if why is not None:
            print(f"{name}: {why}")
            survivors.append(name)
            continue
        path = ROOT / rel
        source = path.read_text()
        try:
            path.write_text(source.replace(original, mutated))
            passed = run_suites(suites)
        finally:
            path.write_text(source)
        caught = passed is False
        print(f"{'caught  ' if caught else 'SURVIVED' if passed else 'TIMEOUT '}  {name}")
        if not caught:
            survivors.append(name)
    print(f"{len(mutants) - len(survivors)} of {len(mutants)} mutants caught")
    return 1 if survivors else 0


if __name__ == "__main__":
    raise SystemExit(main())
