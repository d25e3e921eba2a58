"""vLLM 0.33's native CPU offloading (``OffloadingConnector`` + ``CPUOffloadingManager``), the
host tier of the hashchain backend (``make_cache("hashchain", cfg, host_tier=HostTierConfig())``).

spec (chunk size, host capacity, options), cpu_manager (the CPU chunk pool and its ref counts,
vLLM ``kv_offload/cpu/manager.py``), lru_manager / arc_manager (the two cache policies),
connector (the scheduler side: lookup, loads, store jobs, acknowledgements, metrics).
Dense layouts only (one full-attention group).
"""

from prefixcache.backends.hashchain.offload.connector import OffloadingConnectorScheduler, TransferJob
from prefixcache.backends.hashchain.offload.spec import OffloadSpec

__all__ = ["OffloadSpec", "OffloadingConnectorScheduler", "TransferJob"]
