"""Syncs fed by the core's change feed (issue 15, item 5, the push side): a sync reads
only the tenants changed since the last (``Scheduler.changes``, slot
``vtc.config.SYNC_CHANGES_READER``), for the services it folds and, with
``waiting=CORE_WAITING``, the waiting set; and the store ends up exactly where the old
full read (every service, ``active_clients()``) takes it."""

from __future__ import annotations

import itertools
import random

import pytest
from sync_helpers import Recording

import vtc
from vtc import distributed as D
from vtc._core import MIN_WEIGHT
from vtc.config import METRICS_CHANGES_READER, SYNC_CHANGES_READER
from vtc.metrics import CHANGES_READER

_rid = itertools.count(1)


def store(server, ns: str) -> Recording:
    return Recording(D.RedisStore.from_url(server.url, ns, timeout_ms=2000))


def waiting_of(s: vtc.Scheduler) -> list:
    """What ``SharedCounterSync.waiting`` reads: every tenant with something waiting."""
    return [c for c, (w, _) in s.active_clients().items() if w]


def test_the_slots_are_distinct():
    assert CHANGES_READER == METRICS_CHANGES_READER != SYNC_CHANGES_READER
    assert 0 <= SYNC_CHANGES_READER < vtc.CHANGE_READERS


def test_a_sync_reads_only_the_tenants_changed(redis_server):
    n = 1000
    s = vtc.Scheduler(1 << 20)
    rids, queued = {}, {}
    for c in range(n):
        rids[c], queued[c] = next(_rid), next(_rid)
        s.submit(rids[c], f"t{c}", 10)
    s.schedule()
    for c in range(n):
        s.submit(queued[c], f"t{c}", 10)  # a second one, waiting
    assert all(s.status(queued[c]) == "waiting" for c in range(n))
    st = store(redis_server, "feed")
    sh = D.SharedCounters(st, replica_id="r0", retry_ms=0)
    sh.attach(s)
    assert sh.sync(s, D.CORE_WAITING)
    # two reads: the fold's (full), and, as the reply brought back more than 64 counters,
    # one for what was charged during the round trip (nothing: no row)
    assert (sh.stats.feed_reads, sh.stats.feed_full_reads, sh.stats.feed_rows) == (2, 1, n)
    assert set(st.backlog()) == {f"t{c}" for c in range(n)}

    # three tenants charged, two new ones waiting, one leaves the waiting set
    s.decode([rids[1], rids[2], rids[3]], 5)
    s.submit(next(_rid), "new-a", 10)
    s.submit(next(_rid), "new-b", 10)
    s.cancel(queued[0])
    s.changes(CHANGES_READER)  # the metrics' read takes nothing from the sync's slot
    before = sh.stats.feed_rows
    assert sh.sync(s, D.CORE_WAITING)
    assert sh.stats.feed_full_reads == 1
    assert sh.stats.feed_rows - before == 6  # not n
    req = st.requests[-1]
    assert not req.full and req.add == ["s:new-a", "s:new-b"] and req.remove == ["s:t0"]
    assert set(req.services) == {"s:t1", "s:t2", "s:t3"}
    assert set(st.backlog()) == {f"t{c}" for c in range(1, n)} | {"new-a", "new-b"}

    # nothing changed: nothing read, nothing sent
    before = sh.stats.feed_rows
    assert sh.sync(s, D.CORE_WAITING)
    req = st.requests[-1]
    assert sh.stats.feed_rows == before
    assert not req.services and not req.add and not req.remove

    # without the feed: no feed reads at all (every service, as before)
    s2 = vtc.Scheduler(1 << 20)
    old = D.SharedCounters(store(redis_server, "old"), replica_id="r1", feed=False)
    assert old.sync(s2, D.CORE_WAITING) and old.stats.feed_reads == 0


class Side:
    """One replica: a scheduler and its SharedCounters, on its own namespace."""

    def __init__(self, server, ns: str, feed: bool) -> None:
        self.feed = feed
        self.st = store(server, ns)
        self.s = vtc.Scheduler(400)
        self.attach()

    def attach(self) -> None:
        self.sh = D.SharedCounters(self.st, replica_id="r", retry_ms=0, feed=self.feed)
        self.sh.attach(self.s)

    def sync(self) -> bool:
        return self.sh.sync(self.s, D.CORE_WAITING if self.feed else waiting_of(self.s))


def sent(req: D.SyncRequest) -> tuple:
    return (req.full, req.services, req.add, req.remove, req.pull, req.keep, req.hints)


@pytest.mark.parametrize("seed", range(4))
def test_the_feed_sends_what_the_full_read_sends(redis_server, seed):
    """Random operations (charges, weights, preemption, cancels, set-aside requests,
    forget_idle, lost replies, a reset feed, snapshot restarts), applied to two identical
    replicas on two namespaces: one syncs from the change feed, the other reads every
    service and ``active_clients()``. Every sync sends the same, and the global counters
    and backlogs are equal throughout."""
    rng = random.Random(seed)
    a, b = Side(redis_server, f"feed{seed}", True), Side(redis_server, f"full{seed}", False)
    sides = (a, b)
    tenants = [f"u{i}" for i in range(12)] + list(range(4))
    for step in range(600):
        op = rng.random()
        s = a.s
        if op < 0.25:
            rid, t, n = next(_rid), rng.choice(tenants), rng.randint(1, 40)
            for x in sides:
                x.sh.submit(x.s, rid, t, n)
        elif op < 0.35:
            admitted = [x.s.schedule() for x in sides]
            assert admitted[0] == admitted[1]
        elif op < 0.5 and s.running():
            ids = rng.sample(s.running(), min(len(s.running()), 3))
            toks = [rng.randint(1, 9) for _ in ids]
            for x in sides:
                x.s.decode(ids, toks)
        elif op < 0.55:
            pre = [x.s.decode() for x in sides]  # one iteration; may preempt
            assert pre[0] == pre[1]
        elif op < 0.62 and s.running():
            rid = rng.choice(s.running())
            how = rng.choice(["finish", "finish", "preempt", "cancel"])
            for x in sides:
                getattr(x.s, how)(rid)
        elif op < 0.65:
            asides = [x.s.set_aside() for x in sides]
            assert asides[0] == asides[1]
            if asides[0] is not None and rng.random() < 0.7:
                for x in sides:
                    x.s.put_back(asides[0])
        elif op < 0.68:
            t, w = rng.choice(tenants), rng.choice([0.5, 1.0, 1.0, 3.0])
            for x in sides:
                x.s.set_weight(t, w)
        elif op < 0.74:
            n = [x.sh.forget_idle(x.s) for x in sides]
            assert n[0] == n[1]
        elif op < 0.75:
            a.s.changes(CHANGES_READER)  # the metrics read their own slot
        elif op < 0.76:
            a.s.reset_changes(SYNC_CHANGES_READER)  # the next read is full
        elif op < 0.77:
            for x in sides:
                x.st.drop = 1
                assert not x.sync()  # applied, reply lost: the next is a full sync
        elif op < 0.78:
            for x in sides:  # a restart from a snapshot: requests gone, same replica id
                x.s = vtc.Scheduler.from_snapshot(x.s.snapshot())
                x.attach()
        else:
            ok = [x.sync() for x in sides]
            assert ok == [True, True], step
            ra, rb = a.st.requests[-1], b.st.requests[-1]
            assert sent(ra) == sent(rb), step
            assert a.st.counters() == b.st.counters()
            assert a.st.backlog() == b.st.backlog()
        a.s._check_invariants()
    for x in sides:
        assert x.sync()
    assert len(a.st.requests) == len(b.st.requests)
    assert a.st.counters() == b.st.counters() and a.st.backlog() == b.st.backlog()
    assert a.sh.stats.feed_reads > 0 and b.sh.stats.feed_reads == 0
    assert a.sh.stats.feed_full_reads >= 1


TOKENS = 2**32 - 1  # the most one decode call takes for a request


class _TopStore:
    """A store whose every counter is at MAX_COUNTER, and that charges one token to each
    of ``charged`` (running requests) while the request is out, as an engine step that
    runs during a background sync's round trip does."""

    def __init__(self, s: vtc.Scheduler, charged: list[int]) -> None:
        self.s, self.charged = s, charged

    def sync(self, req: D.SyncRequest) -> D.SyncReply:
        self.s.decode(self.charged, TOKENS)
        changed = {D.encode(c): D.MAX_COUNTER for c in range(100)}
        return D.SyncReply("ok", "e", None, [None] * len(req.pull), 1, changed, "0")

    def counters(self):  # pragma: no cover - not read here
        return {}

    def backlog(self):  # pragma: no cover - not read here
        return {}


def test_a_pulled_counter_past_the_maximum_with_local_charges_is_left_out():
    """Many counters back (the feed's path): a tenant charged here during the round trip
    would rise past MAX_COUNTER (the global counter plus that local charge); that
    tenant's counter is left as it is (``stats.skipped``), every other one rises."""
    s = vtc.Scheduler(1 << 20)
    for c in range(100):
        s.submit(c, c, 10)
    s.schedule()  # one running request per tenant ...
    for c in range(100):
        s.submit(100 + c, c, 10)  # ... and one waiting
    charged = list(range(0, 100, 2))  # tenants 0, 2, 4, ...: charged mid-sync ...
    for c in charged:  # ... past the counters' precision at MAX_COUNTER (~1.4e14 apart)
        s.set_weight(c, MIN_WEIGHT)
    sh = D.SharedCounters(_TopStore(s, charged), replica_id="r0")
    before = {c: s.counter(c) for c in range(100)}
    assert sh.sync(s, D.CORE_WAITING)
    assert sh.stats.skipped == 50
    for c in range(100):
        if c % 2:
            assert s.counter(c) == D.MAX_COUNTER
        else:
            assert s.counter(c) == before[c] + s.wq * TOKENS / MIN_WEIGHT  # its own only
    s._check_invariants()
