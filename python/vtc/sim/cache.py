"""A prefix cache for the engine model: blocks of KV, LRU eviction, pinned while in use.

The cache holds *chains*.  A chain is the run of KV blocks of one piece of
prompt identified by a key: a shared prefix (a system prompt, a document)
or a request's own suffix.  A request's prompt is a sequence of chains
(:func:`chains`): the shared prefix segments it names, then its own suffix.
A block belongs to the chain of the segment its last token falls in (its
content depends on everything before it, so a block that straddles two
segments is the later one's).

As in vLLM's block manager and SGLang's radix cache:

* what a chain has cached is always a prefix of it (blocks ``0..n-1``), and
  a request's hit is the run of cached blocks from the start of its first
  chain up to the first missing one (:meth:`PrefixCache.lookup`);
* a running request *pins* its chains (:meth:`PrefixCache.acquire`): pinned
  blocks are never evicted; after its prefill its prompt blocks are inserted,
  evicting unpinned blocks if the cache is full; :meth:`PrefixCache.release`
  unpins them when it finishes or is preempted;
* eviction is least recently used, by chain, from the tail of the chain
  (a chain's last block goes first, like a radix tree's leaves); a request's
  chains are released tail first, so its own suffix is evicted before the
  prefix it shares.

``capacity`` (tokens, rounded down to whole blocks) bounds every block held,
pinned or not; an insertion that cannot evict enough (everything else is
pinned) inserts what fits and no more.  The cache is separate from the
scheduler's KV budget ``M``: ``M`` still counts every running request's full
prompt (the core's occupancy does not deduplicate shared blocks).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence

Chain = tuple[Hashable, int]  # (key, number of blocks)

BLOCK = 16  # tokens per KV block (vLLM's and SGLang's usual page size)


def chains(
    prefix: Sequence[tuple[Hashable, int]], prompt_len: int, own: Hashable, block: int = BLOCK
) -> list[Chain]:
    """The chains of a prompt of ``prompt_len`` tokens whose first tokens are ``prefix``.

    ``prefix`` is a sequence of shared segments ``(key, tokens)``; a key must
    name one path of segments (the same key always after the same keys).  The
    rest of the prompt is the request's own suffix, chained under ``own``.
    Chains with no whole block are left out.
    """
    out: list[Chain] = []
    start = 0
    for key, length in prefix:
        end = start + length
        n = end // block - start // block
        if n:
            out.append((key, n))
        start = end
    if start > prompt_len:
        raise ValueError(f"prefix of {start} tokens longer than the prompt ({prompt_len})")
    n = prompt_len // block - start // block
    if n:
        out.append((own, n))
    return out


class PrefixCache:
    """Block-granular prefix cache of ``capacity`` tokens with LRU eviction and pinning.

    Counters (tokens): ``hits`` and ``lookups`` over :meth:`acquire` calls
    (the hit and the prompt tokens that could have hit), ``inserted``,
    ``evicted``; ``peak`` the most tokens ever held.
    """

    def __init__(self, capacity: int, block: int = BLOCK) -> None:
        if block < 1 or capacity < 0:
            raise ValueError(f"need block >= 1 and capacity >= 0, got {block}, {capacity}")
        self.block = block
        self.capacity = capacity // block * block
        self._blocks = capacity // block  # in blocks
        self._n: dict[Hashable, int] = {}  # chain -> blocks cached (a prefix of it)
        self._pins: dict[Hashable, int] = {}  # chain -> running requests using it
        self._lru: OrderedDict[Hashable, None] = OrderedDict()  # unpinned chains, oldest first
        self._held = 0  # blocks
        self.hits = 0
        self.lookups = 0
        self.inserted = 0
        self.evicted = 0
        self.peak = 0

    @property
    def used(self) -> int:
        """Tokens held (pinned or not); never above ``capacity``."""
        return self._held * self.block

    @property
    def pinned(self) -> int:
        """Tokens held by chains that a running request uses."""
        return sum(self._n.get(k, 0) for k in self._pins) * self.block

    def cached(self, key: Hashable) -> int:
        """Blocks of chain ``key`` in the cache."""
        return self._n.get(key, 0)

    def lookup(self, chains: Sequence[Chain]) -> int:
        """Tokens of the longest cached prefix of ``chains`` (no side effect)."""
        hit = 0
        for key, n in chains:
            c = self._n.get(key, 0)
            hit += min(c, n)
            if c < n:
                break
        return hit * self.block

    def acquire(self, chains: Sequence[Chain]) -> int:
        """A request is admitted: returns its hit (tokens, as :meth:`lookup`), pins
        its chains and inserts the blocks its prefill computes.

        Blocks go in chain by chain, evicting unpinned ones least recently
        used first; when the cache cannot make room, the rest is not cached.
        """
        hit = self.lookup(chains)
        self.hits += hit
        self.lookups += sum(n for _, n in chains) * self.block
        for key, _ in chains:
            pins = self._pins.get(key, 0)
            if not pins:
                self._lru.pop(key, None)
            self._pins[key] = pins + 1
        for key, n in chains:
            have = self._n.get(key, 0)
            if have >= n:
                continue
            want = n - have
            self._make_room(want)
            got = min(want, self._blocks - self._held)
            if got:
                self._n[key] = have + got
                self._held += got
                self.inserted += got * self.block
            if got < want:
                break  # a chain's cached part stays a prefix: nothing after a gap
        self.peak = max(self.peak, self.used)
        return hit

    def release(self, chains: Sequence[Chain]) -> None:
        """A request that :meth:`acquire` pinned ``chains`` for finished or was
        preempted: unpin them, tail first (the tail becomes evictable first)."""
        for key, _ in reversed(chains):
            pins = self._pins[key] - 1
            if pins:
                self._pins[key] = pins
                continue
            del self._pins[key]
            if self._n.get(key, 0):
                self._lru[key] = None  # most recently used end

    def _make_room(self, want: int) -> None:
        """Evict unpinned blocks, least recently used chain first, tail first,
        until ``want`` blocks are free or nothing unpinned is left."""
        short = self._held + want - self._blocks
        while short > 0 and self._lru:
            key = next(iter(self._lru))
            have = self._n[key]
            take = min(have, short)
            self.evicted += take * self.block
            self._held -= take
            short -= take
            if take == have:
                del self._n[key]
                del self._lru[key]
            else:
                self._n[key] = have - take

    def check(self) -> None:
        """Assert the invariants (tests): within capacity, counts consistent,
        every unpinned chain in the LRU order and no pinned one."""
        assert 0 <= self._held <= self._blocks, (self._held, self._blocks)
        assert self._held == sum(self._n.values())
        assert all(v > 0 for v in self._n.values())
        assert set(self._lru) == {k for k in self._n if k not in self._pins}
        assert all(v > 0 for v in self._pins.values())
