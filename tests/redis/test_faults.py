"""Shared counters through faults, on a real Redis: reconciliation keeps each tenant's
deficit, forgetting and restarts count service exactly once, hostile stored values and
namespaces harm nothing (issue 15, items 1-5)."""

from __future__ import annotations

import threading

import pytest
from sync_helpers import serve_all, wait_for

import vtc
from vtc import distributed as D


def shared(server, rid: str, sched=None, ns: str = "f", **kw) -> D.SharedCounters:
    """SharedCounters on ``server``, attached to ``sched`` before it serves anything."""
    st = D.RedisStore.from_url(server.url, ns, timeout_ms=2000)
    kw.setdefault("retry_ms", 0)
    out = D.SharedCounters(st, replica_id=rid, **kw)
    if sched is not None:
        out.attach(sched)
    return out


_rid = iter(range(1, 1 << 30))


def serve(s: vtc.Scheduler, tenant: str, tokens: int) -> None:
    """Charge ``tenant`` ``tokens`` prompt tokens (wp = 1): admit one request, finish it."""
    serve_all(s, {tenant: tokens})


# -- 1. reconciliation keeps a tenant's deficit ------------------------------------------
@pytest.mark.parametrize("first", ["r0", "r1"])
def test_after_data_loss_a_backlogged_tenants_deficit_is_kept(redis_server, first):
    """A waits on r0 only, B on both; Redis loses its data; the order replicas reconcile
    in must not matter, and A must not be lifted to B's counter (it was waiting all along)."""
    s0, s1 = vtc.Scheduler(1 << 16), vtc.Scheduler(1 << 16)
    sh0, sh1 = shared(redis_server, "r0", s0), shared(redis_server, "r1", s1)
    assert sh0.sync(s0, ["A", "B"]) and sh1.sync(s1, ["B"])
    serve_all(s0, {"A": 400, "B": 200})
    serve(s1, "B", 1000)
    redis_server.client().flushall()  # the store loses everything
    order = [(sh0, s0, ["A", "B"]), (sh1, s1, ["B"])]
    if first == "r1":
        order.reverse()
    for sh, s, waiting in order:
        assert sh.sync(s, waiting)
    got = sh0.store.counters()
    assert got == {"A": 400.0, "B": 1200.0}
    assert sh0.store.backlog() == {"A": 400.0, "B": 1200.0}


def test_a_replica_back_from_a_long_outage_keeps_its_tenants_deficit(redis_server):
    """r0 stops syncing for longer than the liveness window and is reaped; A waited on it
    all along. When r0 returns, A keeps its counter instead of being lifted to the floor."""
    s0, s1 = vtc.Scheduler(1 << 16), vtc.Scheduler(1 << 16)
    sh0 = shared(redis_server, "r0", liveness_ms=100)
    sh1 = shared(redis_server, "r1", liveness_ms=100)
    assert sh0.sync(s0, ["A"]) and sh1.sync(s1, ["B"])
    serve(s0, "A", 100)
    assert sh0.sync(s0, ["A"])

    def r1_sees_r0_reaped() -> bool:
        serve(s1, "B", 500)
        assert sh1.sync(s1, ["B"])
        return "r0" not in sh1.store.replicas()

    wait_for(r1_sees_r0_reaped, "r0 to be reaped")
    assert "A" not in sh1.store.backlog()
    b = sh1.store.counters()["B"]
    assert b > 1000
    serve(s0, "A", 50)  # served locally meanwhile
    assert sh0.sync(s0, ["A"])
    assert sh0.stats.resyncs == 1
    assert sh0.store.counters()["A"] == 150.0  # not lifted to B's counter
    assert sh0.store.backlog() == {"A": 150.0, "B": b}


def test_after_data_loss_an_arrival_is_lifted_to_the_tenants_waiting_all_along(redis_server):
    """The other side of the rule: a tenant new to a replica's backlog is an arrival."""
    s0, s1 = vtc.Scheduler(1 << 16), vtc.Scheduler(1 << 16)
    sh0, sh1 = shared(redis_server, "r0", s0), shared(redis_server, "r1", s1)
    serve(s1, "B", 700)
    assert sh1.sync(s1, ["B"])
    serve(s0, "C", 50)
    redis_server.client().flushall()
    assert sh0.sync(s0, ["C"])  # r0's first sync: C arrives on an empty store
    assert sh1.sync(s1, ["B"])  # B waited on r1 all along: restored from r1's counter
    assert sh0.store.backlog() == {"B": 700.0, "C": 50.0}  # C was not lifted to B
    assert sh0.sync(s0, ["C", "D"])  # D arrives: lifted to the floor
    assert sh0.store.backlog() == {"B": 700.0, "C": 50.0, "D": 50.0}


@pytest.mark.parametrize("first", ["r0", "r1"])
def test_a_tenant_lifted_while_redis_is_down_keeps_the_lift_and_its_service_once(
    redis_server, first
):
    """Redis is killed (not flushed) with A and B served; during the outage A goes idle on
    r0 and returns while B waits there, so r0's local VTC lifts A to B's counter. After
    the restart the store holds A's local counter (the lift plus A's service since, each
    once) and B's service from both replicas once, whichever replica reconciles first."""
    s0, s1 = vtc.Scheduler(1 << 16), vtc.Scheduler(1 << 16)
    sh0, sh1 = shared(redis_server, "r0", s0), shared(redis_server, "r1", s1)
    assert sh0.sync(s0, ["A", "B"]) and sh1.sync(s1, ["B"])
    serve_all(s0, {"A": 400, "B": 400})
    serve(s1, "B", 3000)
    for _ in range(2):  # each replica hears the other's service of its waiting tenants
        assert sh0.sync(s0, ["A", "B"]) and sh1.sync(s1, ["B"])
    assert sh0.store.counters() == {"A": 400.0, "B": 3400.0}
    assert s0.counter("B") == 3400.0
    redis_server.kill()
    b = next(_rid)
    s0.submit(b, "B", 100)  # B waits on r0
    assert not sh0.sync(s0, ["B"]) and not sh1.sync(s1, [])
    assert sh0.degraded and sh1.degraded
    a = next(_rid)
    s0.submit(a, "A", 50)  # A returns: lifted to the floor of r0's backlog, B's counter
    assert s0.counter("A") == 3400.0 and s0.service("A") == 400.0
    s0.schedule()
    s0.finish(a)
    s0.finish(b)
    serve(s1, "B", 500)
    redis_server.start()  # same port, no data
    order = [(sh0, s0), (sh1, s1)]
    if first == "r1":
        order.reverse()
    for _ in range(2):
        for sh, s in order:
            assert sh.sync(s, [])
    assert not sh0.degraded and not sh1.degraded
    # A: its lift and its 50 tokens, once; never its 400 before the kill again
    assert sh0.store.counters() == {"A": 3450.0, "B": 4000.0}
    assert s0.counter("A") == 3450.0


# -- 2. forgetting idle tenants ------------------------------------------------------------
def _forgettable(s: vtc.Scheduler, sh: D.SharedCounters, x_tokens: int) -> None:
    """X served ``x_tokens``, synced, then idle below the floor: forget_idle drops it."""
    s.submit(next(_rid), "Y", 30_000)  # Y stays running with the largest counter
    serve(s, "X", x_tokens)
    serve(s, "Z", 10)  # Z leaves last, so X is not the last-left reference
    assert sh.sync(s, [])
    assert sh.store.counters()["X"] == x_tokens


def test_service_after_the_scheduler_forgot_a_tenant_reaches_the_store(redis_server):
    """An engine calling the scheduler's own forget_idle(): the new, smaller service is new."""
    s = vtc.Scheduler(1 << 16)
    sh = shared(redis_server, "r0", s)
    _forgettable(s, sh, 10_000)
    assert s.forget_idle() >= 1 and "X" not in s.services()
    serve(s, "X", 5_000)
    assert sh.sync(s, [])
    assert sh.store.counters()["X"] == 15_000.0


def test_forget_idle_through_shared_counters_loses_nothing(redis_server):
    """Served more after forgetting than before: only folding first can tell."""
    s = vtc.Scheduler(1 << 16)
    sh = shared(redis_server, "r0", s)
    _forgettable(s, sh, 10_000)
    assert sh.forget_idle(s) >= 1 and "X" not in s.services()
    serve(s, "X", 12_000)
    assert sh.sync(s, [])
    assert sh.store.counters()["X"] == 22_000.0


# -- 3. restarts from a snapshot -----------------------------------------------------------
@pytest.mark.parametrize("same_id", [False, True])
def test_a_replica_restored_from_a_snapshot_counts_nothing_twice(redis_server, same_id):
    s = vtc.Scheduler(1 << 16)
    sh = shared(redis_server, "r0", s)
    serve(s, "X", 10_000)
    assert sh.sync(s, [])
    restored = vtc.Scheduler.from_snapshot(s.snapshot())
    assert restored.service("X") == 10_000.0
    again = shared(redis_server, "r0" if same_id else "r0-restarted")
    assert again.sync(restored, [])
    assert again.store.counters()["X"] == 10_000.0
    serve(restored, "X", 1_000)
    assert again.sync(restored, [])
    assert again.store.counters()["X"] == 11_000.0


def test_one_shared_counters_serves_one_scheduler(redis_server):
    sh = shared(redis_server, "r0")
    sh.attach(vtc.Scheduler(100))
    with pytest.raises(ValueError, match="another scheduler"):
        sh.sync(vtc.Scheduler(100))


# -- 4. hostile or corrupt stored values ---------------------------------------------------
@pytest.mark.parametrize("bad", ["abc", "nan", "inf", "-inf", "1e999", "1e300", "-5", ""])
def test_a_corrupt_counter_is_repaired_not_fatal(redis_server, bad):
    s = vtc.Scheduler(1 << 16)
    sh = shared(redis_server, "r0", s, sync_interval=1)
    serve(s, "A", 300)
    serve(s, "B", 100)
    assert sh.sync(s, ["A", "B"])
    key = sh.store.prefix + "counter"
    r = redis_server.client()
    r.hset(key, "s:A", bad)
    assert sh.on_step(s, ["A", "B"]) is True  # pulls A: never raises
    got = sh.store.counters()
    assert set(got) == {"A", "B"}
    assert 0.0 <= got["A"] <= 300.0  # a number again: the floor (B's 100) or its own
    assert s.counter("A") < 1e6  # not starved by the stored value
    # every other replica reads the repaired value too
    other = vtc.Scheduler(1 << 16)
    sh2 = shared(redis_server, "r1")
    assert sh2.sync(other, ["A"]) and other.counter("A") == got["A"]


def test_corrupt_lastleft_epoch_and_refs_are_not_fatal(redis_server):
    s = vtc.Scheduler(1 << 16)
    sh = shared(redis_server, "r0", s)
    serve(s, "A", 300)
    assert sh.sync(s, ["A"])
    assert sh.sync(s, [])  # A leaves: lastleft = 300
    r, p = redis_server.client(), sh.store.prefix
    r.set(p + "lastleft", "abc")
    r.hset(p + "refs", "s:Q", "zz")
    assert sh.sync(s, ["B", "Q"])  # arrivals read the floor and the refs
    r.set(p + "epoch", b"\xff\xfe")
    assert sh.sync(s, ["B"])  # a different epoch: one resync, then it is the known one
    resyncs = sh.stats.resyncs
    assert sh.sync(s, ["B"]) and sh.sync(s, ["B"])
    assert sh.stats.resyncs == resyncs and not sh.degraded


# keys of the namespace and a value of another type: a string where a hash, set or
# sorted set belongs, a hash where a string belongs
_WRONG_TYPES = ["counter", "backlog", "refs", "replicas", "w:r0", "s:r0", "epoch", "lastleft"]


def _clobber(r, key: str) -> None:
    r.delete(key)
    if key.endswith(("epoch", "lastleft")):
        r.hset(key, "x", "1")
    else:
        r.set(key, "not the right type")


@pytest.mark.parametrize("name", _WRONG_TYPES)
def test_a_key_of_the_wrong_type_is_repaired_not_fatal(redis_server, name):
    """A key holding another type (a hand edit, another program on the same Redis) made
    every script call fail with WRONGTYPE: every replica degraded, forever. The script
    drops the whole namespace (logged by Redis) and every replica reconciles to the new
    epoch as after a data loss: A's service counted once, the backlog rebuilt."""
    s0, s1 = vtc.Scheduler(1 << 16), vtc.Scheduler(1 << 16)
    sh0, sh1 = shared(redis_server, "r0", s0), shared(redis_server, "r1", s1)
    serve_all(s0, {"A": 300, "B": 100})
    assert sh0.sync(s0, ["A", "B"]) and sh1.sync(s1, ["B"])
    assert sh0.sync(s0, [])  # A leaves r0 (lastleft), B still waits on r1
    r = redis_server.client()
    _clobber(r, sh0.store.prefix + name)
    serve(s0, "A", 50)
    for _ in range(3):  # and it stays repaired
        assert sh0.sync(s0, ["A"]) and sh1.sync(s1, ["B", "C"])
    assert not sh0.degraded and not sh1.degraded
    assert sh0.stats.failures == 0 and sh1.stats.failures == 0
    got = sh0.store.counters()
    # A's service is all counted once, whatever key was lost (its counter is restored
    # from r0's own after a loss of the counter hash)
    assert got["A"] == 350.0
    assert set(got) == {"A", "B", "C"}
    assert set(sh0.store.backlog()) == {"A", "B", "C"}
    assert set(sh0.store.replicas()) == {"r0", "r1"}


def test_a_dead_replicas_waiting_set_of_the_wrong_type_is_repaired(redis_server, caplog):
    """The waiting set of a replica being reaped is read too: the same repair."""
    s0, s1 = vtc.Scheduler(1 << 16), vtc.Scheduler(1 << 16)
    sh0 = shared(redis_server, "r0", s0, liveness_ms=100)
    sh1 = shared(redis_server, "r1", s1, liveness_ms=100)
    serve(s0, "A", 100)
    assert sh0.sync(s0, ["A"]) and sh1.sync(s1, ["B"])
    _clobber(redis_server.client(), sh0.store.prefix + "w:r1")

    def r1_reaped() -> bool:
        assert sh0.sync(s0, ["A"])
        return sh0.store.replicas() == ["r0"]

    wait_for(r1_reaped, "r1 to be reaped")
    assert sh0.stats.failures == 0 and sh0.stats.resyncs == 1
    assert sh0.store.backlog() == {"A": 100.0}
    assert not [r for r in caplog.records if "unreachable" in r.getMessage()]


# -- two live processes with one replica id ----------------------------------------------
def test_two_live_replicas_with_one_id_are_told_apart(redis_server, caplog):
    """A Deployment that sets one VTC_REPLICA_ID for every pod: two live processes sync
    as one replica. Each one's waiting-set diffs undid the other's (a tenant waiting on
    one stayed out of the global backlog). The store tells incarnations apart: the one
    displaced by a newer one is refused when it syncs again, and goes on under an id of
    its own, logged as an error; no service is lost or counted twice."""
    s0, s1 = vtc.Scheduler(1 << 16), vtc.Scheduler(1 << 16)
    old, new = shared(redis_server, "pod", s0), shared(redis_server, "pod", s1)
    serve(s0, "A", 100)
    assert old.sync(s0, ["A"])
    serve(s1, "B", 200)
    assert new.sync(s1, ["B"])  # a newer incarnation: taken for a restart of "pod"
    serve(s0, "A", 10)
    for _ in range(3):
        assert old.sync(s0, ["A"]) and new.sync(s1, ["B"])
    assert new.replica_id == "pod" and old.replica_id.startswith("pod-")
    assert old.stats.renamed == 1 and new.stats.renamed == 0
    assert not old.degraded and not new.degraded
    assert old.store.counters() == {"A": 110.0, "B": 200.0}
    assert old.store.backlog() == {"A": 110.0, "B": 200.0}
    assert sorted(old.store.replicas()) == sorted(["pod", old.replica_id])
    errors = [r for r in caplog.records if r.levelname == "ERROR" and "pod" in r.getMessage()]
    assert len(errors) == 1 and "VTC_REPLICA_ID" in errors[0].getMessage()


def test_a_restart_with_the_same_id_is_not_a_duplicate(redis_server, caplog):
    s = vtc.Scheduler(1 << 16)
    first = shared(redis_server, "pod", s)
    serve(s, "A", 100)
    assert first.sync(s, ["A"])
    restored = vtc.Scheduler.from_snapshot(s.snapshot())
    again = shared(redis_server, "pod", restored)  # the old process is gone
    for _ in range(3):
        assert again.sync(restored, ["A"])
    assert again.replica_id == "pod" and again.stats.renamed == 0
    assert again.store.replicas() == ["pod"] and again.store.backlog() == {"A": 100.0}
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


class _Flaky:
    """A store that raises ``error`` while ``broken`` is set, else delegates."""

    def __init__(self, store: D.RedisStore, error: BaseException) -> None:
        self.store, self.error, self.broken = store, error, threading.Event()

    def sync(self, req):
        if self.broken.is_set():
            raise self.error
        return self.store.sync(req)

    def counters(self):
        return self.store.counters()

    def backlog(self):
        return self.store.backlog()


@pytest.mark.parametrize(
    "error", [ValueError("bad reply"), UnicodeDecodeError("utf-8", b"\xff", 0, 1, "x")]
)
def test_background_sync_survives_errors_and_resumes(redis_server, error):
    s = vtc.Scheduler(1 << 16)
    store = _Flaky(D.RedisStore.from_url(redis_server.url, "bg", timeout_ms=2000), error)
    sh = D.SharedCounters(store, replica_id="r0", retry_ms=0)
    store.broken.set()
    sh.start(s, interval_ms=5)
    try:
        wait_for(lambda: sh.stats.failures >= 3, "failed syncs")
        assert sh.degraded and sh._thread is not None and sh._thread.is_alive()
        serve(s, "A", 42)
        store.broken.clear()
        wait_for(lambda: not sh.degraded and sh.stats.syncs >= 1, "the sync to resume")
        wait_for(lambda: store.counters().get("A") == 42.0, "A's service in the store")
    finally:
        sh.stop()


def test_background_loop_survives_a_scheduler_that_raises(redis_server):
    class Broken:
        def __init__(self, s):
            self.s, self.fail = s, True

        def __getattr__(self, name):
            return getattr(self.s, name)

        def services(self):
            if self.fail:
                raise RuntimeError("boom")
            return self.s.services()

    inner = vtc.Scheduler(1 << 16)
    serve(inner, "A", 7)
    s = Broken(inner)
    s.fail = False
    sh = shared(redis_server, "r0")
    sh.attach(s)
    s.fail = True
    sh.start(s, interval_ms=5)
    try:
        wait_for(lambda: sh.stats.failures >= 2, "failed syncs")
        assert sh._thread.is_alive() and sh.degraded
        serve(inner, "A", 3)
        s.fail = False
        wait_for(lambda: sh.stats.syncs >= 1 and not sh.degraded, "the sync to resume")
        # the 7 charged before attach count as stored: 3 pushed, and the store, which had no
        # counter of A, takes the replica's own (10)
        assert sh.stats.pushed_tenants == 1 and sh.store.counters() == {"A": 10.0}
    finally:
        sh.stop()


# -- 5. namespaces ---------------------------------------------------------------------------
@pytest.mark.parametrize("pattern", ["*", "p?od", "[p]rod", "pro*", "\\prod", "^"])
def test_clear_deletes_only_its_own_namespace(redis_server, pattern):
    # 5 s, not the 100 ms default: a loaded machine must not fail a test about names
    stores = {
        ns: D.RedisStore.from_url(redis_server.url, ns, timeout_ms=5000)
        for ns in ("prod", "x", pattern)
    }
    for st in stores.values():
        st.sync(D.SyncRequest("r", "", "e", 1, 0, True, {"s:t": 1.0}, [], [], [], 10**9))
    stores[pattern].clear()
    assert stores[pattern].counters() == {}
    for ns in ("prod", "x"):
        if ns != pattern:
            assert stores[ns].counters() == {"t": 1.0}, ns


@pytest.mark.parametrize("ns", ["a}:x:{b", "{", "}", "", "x" * 257])
def test_namespaces_that_could_overlap_are_refused(redis_server, ns):
    with pytest.raises(ValueError, match="namespace") as e:
        D.RedisStore.from_url(redis_server.url, ns)
    assert repr(ns)[:40] in str(e.value)
