"""The approximate radix tree of SGLang's router (sgl-router / smg ``tree.rs``) and Ray Serve's
``PrefixTree``: one character tree shared by every worker, built only from the text the router
routed, never from what the engines cache or evict.

Each node has a text edge and, per worker ("tenant") that routed text through it, the time of
its last access. Each tenant's size is the characters of the nodes it holds; eviction trims a
tenant's least recently used leaves until it fits.
"""

from __future__ import annotations

from dataclasses import dataclass, field


def common_prefix_length(edge: str, text: str, start: int) -> int:
    """``len(os.path.commonprefix([edge, text[start:]]))`` in C string compares: a whole edge
    that matches (the common case on a path) is one ``startswith``; otherwise a binary search
    over prefixes of ``edge``. No copy of ``text`` and no Python step per character (prompts
    are tens of thousands of characters and edges as long)."""
    if text.startswith(edge, start):
        return len(edge)
    lo, hi = 0, min(len(edge), len(text) - start)  # edge[:lo] matches; edge[:hi + 1] does not
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if text.startswith(edge[lo:mid], start + lo):
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass(eq=False)
class CharNode:
    text: str
    parent: CharNode | None
    children: dict[str, CharNode] = field(default_factory=dict)  # first character -> child
    tenants: dict[int, float] = field(default_factory=dict)  # tenant -> last access (insertion order kept)


@dataclass(frozen=True, slots=True)
class CharMatch:
    matched_chars: int
    owners: tuple[int, ...]  # the tenants of the deepest matched node, in map order (none at the root)

    @property
    def tenant(self) -> int | None:
        """SGLang's pick: the first key of the node's tenant map."""
        return self.owners[0] if self.owners else None


class CharTree:
    def __init__(self) -> None:
        self.root = CharNode("", None)
        self.size: dict[int, int] = {}  # tenant -> characters held

    def insert(self, text: str, tenant: int, now: float) -> None:
        node, i = self.root, 0
        self._touch(node, tenant, now)
        while i < len(text):
            child = node.children.get(text[i])
            if child is None:
                leaf = CharNode(text[i:], node)
                node.children[text[i]] = leaf
                self._touch(leaf, tenant, now)
                return
            shared = common_prefix_length(child.text, text, i)
            if shared < len(child.text):
                child = self._split(child, shared)
            self._touch(child, tenant, now)
            node, i = child, i + shared

    def prefix_match(self, text: str, now: float | None = None) -> CharMatch:
        """Deepest match of ``text``; a match ending inside an edge counts its characters and
        takes that child's owner. ``now`` refreshes the owners' access times along the path."""
        node, i = self.root, 0
        while i < len(text):
            child = node.children.get(text[i])
            if child is None:
                break
            shared = common_prefix_length(child.text, text, i)
            i += shared
            node = child
            if shared < len(child.text):
                break
        if now is not None:
            p: CharNode | None = node
            while p is not None:
                for t in p.tenants:
                    p.tenants[t] = now
                p = p.parent
        return CharMatch(i, tuple(node.tenants) if node is not self.root else ())

    def tenant_match(self, text: str, tenant: int) -> int:
        """Characters of ``text`` on a path that ``tenant`` holds."""
        node, i = self.root, 0
        while i < len(text):
            child = node.children.get(text[i])
            if child is None or tenant not in child.tenants:
                break
            shared = common_prefix_length(child.text, text, i)
            i += shared
            if shared < len(child.text):
                break
            node = child
        return i

    def smallest_tenant(self, tenants: list[int]) -> int:
        """The tenant holding the fewest characters (the first on ties)."""
        return min(tenants, key=lambda t: self.size.get(t, 0))

    def evict_tenant_by_size(self, max_size: int) -> None:
        """Trim every tenant's least recently used leaves until it holds <= max_size characters."""
        for tenant in list(self.size):
            if self.size[tenant] <= max_size:
                continue
            leaves = sorted(self._leaves_of(tenant), key=lambda n: n.tenants[tenant])
            while self.size[tenant] > max_size and leaves:
                node = leaves.pop(0)
                self._drop(node, tenant)
                parent = node.parent
                if parent is not None and parent is not self.root and tenant in parent.tenants and not any(
                    tenant in c.tenants for c in parent.children.values()
                ):
                    # The parent became one of the tenant's leaves: it goes in LRU order too.
                    leaves.append(parent)
                    leaves.sort(key=lambda n: n.tenants[tenant])

    # ------------------------------------------------------------ internals
    def _touch(self, node: CharNode, tenant: int, now: float) -> None:
        if tenant not in node.tenants and node is not self.root:
            self.size[tenant] = self.size.get(tenant, 0) + len(node.text)
        elif node is self.root:
            self.size.setdefault(tenant, 0)
        node.tenants[tenant] = now

    def _split(self, child: CharNode, at: int) -> CharNode:
        """Cut ``child``'s edge after ``at`` characters; the new upper node keeps its owners."""
        assert child.parent is not None
        upper = CharNode(child.text[:at], child.parent, tenants=dict(child.tenants))
        child.parent.children[child.text[0]] = upper
        child.text = child.text[at:]
        child.parent = upper
        upper.children[child.text[0]] = child
        return upper

    def _leaves_of(self, tenant: int) -> list[CharNode]:
        out, stack = [], [self.root]
        while stack:
            node = stack.pop()
            held = [c for c in node.children.values() if tenant in c.tenants]
            if node is not self.root and not held and tenant in node.tenants:
                out.append(node)
            stack.extend(held)
        return out

    def _drop(self, node: CharNode, tenant: int) -> None:
        del node.tenants[tenant]
        self.size[tenant] -= len(node.text)
        if not node.tenants and not node.children and node.parent is not None:
            del node.parent.children[node.text[0]]
