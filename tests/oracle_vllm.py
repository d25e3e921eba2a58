"""A deliberately naive model of vLLM v1's block management, the oracle for block ids.

Plain lists and dicts, no hashing: a block's key is literally (namespace, all tokens up to the
end of the block), which is what a chained hash stands for. It follows REFERENCE.md A3-A4:
free list ascending from 1 (block 0 is the null block), allocation pops from the head, a reused
block loses its old key then (lazy eviction), the first-inserted block answers a lookup, and a
request frees its blocks in reverse order: unkeyed ones to the front, keyed ones to the back.
"""

from __future__ import annotations

from prefixcache import Request

Key = tuple


class NaiveVllm:
    def __init__(self, num_blocks: int, block_size: int, *, reverse_free: bool = True) -> None:
        self.B = block_size
        self.reverse_free = reverse_free
        self.free = list(range(1, num_blocks))  # index 0 = head = next to reuse
        self.ref = [0] * num_blocks
        self.key_of: list[Key | None] = [None] * num_blocks
        self.cached: dict[Key, list[int]] = {}
        self.tables: dict[str, list[int]] = {}

    def key(self, req: Request, i: int) -> Key:
        return (req.cache_salt, req.lora_name, tuple(req.all_token_ids[: (i + 1) * self.B]))

    def hit_blocks(self, req: Request) -> list[int]:
        blocks = []
        for i in range((req.num_tokens - 1) // self.B):
            owners = self.cached.get(self.key(req, i))
            if not owners:
                break
            blocks.append(owners[0])
        return blocks

    def lookup(self, req: Request) -> int:
        return len(self.hit_blocks(req)) * self.B

    def _pop(self, n: int) -> list[int]:
        out, self.free = self.free[:n], self.free[n:]
        for b in out:
            if self.key_of[b] is not None:
                self.cached[self.key_of[b]].remove(b)
                self.key_of[b] = None
            self.ref[b] = 1
        return out

    def _cache_full(self, req: Request, upto_tokens: int) -> None:
        table = self.tables[req.request_id]
        for i in range(min(upto_tokens, req.num_tokens) // self.B):
            b = table[i]
            if self.key_of[b] is None:
                self.key_of[b] = self.key(req, i)
                self.cached.setdefault(self.key_of[b], []).append(b)

    def allocate(self, req: Request, n: int) -> bool:
        if req.request_id not in self.tables:
            hits = self.hit_blocks(req)
            computed = len(hits) * self.B
            new = -(-(computed + n) // self.B) - len(hits)
            if new + sum(self.ref[b] == 0 for b in hits) > len(self.free):
                return False
            for b in hits:
                if self.ref[b] == 0:
                    self.free.remove(b)
                self.ref[b] += 1
            self.tables[req.request_id] = hits + self._pop(new)
            req.num_computed_tokens = computed
        else:
            table = self.tables[req.request_id]
            new = -(-(req.num_computed_tokens + n) // self.B) - len(table)
            if new > len(self.free):
                return False
            table.extend(self._pop(max(new, 0)))
        self._cache_full(req, req.num_computed_tokens + n)
        return True

    def release(self, req: Request) -> None:
        table = self.tables.pop(req.request_id)
        front, back = [], []
        for b in reversed(table) if self.reverse_free else table:
            self.ref[b] -= 1
            if self.ref[b] == 0:
                (back if self.key_of[b] is not None else front).append(b)
        self.free = front + self.free + back
