"""Where to split a large GCS folder's listing so that each range holds about as many names."""

import dataclasses
import heapq
import itertools

# A descent's check of sibling uniformity: an estimate off by more than this is not trusted.
_UNIFORMITY_FACTOR = 2.0


def next_character(character: str) -> str | None:
    """The character after `character` in code point (so UTF-8 byte) order, skipping surrogates."""
    point = ord(character) + 1
    if 0xD800 <= point <= 0xDFFF:
        point = 0xE000
    return chr(point) if point <= 0x10FFFF else None


def successor(prefix: str) -> str | None:
    """The least name after every name that starts with `prefix` (None: no bound)."""
    while prefix:
        following = next_character(prefix[-1])
        if following is not None:
            return prefix[:-1] + following
        prefix = prefix[:-1]
    return None


@dataclasses.dataclass(eq=False)
class _Node:
    """The names that start with `prefix` (for a leaf of the name itself: that one name)."""

    prefix: str
    seen: int  # names seen in pages (exact unless `full`)
    full: bool  # names go on past what the pages showed
    parent: "_Node | None" = None
    children: "list[_Node] | None" = None  # once expanded; the name equal to the prefix comes first
    estimate: float = 0.0
    measured: bool = False  # estimate from a descent of its own, not from a sibling's

    @property
    def count(self) -> float:
        return self.estimate if self.full else self.seen


class _Counter:
    """Pages of names, within a request budget."""

    def __init__(self, page_of, page: int, max_requests: int):
        self._page_of = page_of
        self.page = max(2, page)
        self.max_requests = max_requests
        self.requests = 0

    @property
    def spent(self) -> bool:
        return self.requests >= self.max_requests

    def page_from(self, start: str, end: str | None) -> tuple[list[str], bool]:
        self.requests += 1
        names, more = self._page_of(start, end, self.page)
        # The names in [start, end): a server that ignores the offsets (the tests' emulator) sends others.
        return [name for name in names if name >= start and (end is None or name < end)], more


def count_children(counter: _Counter, node: _Node) -> list[_Node]:
    """The children of `node` (the name equal to its prefix first, as a child of that same prefix), each
    counted exactly or marked full: one request per page, skipping past each full child."""
    prefix = node.prefix
    end = successor(prefix)
    children: list[_Node] = []
    start = prefix
    while not counter.spent:
        names, more = counter.page_from(start, end)
        if not names:
            break
        groups = itertools.groupby(names, key=lambda name: name[: len(prefix) + 1])
        page_children = [_Node(key, sum(1 for _ in group), False, node) for key, group in groups]
        if more:
            page_children[-1].full = True
        children.extend(page_children)
        if not more:
            break
        last = page_children[-1].prefix
        following = successor(last) if len(last) > len(prefix) else None
        if following is None or following == end:
            break
        start = following
    node.children = children
    return children


def _measure(counter: _Counter, node: _Node) -> float:
    """`node`'s estimated name count, from a descent through first full children (see the module doc)."""
    path = [node]
    while not counter.spent:
        current = path[-1]
        if current.children is None:
            count_children(counter, current)
        first_full = next((child for child in current.children if child.full), None)
        if first_full is None or first_full.measured:
            break
        path.append(first_full)
    for current in reversed(path):
        _estimate_from_children(current)
        current.measured = True
    return node.estimate


def _estimate_from_children(node: _Node):
    """A node's estimate: its exact children, and its full ones each like the first of them."""
    if node.children is None:
        node.estimate = max(node.estimate, node.seen)
        return
    full = [child for child in node.children if child.full]
    exact = sum(child.seen for child in node.children if not child.full)
    if full:
        like = full[0].estimate if full[0].measured else full[0].seen
        for child in full[1:]:
            if not child.measured:
                child.estimate = max(child.seen, like)
        full[0].estimate = max(full[0].estimate, full[0].seen)
    node.estimate = exact + sum(child.estimate for child in full)


def _leaves(node: _Node):
    if node.children is None:
        yield node
        return
    for child in node.children:
        if child.prefix == node.prefix:
            yield child  # the name equal to the prefix: a leaf of its own
        else:
            yield from _leaves(child)


def plan_boundaries(page_of, target: int, page: int = 1000, max_requests: int = 2048) -> list[str]:
    """Range starts that split a folder's names into ranges of about total/`target` names each, with at most
    `max_requests` calls of `page_of(start, end, limit)` -> (sorted names in [start, end), more?)."""
    counter = _Counter(page_of, page, max_requests)
    root = _Node("", 0, True)
    total = _measure(counter, root)
    ideal = max(1.0, total / max(1, target))
    order = itertools.count()
    heap = [(-child.estimate, next(order), child) for child in _leaves(root) if child.full]
    heapq.heapify(heap)
    uniform_parents: set[int] = set()
    while heap and not counter.spent:
        negative, _, node = heapq.heappop(heap)
        if -negative <= ideal:
            break
        if not node.measured and id(node.parent) not in uniform_parents:
            # The first sibling expanded checks that its siblings are alike (else each is measured).
            assumed = node.estimate
            measured = _measure(counter, node)
            if assumed / _UNIFORMITY_FACTOR <= measured <= assumed * _UNIFORMITY_FACTOR:
                uniform_parents.add(id(node.parent))
            _refresh(node.parent)
            ideal = max(1.0, root.estimate / max(1, target))
        if node.children is None:
            count_children(counter, node)
            _estimate_children_like_parent(node)
        for child in node.children:
            if child.full:
                heapq.heappush(heap, (-child.estimate, next(order), child))
    return _pack(list(_leaves(root)), ideal)


def _estimate_children_like_parent(node: _Node):
    """After expanding a node: its full children share what its exact ones leave of its estimate."""
    full = [child for child in node.children if child.full]
    if not full:
        return
    exact = sum(child.seen for child in node.children if not child.full)
    share = max(0.0, node.estimate - exact) / len(full)
    for child in full:
        if not child.measured:
            child.estimate = max(child.seen, share)


def _refresh(node: _Node | None):
    """After a descendant's estimate changed: its ancestors hold the sum of their children."""
    while node is not None:
        if node.children is not None:
            node.estimate = sum(child.count for child in node.children)
        node = node.parent


def _pack(leaves: list[_Node], ideal: float) -> list[str]:
    """Range starts over the leaves in name order, each range holding at most `ideal` where it can."""
    boundaries, held = [], 0.0
    for leaf in leaves:
        if held > 0 and held + leaf.count > ideal:
            boundaries.append(leaf.prefix)
            held = 0.0
        held += leaf.count
    return boundaries
