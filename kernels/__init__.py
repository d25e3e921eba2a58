"""The Triton paged-attention kernel and its PyTorch reference (``prefixcache.kernels``)."""
