"""The no-reuse baseline: same pool, same accounting, never a hit."""

from __future__ import annotations

from prefixcache.config import CacheConfig
from prefixcache.interface import LiveRequest, Match, PageUsage, PrefixCache, ensure
from prefixcache.pool import PagePool, PageTable
from prefixcache.request import Request


class NoCache(PrefixCache[PageTable]):
    """A live request's state is its page table."""

    name = "none"

    def __init__(self, config: CacheConfig, *, need_sort: bool = False) -> None:
        """need_sort: the pool's SGLang allocator mode, as for the radix backend (default: SGLang's)."""
        super().__init__(config)
        self.pool = PagePool(config.num_pages, need_sort=need_sort, page_size=config.page_size)
        self._in_use = 0  # pages the live requests hold (usage() is read every engine step)

    def _match(self, req: Request) -> Match:
        return Match(self, req, req.num_tokens, 0, 0)

    def _revalidate(self, match: Match) -> Match:
        return match  # nothing is ever cached: an empty match always holds

    def _index_version(self) -> int:
        return 0

    def _admit(self, req: Request, num_new_tokens: int, match: Match) -> PageTable | None:
        pages = self.pool.alloc(-(-num_new_tokens // self.page_size))
        if pages is None:
            return None
        self._in_use += len(pages)
        return PageTable(pages)

    def _extend(self, req: Request, state: PageTable, total_tokens: int) -> bool:
        need = -(-total_tokens // self.page_size) - len(state)
        if need <= 0:
            return True
        pages = self.pool.alloc(need)
        if pages is None:
            return False
        state.extend(pages)
        self._in_use += len(pages)
        return True

    def _decode_room(self, req: Request, state: PageTable) -> int:
        return len(state) * self.page_size - req.num_computed_tokens

    def _takes_decode_pages(self) -> bool:
        return True

    def _take_decode_pages(self, records: list[LiveRequest[PageTable]], calm_after: bool) -> bool:
        """What ``_extend`` one request after another takes for steps that each open a page,
        where none of those allocations would merge (they fit in the ready pages). A step
        inside held pages takes nothing here, whatever the pool: ``calm_after`` asks nothing."""
        if len(records) > self.pool.num_ready:
            return False
        pages = self.pool.alloc(len(records))
        assert pages is not None
        for live, page in zip(records, pages.tolist(), strict=True):
            live.state.append(page)
        self._in_use += len(records)
        return True

    def _commit(self, req: Request, state: PageTable) -> None:
        pass  # nothing is published: this backend never reuses KV

    def _release(self, req: Request, state: PageTable) -> None:
        self.pool.free(state.array())
        self._in_use -= len(state)

    def _page_table(self, req: Request, state: PageTable) -> list[int]:
        return state.tolist()

    def _evict(self, num_tokens: int) -> int:
        return 0

    def _reset(self) -> None:
        pass

    def usage(self) -> PageUsage:
        return PageUsage(self.pool.num_free, 0, self._in_use)

    def check_invariants(self) -> None:
        super().check_invariants()
        self.pool.check()
        held = [p for live in self._live.values() for p in live.state.tolist()]
        ensure(len(set(held)) == len(held), "a page is held by two requests")
        ensure(len(held) == self._in_use, f"{len(held)} pages held, {self._in_use} counted in use")
        ensure(not any(self.pool.is_free(p) for p in held), "a held page is also free")
