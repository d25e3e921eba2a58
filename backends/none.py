"""The no-reuse baseline: same pool, same accounting, never a hit."""

from __future__ import annotations

from prefixcache.config import CacheConfig
from prefixcache.interface import PageUsage, PrefixCache, ensure
from prefixcache.pool import PagePool, PageTable
from prefixcache.request import Request


class NoCache(PrefixCache):
    name = "none"

    def __init__(self, config: CacheConfig, *, need_sort: bool = False) -> None:
        """need_sort: the pool's SGLang allocator mode, as for the radix backend (default: SGLang's)."""
        super().__init__(config)
        self.pool = PagePool(config.num_pages, need_sort=need_sort, page_size=config.page_size)
        self._pages: dict[str, PageTable] = {}

    def _lookup(self, req: Request) -> int:
        return 0

    def _admit(self, req: Request, num_new_tokens: int) -> bool:
        self._check_fits(req, num_new_tokens)
        pages = self.pool.alloc(-(-num_new_tokens // self.page_size))
        if pages is None:
            return False
        self._pages[req.request_id] = PageTable(pages)
        self._admitted(req, 0)
        return True

    def _extend(self, req: Request, total_tokens: int) -> bool:
        table = self._pages[req.request_id]
        need = -(-total_tokens // self.page_size) - len(table)
        if need <= 0:
            return True
        pages = self.pool.alloc(need)
        if pages is None:
            return False
        table.extend(pages)
        return True

    def _commit(self, req: Request) -> None:
        pass  # nothing is published: this backend never reuses KV

    def _release(self, req: Request) -> None:
        self.pool.free(self._pages.pop(req.request_id).array())

    def _page_table(self, req: Request) -> list[int]:
        return self._pages[req.request_id].tolist()

    def _evict(self, num_tokens: int) -> int:
        return 0

    def _reset(self) -> None:
        pass

    def usage(self) -> PageUsage:
        in_use = sum(len(t) for t in self._pages.values())
        return PageUsage(self.pool.num_free, 0, in_use)

    def check_invariants(self) -> None:
        super().check_invariants()
        self.pool.check()
        held = [p for t in self._pages.values() for p in t.tolist()]
        ensure(len(set(held)) == len(held), "a page is held by two requests")
        ensure(not any(self.pool.is_free(p) for p in held), "a held page is also free")
