"""The components a hybrid tree adds to the core (unified_tree.py), as SGLang 0.5.23's
``unified_cache/components/``: SWA (swa.py) and MAMBA (mamba.py)."""
