"""Prefix-cache backends (installed as ``prefixcache.backends``); each knows nothing of the others."""
