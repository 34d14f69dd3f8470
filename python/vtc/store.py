"""The store of the shared counters: its protocol and its in-process twin.

What a replica sends in one sync (:class:`SyncRequest`) and gets back
(:class:`SyncReply`), the :class:`Store` protocol both stores keep, how tenants are
keyed in a store (:func:`encode`, :func:`decode`), which stored values are counters
(:func:`stored_number`), and :class:`LocalStore`, the in-process twin of the Redis
script (:mod:`vtc.redis_store`) that the simulator and the unit tests use.
:mod:`vtc.distributed` keeps the synchronizer and re-exports all of these.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Union

from vtc._core import MAX_COUNTER

Client = Union[int, str]

KEEP_MS = 7 * 24 * 3600 * 1000  # what the store applied from a replica outlives it this long
FORGET_BATCH = 64  # idle tenants a sync looks at, at most (the rest wait for the next syncs)


def encode(client: Client) -> str:
    """A tenant key as stored: ``i:<int>`` or ``s:<str>`` (ints and strs never collide)."""
    if isinstance(client, bool) or not isinstance(client, (int, str)):
        raise TypeError(f"client must be an int or a str, got {client!r}")
    return f"i:{client}" if isinstance(client, int) else f"s:{client}"


def decode(key: str | bytes) -> Client:
    """The inverse of :func:`encode`."""
    if isinstance(key, bytes):
        key = key.decode("utf-8", "surrogatepass")  # a str key may hold a lone surrogate
    return int(key[2:]) if key.startswith("i:") else key[2:]


def _encode_all(clients: Iterable[Client]) -> list[str]:
    """:func:`encode` of each of ``clients``, in one comprehension: no function call per
    int or str (a sync may push 10,000)."""
    return [
        f"i:{c}" if type(c) is int else f"s:{c}" if type(c) is str else encode(c) for c in clients
    ]


def _decode_all(keys: Iterable[str]) -> list[Client]:
    """:func:`decode` of each of ``keys`` (str, as :func:`encode` made them), in one
    comprehension: no function call per key (a sync may decode 10,000)."""
    return [int(k[2:]) if k[:2] == "i:" else k[2:] for k in keys]


# --------------------------------------------------------------------------- the store protocol
@dataclass
class SyncRequest:
    """One replica's sync: everything the store needs, in one message.

    ``services`` holds the service the replica charged since its last
    *acknowledged* sync ``base`` (``0``: none yet), per tenant; ``seq`` numbers
    the requests of this replica ``incarnation`` (which is also the epoch the
    store adopts if it has none). The store keeps, per replica, what it applied
    since ``base``, so a request whose reply was lost and whose amounts come
    again in the next one is counted exactly once, and a replayed request
    (``seq`` not above the last applied) changes nothing.

    ``add`` and ``remove`` change the replica's waiting set; with ``full`` set,
    ``add`` and ``keep`` together *are* the waiting set, ``remove`` is ignored,
    and ``keep`` lists the tenants that have been waiting here since before the
    last acknowledged sync (a reconciliation does not lift them: their deficit
    is kept), while ``add`` are arrivals (lifted to the global floor).
    ``hints`` (full syncs) are the replica's local counters, used only for a
    tenant the store has no counter of (it lost its data). ``forget_ms``: how
    long a tenant no replica has waiting must go untouched (no charge, no
    leave) before the store may forget its counter. Keys are :func:`encode`\\ d.

    ``since`` (``None``: no delta; the reply holds ``pull`` only): the counter
    version of the last reply this replica acknowledged (``0``: none, send
    all); the reply's ``changed`` then holds the counters of the tenants
    waiting here written since, plus a scrub batch of the waiting set from
    ``cursor`` on (the reply's ``cursor`` goes on from there).
    """

    replica: str
    epoch: str | bytes
    incarnation: str
    seq: int
    base: int
    full: bool
    services: dict[str, float]
    add: list[str]
    remove: list[str]
    pull: list[str]
    liveness_ms: int
    keep: list[str] = field(default_factory=list)
    hints: dict[str, float] = field(default_factory=dict)
    forget_ms: int = 60_000
    since: int | None = None
    cursor: str = "0"
    #: ``services`` as the script's argument, one JSON array ``[key, amount, ...]``
    #: built by the core's ledger (``services`` is then empty): for a store that
    #: says ``takes_json`` (:class:`RedisStore`), so a push of every tenant does not
    #: encode each in Python
    services_json: bytes | None = None
    #: the caller reads the changed counters itself: the reply's ``changed_raw``
    #: holds the script's text (its core ledger parses and applies it), ``changed``
    #: stays empty (a store that does not say ``takes_json`` ignores this)
    raw_reply: bool = False


@dataclass
class SyncReply:
    """The store's answer: ``status`` is ``"ok"``, ``"resync"`` (send the full state)
    or ``"duplicate"`` (a newer live process syncs under this replica id: nothing
    was applied; sync under another id).

    ``counters`` holds one value per pulled tenant, ``None`` for a tenant the
    store has no counter of.  With ``since`` set: ``version``, the store's
    counter version after this sync (the next request's ``since`` once this
    reply is acknowledged), and ``changed`` (see :class:`SyncRequest`).
    """

    status: str
    epoch: str | bytes
    floor: float | None = None
    counters: list[float | None] = field(default_factory=list)
    version: int | None = None
    changed: dict[str, float] = field(default_factory=dict)
    cursor: str = "0"
    #: with :attr:`SyncRequest.raw_reply`: ``changed`` as the script sent it, the
    #: JSON array of keys and the values comma-separated
    changed_raw: tuple[bytes, bytes] | None = None


class Store(Protocol):
    """Where the global counters live: :class:`RedisStore` or its twin :class:`LocalStore`."""

    def sync(self, req: SyncRequest) -> SyncReply: ...  # noqa: D102
    def counters(self) -> dict[Client, float]: ...  # noqa: D102
    def backlog(self) -> dict[Client, float]: ...  # noqa: D102


def stored_number(raw: Any) -> float | None:
    """A stored counter as a float, or ``None`` unless it is one: finite, in ``[0, MAX_COUNTER]``.

    Anything else (``abc``, ``nan``, ``inf``, ``1e300``, bytes that are not
    text) is what a corrupt or hostile store holds; it is never used.
    """
    if raw is None or raw == b"" or raw == "":
        return None
    try:
        x = float(raw)
    except (TypeError, ValueError):
        return None
    return x if 0.0 <= x <= MAX_COUNTER else None  # False for nan


@dataclass
class _Applied:
    """What :class:`LocalStore` applied from one replica since its last acknowledged sync."""

    inc: str
    seq: int
    base: int
    amounts: dict[str, float] = field(default_factory=dict)


class LocalStore:
    """An in-process twin of :data:`SYNC_LUA` (same semantics), for simulations and unit tests.

    ``clock`` returns milliseconds (default: wall clock); the simulator passes
    its step counter.  It holds only numbers, so it has no corrupt values.
    """

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        self.clock = clock or (lambda: time.time() * 1000)
        self.epoch: str | bytes | None = None
        self.counter: dict[str, float] = {}
        self.bl: dict[str, float] = {}
        self.refs: dict[str, int] = {}
        self.lastleft: float | None = None
        self.seen: dict[str, float] = {}
        self.waiting: dict[str, set[str]] = {}
        self.applied: dict[str, _Applied] = {}
        self.owner: dict[str, str] = {}
        self.gone: dict[str, set[str]] = {}
        self.idle: dict[str, float] = {}  # tenants nobody has waiting -> last touched
        self.forgot = 0.0  # the largest counter forgotten
        self.ver = 0  # the counter version: one per sync that writes a counter
        self.cv: dict[str, int] = {}  # tenant -> version of its counter's last write
        self._wver: int | None = None
        self._now = 0.0

    def _floor(self) -> float | None:
        if self.bl:
            return min(self.bl.values())
        return self.lastleft

    def _write(self, c: str, g: float) -> None:
        self.counter[c] = g
        if self._wver is None:
            self.ver += 1
            self._wver = self.ver
        self.cv[c] = self._wver
        if self.refs.get(c, 0) > 0:
            self.bl[c] = g
        else:
            self.idle[c] = self._now

    def _leave(self, c: str) -> None:
        self.refs[c] = self.refs.get(c, 0) - 1
        if self.refs[c] <= 0:
            del self.refs[c]
            self.bl.pop(c, None)
            if c in self.counter:
                self.lastleft = self.counter[c]
                self.idle[c] = self._now

    def _join(self, c: str) -> bool:
        self.refs[c] = self.refs.get(c, 0) + 1
        if self.refs[c] == 1:
            self.idle.pop(c, None)
        return self.refs[c] == 1

    def _forget(self, now: float, forget_ms: float) -> None:
        """Forget the counters of idle tenants untouched for ``forget_ms``, at most
        the floor (the comment above :data:`SYNC_LUA`), a batch at a time."""
        floor = self._floor()
        if floor is None:
            return
        due = sorted((t, c) for c, t in self.idle.items() if t <= now - forget_ms)
        for _, c in due[:FORGET_BATCH]:
            g = self.counter.get(c)
            idle = self.refs.get(c, 0) == 0
            if g is not None and idle and g > floor:
                self.idle[c] = now  # above the floor: looked at again later
                continue
            del self.idle[c]
            if g is not None and idle:
                del self.counter[c]
                self.cv.pop(c, None)
                self.forgot = max(self.forgot, g)

    def sync(self, req: SyncRequest) -> SyncReply:
        """What the Lua script does, step by step."""
        if self.epoch is None:
            self.epoch = req.incarnation
        owner = self.owner.get(req.replica)
        if owner != req.incarnation:
            if req.incarnation in self.gone.get(req.replica, ()):
                return SyncReply("duplicate", self.epoch)
            if not req.full:
                return SyncReply("resync", self.epoch)
            if owner is not None:
                self.gone.setdefault(req.replica, set()).add(owner)
            self.owner[req.replica] = req.incarnation
        if not req.full and (self.epoch != req.epoch or req.replica not in self.seen):
            return SyncReply("resync", self.epoch)
        now = self._now = self.clock()
        self._wver, ver0 = None, self.ver
        for d in sorted(r for r, s in self.seen.items() if s <= now - req.liveness_ms):
            if d != req.replica:
                for c in sorted(self.waiting.pop(d, set())):
                    self._leave(c)
                del self.seen[d]
                self.owner.pop(d, None)
        self.seen[req.replica] = now
        self._forget(now, req.forget_ms)
        rec = self.applied.get(req.replica)
        replay = False
        if rec is None or rec.inc != req.incarnation:
            rec = None
        elif req.seq <= rec.seq:
            replay = True
        elif req.base >= rec.seq:
            rec = None
        if not replay:
            if rec is None:
                rec = _Applied(req.incarnation, req.seq, req.base)
            rec.seq, rec.base = req.seq, req.base
            self.applied[req.replica] = rec
            for c, amt in req.services.items():
                old = rec.amounts.get(c, 0.0)
                if amt > old:
                    g = self.counter.get(c)
                    if g is None:
                        g = max(req.hints.get(c, 0.0), self.forgot + amt - old)
                    else:
                        g += amt - old
                    self._write(c, min(g, MAX_COUNTER))
                    rec.amounts[c] = amt
            for c, v in req.hints.items():
                if c not in self.counter:
                    self._write(c, max(v, self.forgot))
            mine = self.waiting.setdefault(req.replica, set())
            if req.full:
                rems = sorted(mine - set(req.add) - set(req.keep))
            else:
                rems = req.remove
            for c in rems:
                if c in mine:
                    mine.discard(c)
                    self._leave(c)
            for c in req.keep:
                if c not in mine:
                    mine.add(c)
                    if self._join(c):
                        self._write(c, self.counter.get(c, self.forgot))
            f = self._floor()
            for c in req.add:
                if c not in mine:
                    mine.add(c)
                    if self._join(c):
                        g = self.counter.get(c, self.forgot)
                        if f is not None and f > g:
                            g = f
                        self._write(c, g)
        pulled = [self.counter.get(c) for c in req.pull]
        if req.since is None:
            return SyncReply("ok", self.epoch, self._floor(), pulled)
        mine = self.waiting.get(req.replica, set())
        since = req.since
        full = since == 0 or since > ver0
        arrived = set(req.add)
        changed = {
            c: self.counter[c]
            for c in mine
            if c in self.counter and (full or c in arrived or self.cv.get(c, 0) > since)
        }
        return SyncReply("ok", self.epoch, self._floor(), pulled, self.ver, changed)

    def counters(self) -> dict[Client, float]:
        """Every tenant's global counter."""
        return {decode(k): v for k, v in self.counter.items()}

    def backlog(self) -> dict[Client, float]:
        """The globally backlogged tenants and their counters."""
        return {decode(k): v for k, v in self.bl.items()}
