"""Mutants of the eviction zoo (prefixcache/eviction.py and the caches' hooks; same shape as
tests/mutants.py): each breaks one behaviour; the suites in SUITES must fail under it."""

from __future__ import annotations

SUITES = [
    "tests/test_eviction_zoo.py",
    "tests/test_eviction_policies.py",
    "tests/test_radix_policies.py",
]

# name -> (file, original text, mutated text); the original text occurs exactly once
MUTANTS: dict[str, tuple[str, str, str]] = {
    "zoo: radix lrp's ghost walk does not go on from the evicted edge's own node": (
        "backends/radix/radix_cache.py",
        "            parent_id, length = found\n",
        "            _, length = found\n",
    ),
    "zoo: radix lrp credits no hit node": (
        "backends/radix/radix_cache.py",
        "            self.learner.reused(node, now)\n",
        "            pass\n",
    ),
    "zoo: radix lrp gives a release's class to nodes another request still locks": (
        "backends/radix/radix_cache.py",
        "            if node.lock_ref == 1:\n                self.learner.assign(node)",
        "            if node.lock_ref >= 1:\n                self.learner.assign(node)",
    ),
    "zoo: a segmented index ignores the policy's choice of segment": (
        "prefixcache/eviction.py",
        "        return live[seg][0]  # type: ignore[no-any-return]",
        "        return live[min(live)][0]  # type: ignore[no-any-return]",
    ),
    "zoo: s3fifo's ghost never remembers an eviction from the small queue": (
        "prefixcache/eviction.py",
        "        if self.priority(entry)[0] == 0:\n            self.ghost.add(content_id)",
        "        if self.priority(entry)[0] == 0:\n            pass",
    ),
    "zoo: arc's target never grows on a B1 hit": (
        "prefixcache/eviction.py",
        "            self.p = min(float(self.capacity), self.p + max(b2 / b1, 1.0))",
        "            self.p = self.p",
    ),
    "zoo: radix never tells a policy of an evicted leaf (no ghost)": (
        "backends/radix/radix_cache.py",
        "            forget(self.policy, leaf, content_id)\n",
        "",
    ),
    "zoo: hashchain stamps no tail on a freed block (tlru sees every block as excess)": (
        "backends/hashchain/eviction.py",
        "                self.freed(block, now, after)  # type: ignore[arg-type]",
        "                self.freed(block, now, 0)  # type: ignore[arg-type]",
    ),
    "zoo: wa never learns a reuse": (
        "prefixcache/eviction.py",
        "                self.reuses[old] = self.reuses.get(old, 0.0) + 1",
        "                self.reuses[old] = self.reuses.get(old, 0.0)",
    ),
}
