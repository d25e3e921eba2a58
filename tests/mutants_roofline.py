"""Mutants of the GPU roofline clock (issue 30, item 3) and of the engine's context counts:
each step must be charged exactly its requests' context, deferred or stepped."""

SUITES = [
    "tests/test_roofline.py",
    "tests/test_engine.py::test_deferral_charges_a_context_reading_clock_as_step_by_step",
]

MUTANTS = {
    "roofline: causal attention's n(n+1)/2 pairs of a chunk charged as n": (
        "prefixcache/engine.py",
        "                pairs += n * c + n * (n + 1) // 2",
        "                pairs += n * c + n",
    ),
    "roofline: the new tokens' KV writes not charged": (
        "prefixcache/roofline.py",
        "            kv_bytes=float(m.kv_bytes_per_token) * (context_tokens + 2 * tokens),",
        "            kv_bytes=float(m.kv_bytes_per_token) * (context_tokens + tokens),",
    ),
    "roofline: the projections charged their FLOPs only (a memory-bound decode made cheap)": (
        "prefixcache/roofline.py",
        "        linear = larger(w.linear_flops / peak, w.weight_bytes / bw)",
        "        linear = w.linear_flops / peak",
    ),
    "engine: a decode stretch charges every step the first step's context": (
        "prefixcache/engine.py",
        "                at = context + taken * width",
        "                at = context",
    ),
    "engine: deferred decoders charged the context of the step before": (
        "prefixcache/engine.py",
        "            context = self._deferred_context_base + num_deferred * self.step_count",
        "            context = self._deferred_context_base + num_deferred * (self.step_count - 1)",
    ),
    "engine: a taken-up decoder's context still counted among the deferred": (
        "prefixcache/engine.py",
        "        self._deferred_context_base -= req.num_computed_tokens - first\n",
        "",
    ),
}
