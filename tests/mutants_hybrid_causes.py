"""Mutants of the hybrid-causes study (issue 32, item 1): its steps must sum to each measured
gap, each step must be the difference it names, and a run's interval must be its own."""

SUITES = ["tests/test_study_hybrid_causes.py"]

MUTANTS = {
    "hybrid causes: SGLang's pool share measured from hashchain, not from radix at equal pools": (
        "experiments/figures/study_hybrid_causes.py",
        '    "pool share": {"radix": 1.0, "radix-r1.0": -1.0},',
        '    "pool share": {"radix": 1.0, "hashchain-dense": -1.0},',
    ),
    "hybrid causes: a step's coefficients lose their signs": (
        "experiments/figures/study_hybrid_causes.py",
        "        c[effect.col[label]] += k\n",
        "        c[effect.col[label]] += abs(k)\n",
    ),
    "hybrid causes: every run's interval taken from the panel's first run": (
        "experiments/figures/study_hybrid_causes.py",
        "            lo, hi = np.percentile(effect.boot[:, i], [2.5, 97.5])",
        "            lo, hi = np.percentile(effect.boot[:, 0], [2.5, 97.5])",
    ),
    "hybrid causes: the sum check left out": (
        "experiments/figures/study_hybrid_causes.py",
        "        if not np.allclose(total, coefficients(effect, MEASURED)):",
        "        if False:",
    ),
}
