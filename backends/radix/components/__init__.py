"""The components a tree adds to FULL (radix_cache.py's TreeComponent), as SGLang 0.5.23's
``unified_cache/components/``: SWA (swa.py) and MAMBA (mamba.py)."""
