"""The store forgets idle tenants' counters (issue 15): the Lua script on a real Redis
and its twin, LocalStore, side by side.

A tenant no replica has waiting, untouched for ``forget_ms``, whose counter is at most
the global floor, loses its stored counter: on its return it would be lifted to the
floor anyway. A tenant without a counter then counts from the largest counter
forgotten, never from 0. ``forget_ms=0`` makes every idle tenant due at once.
"""

from __future__ import annotations

import pytest
from test_store import req, store

from vtc import distributed as D

NEVER = 10**9


@pytest.fixture(params=["redis", "twin"])
def make_store(request, redis_server):
    """A function returning a fresh store of the kind under test, one namespace each."""
    made = []

    def make():
        made.append(None)
        if request.param == "twin":
            return D.LocalStore()
        return store(redis_server, f"forget{len(made)}")

    return make


class Replica:
    """One replica's side of the protocol: numbered requests, each reply acknowledged."""

    def __init__(self, st, rid: str = "a", forget_ms: int = 0) -> None:
        self.st, self.rid, self.forget_ms = st, rid, forget_ms
        self.seq, self.epoch, self.full = 0, "", True

    def sync(self, svc=None, add=(), rem=(), pull=(), **kw) -> D.SyncReply:
        self.seq += 1
        q = req(
            self.rid,
            svc,
            add,
            rem,
            pull,
            full=self.full,
            epoch=self.epoch,
            seq=self.seq,
            base=self.seq - 1,
            **kw,
        )
        q.forget_ms = self.forget_ms
        r = self.st.sync(q)
        assert r.status == "ok", r
        self.epoch, self.full = r.epoch, False
        return r


def churn(st, forget_ms: int, n: int = 120) -> tuple[Replica, list[int]]:
    """Tenant 0 stays backlogged and is served 10 a sync; one-off tenants 1..n each
    arrive, are served 3 and leave. Returns the replica and the store's number of
    counters after each sync."""
    a = Replica(st, forget_ms=forget_ms)
    a.sync({"i:0": 10.0}, add=["i:0"])
    sizes = []
    for k in range(1, n + 1):
        c = f"i:{k}"
        a.sync({"i:0": 10.0}, add=[c])
        a.sync({"i:0": 10.0, c: 3.0}, rem=[c])
        sizes.append(len(st.counters()))
    return a, sizes


def test_one_off_tenants_are_forgotten_and_the_store_stays_bounded(make_store):
    kept, forgetting = make_store(), make_store()
    churn(kept, NEVER)
    _, sizes = churn(forgetting, 0)
    assert len(kept.counters()) == 121  # every tenant ever seen
    assert max(sizes) <= 3, sizes  # tenant 0 and the one or two newest
    # the tenant that stayed is untouched: all it was served
    assert forgetting.counters()[0] == kept.counters()[0] == 10.0 * (1 + 2 * 120)
    assert forgetting.backlog() == kept.backlog()


def test_a_forgotten_tenant_returns_exactly_where_its_counter_would_have_put_it(make_store):
    kept, forgetting = make_store(), make_store()
    a, _ = churn(kept, NEVER, n=20)
    b, _ = churn(forgetting, 0, n=20)
    assert 5 in kept.counters() and 5 not in forgetting.counters()
    ra = a.sync({"i:0": 10.0}, add=["i:5"], pull=["i:5", "i:0"])
    rb = b.sync({"i:0": 10.0}, add=["i:5"], pull=["i:5", "i:0"])
    assert ra.counters == rb.counters and ra.floor == rb.floor
    assert ra.counters[0] == ra.floor  # lifted to the floor: its old counter was below


def test_a_waiting_tenant_or_one_above_the_floor_is_never_forgotten(make_store):
    st = make_store()
    a = Replica(st)
    a.sync({"i:1": 5.0, "i:2": 50.0}, add=["i:1", "i:2"])  # floor: 5 (tenant 1)
    a.sync({"i:2": 1.0}, rem=["i:2"])  # 2 leaves at 51, above the floor
    a.sync({"i:1": 1.0})
    a.sync({"i:1": 1.0})
    assert st.counters() == {1: 7.0, 2: 51.0}  # 1 waits at the floor, 2 is above it
    a.sync({"i:1": 50.0})  # the floor (57) passes tenant 2
    a.sync({"i:1": 1.0})
    assert st.counters() == {1: 58.0}


def test_a_tenant_without_a_counter_counts_from_the_largest_forgotten(make_store):
    """Service pushed for a forgotten tenant, and a reconciliation that keeps one waiting
    with a low hint, start from the largest counter forgotten, never from 0."""
    st = make_store()
    a = Replica(st)
    a.sync({"i:0": 1.0, "i:1": 40.0, "i:2": 53.0}, add=["i:0", "i:1", "i:2"])
    a.sync(rem=["i:1", "i:2"])
    a.sync({"i:0": 100.0})  # the floor, 101, passes both: both forgotten
    a.sync({"i:0": 1.0})
    assert st.counters() == {0: 102.0}
    r = a.sync({"i:1": 2.0}, pull=["i:1"])  # a request of 1 still ran somewhere
    assert r.counters == [55.0]  # 53 + 2: never below what it had (42)
    a.full = True  # a reconciliation: tenant 2 waited here all along, hinted low
    r = a.sync(pull=["i:2"], keep=["i:0", "i:2"], hints={"i:2": 7.0})
    assert r.counters == [55.0]  # tenant 1 was forgotten again at 55 first
    assert st.backlog() == {0: 102.0, 2: 55.0}


def test_twin_and_script_forget_alike(redis_server):
    """Random syncs of two replicas with forgetting on and off: the same counters,
    backlog and answers from LocalStore and the Lua script."""
    import random

    rng = random.Random(11)
    red, twin = store(redis_server, "twin-forget"), D.LocalStore()
    tenants = [f"i:{k}" for k in range(8)]
    reps = {r: Replica(red, r) for r in "ab"}
    forgotten, before = 0, set()
    twins = {r: Replica(twin, r) for r in "ab"}
    for step in range(300):
        r = rng.choice("ab")
        forget = rng.choice([0, NEVER])
        svc = {c: rng.choice([1.0, 7.5, 40.0]) for c in rng.sample(tenants, rng.randint(0, 3))}
        add = rng.sample(tenants, rng.randint(0, 2))
        rem = [c for c in tenants if c not in add and rng.random() < 0.3]
        pull = sorted(set(svc) | set(add))
        replies = []
        for rep in (reps[r], twins[r]):
            rep.forget_ms = forget
            replies.append(rep.sync(svc, add, rem, pull))
        x, y = replies
        assert (x.floor, x.counters) == (y.floor, y.counters), step
        assert red.counters() == twin.counters() and red.backlog() == twin.backlog(), step
        now = set(red.counters())
        forgotten, before = forgotten + len(before - now), now
    assert forgotten > 20 and twin.forgot > 0, forgotten  # the runs did forget, often


def test_forget_ms_is_checked():
    with pytest.raises(ValueError, match="forget_ms"):
        D.SharedCounters(D.LocalStore(), forget_ms=-1)
    assert D.SharedCounters(D.LocalStore(), forget_ms=5).forget_ms == 5
