"""Delta syncs on a real Redis (issue 15, item 5): a sync sends only arrivals, departures
and the service charged since the last acknowledged sync, and pulls only the counters
written since the version it acknowledged; after any fault (a lost reply, Redis losing
its data or restarting, a mangled version key) it falls back to a full sync, so no
counter ever depends on the deltas alone."""

from __future__ import annotations

import random

import pytest
from sync_helpers import Recording, serve_all, wait_for

import vtc
from vtc import distributed as D


def shared(server, rid: str, sched, ns: str = "d", store_cls=D.RedisStore, **kw):
    st = Recording(store_cls.from_url(server.url, ns, timeout_ms=2000))
    kw.setdefault("retry_ms", 0)
    out = D.SharedCounters(st, replica_id=rid, **kw)
    out.attach(sched)
    return out, st


def test_a_delta_sync_sends_and_pulls_only_what_changed(redis_server):
    s = vtc.Scheduler(1 << 20)
    sh, st = shared(redis_server, "r0", s)
    tenants = [f"t{k}" for k in range(300)]
    serve_all(s, dict.fromkeys(tenants, 10))
    assert sh.sync(s, tenants)
    first = st.requests[-1]
    assert first.full and first.since == 0 and len(st.replies[-1].changed) == 300

    # nothing changed: nothing sent, and only a scrub batch comes back
    assert sh.sync(s, tenants)
    q, a = st.requests[-1], st.replies[-1]
    assert not q.full and q.since == st.replies[-2].version > 0
    assert (q.services, q.add, q.remove, q.keep, q.pull) == ({}, [], [], [], [])
    assert len(a.changed) < 60  # the scrub (SSCAN COUNT 16, approximate), not 300

    # one arrival, one departure, one tenant charged
    serve_all(s, {"t7": 5})
    wait = [*tenants[1:], "new"]
    assert sh.sync(s, wait)
    q = st.requests[-1]
    assert q.add == ["s:new"] and q.remove == ["s:t0"] and q.services == {"s:t7": 5.0}
    assert q.pull == []  # both wait here: their counters come back as changed
    assert st.replies[-1].changed["s:t7"] == 15.0 and "s:new" in st.replies[-1].changed
    serve_all(s, {"gone": 3})  # charged here, waiting nowhere: pulled by name
    assert sh.sync(s, wait) and st.requests[-1].pull == ["s:gone"]
    assert st.replies[-1].counters == [3.0]

    # another replica charges t9 (waiting here too): its new counter comes back here
    s1 = vtc.Scheduler(1 << 20)
    sh1, _ = shared(redis_server, "r1", s1)
    serve_all(s1, {"t9": 1000})
    assert sh1.sync(s1, [])
    assert sh.sync(s, wait)
    a = st.replies[-1]
    assert a.changed["s:t9"] == 1010.0 and st.requests[-1].pull == []
    assert s.counter("t9") == 1010.0
    assert sh.stats.full_syncs == 1 and not sh.degraded


def test_the_scrub_repairs_a_counter_edited_in_place_within_a_few_syncs(redis_server):
    """An edit in place bumps no version; the scrub re-reads every waiting tenant in turn."""
    s = vtc.Scheduler(1 << 20)
    sh, st = shared(redis_server, "r0", s)
    tenants = [f"t{k}" for k in range(200)]
    serve_all(s, dict.fromkeys(tenants, 10))
    assert sh.sync(s, tenants)
    redis_server.client().hset(st.prefix + "counter", "s:t123", "abc")
    wait_for(
        lambda: sh.sync(s, tenants) and "s:t123" in st.replies[-1].changed,
        "the scrub to reach t123",
    )
    assert st.counters()["t123"] == st.replies[-1].changed["s:t123"] <= 10.0


def test_a_lost_reply_falls_back_to_a_full_sync_and_counts_once(redis_server):
    s = vtc.Scheduler(1 << 20)
    sh, st = shared(redis_server, "r0", s)
    serve_all(s, {"A": 100, "B": 50})
    assert sh.sync(s, ["A", "B"])
    serve_all(s, {"A": 30})
    st.drop = 1
    assert not sh.sync(s, ["A", "B", "C"])  # applied by the store, the reply lost
    assert sh.degraded
    serve_all(s, {"A": 7, "C": 1})
    assert sh.sync(s, ["A", "C"])
    q = st.requests[-1]
    assert q.full and q.since == 0  # the versions of the lost reply are never relied on
    assert st.counters() == {"A": 137.0, "B": 50.0, "C": 51.0}  # C lifted to the floor (B)
    assert s.counter("A") == 137.0 and not sh.degraded
    assert sh.sync(s, ["A", "C"]) and not st.requests[-1].full


@pytest.mark.parametrize("fault", ["flushall", "restart"])
def test_data_loss_between_syncs_falls_back_to_a_full_sync(redis_server, fault):
    s0, s1 = vtc.Scheduler(1 << 20), vtc.Scheduler(1 << 20)
    sh0, st0 = shared(redis_server, "r0", s0)
    sh1, st1 = shared(redis_server, "r1", s1)
    serve_all(s0, {"A": 400, "B": 100})
    serve_all(s1, {"B": 300})
    assert sh0.sync(s0, ["A", "B"]) and sh1.sync(s1, ["B"])
    for _ in range(3):  # the versions grow past what an empty store starts from
        serve_all(s1, {"B": 10})
        assert sh1.sync(s1, ["B"]) and sh0.sync(s0, ["A", "B"])
    assert st0.counters() == {"A": 400.0, "B": 430.0}
    if fault == "flushall":
        redis_server.client().flushall()
    else:
        redis_server.restart()  # no persistence: empty again
    serve_all(s1, {"B": 5})
    assert sh1.sync(s1, ["B"])  # r1 re-sends its state (B's counter from its hint)
    assert st1.requests[-1].full and st1.requests[-1].since == 0
    assert sh0.sync(s0, ["A", "B"])
    assert st0.requests[-1].full and st0.requests[-1].since == 0
    # nothing lost: A keeps its counter (from r0's hint), B its deficit and r1's 5
    got = st0.counters()
    assert got["A"] == 400.0 and got["B"] >= 435.0
    serve_all(s1, {"B": 1})
    assert sh1.sync(s1, ["B"]) and sh0.sync(s0, ["A", "B"])
    assert not st0.requests[-1].full and s0.counter("B") == st0.counters()["B"]


@pytest.mark.parametrize("bad", ["abc", "-1", "1e999", "nan", "2.5", "", "hash", "deleted"])
def test_a_mangled_version_key_is_not_fatal_and_loses_no_change(redis_server, bad):
    s0, s1 = vtc.Scheduler(1 << 20), vtc.Scheduler(1 << 20)
    sh0, st0 = shared(redis_server, "r0", s0)
    sh1, _ = shared(redis_server, "r1", s1)
    serve_all(s0, {"A": 10})
    assert sh0.sync(s0, ["A"]) and sh1.sync(s1, [])
    for _ in range(5):
        serve_all(s1, {"A": 1})
        assert sh1.sync(s1, []) and sh0.sync(s0, ["A"])
    r, key = redis_server.client(), st0.prefix + "ver"
    if bad == "hash":
        r.delete(key)
        r.hset(key, "x", "1")
    elif bad == "deleted":
        r.delete(key)
    else:
        r.set(key, bad)
    serve_all(s1, {"A": 100})
    assert sh1.sync(s1, [])
    assert sh0.sync(s0, ["A"]) or sh0.sync(s0, ["A"])  # at most one resync
    assert s0.counter("A") == st0.counters()["A"] == 115.0
    serve_all(s1, {"A": 1})
    assert sh1.sync(s1, []) and sh0.sync(s0, ["A"])
    assert s0.counter("A") == 116.0 and not sh0.degraded and not sh1.degraded


class _Legacy(D.RedisStore):
    """A replica of a vtc before versions: the same script without the version writes
    (it neither numbers its counter writes nor says it does), and no delta asked."""

    LUA = D.SYNC_LUA.replace("redis.call('ZADD', CV, bump(), c)", "").replace(
        "redis.call('ZADD', VREPS, now, rid)", ""
    )

    def __init__(self, client, namespace="default", keep_ms=D.KEEP_MS):
        super().__init__(client, namespace, keep_ms)
        assert self.LUA != D.SYNC_LUA
        self._script = client.register_script(self.LUA)


def test_a_replica_of_an_older_version_is_detected_and_pulled_from_in_full(redis_server):
    s0, sl = vtc.Scheduler(1 << 20), vtc.Scheduler(1 << 20)
    sh0, st0 = shared(redis_server, "r0", s0, liveness_ms=300)
    old, _ = shared(redis_server, "old", sl, store_cls=_Legacy, delta=False, liveness_ms=300)
    tenants = [f"t{k}" for k in range(100)]
    serve_all(s0, dict.fromkeys(tenants, 10))
    assert sh0.sync(s0, tenants) and old.sync(sl, [])
    serve_all(sl, {"t5": 500})
    assert old.sync(sl, [])  # written without a version
    assert sh0.sync(s0, tenants)
    assert st0.replies[-1].changed["s:t5"] == 510.0 and s0.counter("t5") == 510.0
    assert len(st0.replies[-1].changed) == 100  # a full pull while the old one lives
    # the old replica stops; once reaped, the pulls are deltas again
    wait_for(lambda: sh0.sync(s0, tenants) and "old" not in st0.inner.replicas(), "the old reaped")
    assert sh0.sync(s0, tenants) and len(st0.replies[-1].changed) < 60


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_delta_and_full_pulls_give_the_same_counters(redis_server, seed):
    """The same random operations on two replicas, once pulling every waiting tenant's
    counter (as before versions) and once pulling the changes: the global counters and
    every replica's local counters are identical after every round, through forgetting
    and a data loss."""
    rng = random.Random(seed)
    runs = {}
    for mode in ("full", "delta"):
        scheds = [vtc.Scheduler(4000) for _ in range(2)]
        shs = [
            shared(
                redis_server,
                f"r{i}",
                s,
                ns=mode,
                delta=mode == "delta",
                forget_ms=0,
                liveness_ms=10**9,
            )[0]
            for i, s in enumerate(scheds)
        ]
        runs[mode] = (scheds, shs, [[], []])
    tenants = [f"t{k}" for k in range(40)] + [7, 8]
    nid = iter(range(1, 1 << 30))
    for rnd in range(120):
        i = rng.randrange(2)
        arrivals = [(rng.choice(tenants), rng.randint(1, 400)) for _ in range(rng.randint(0, 6))]
        rids = [next(nid) for _ in arrivals]
        decode = rng.randint(0, 30)
        forget = rng.random() < 0.1
        flush = rng.random() < 0.02
        for mode in ("full", "delta"):
            scheds, shs, ids = runs[mode]
            s, sh = scheds[i], shs[i]
            for rid, (c, n) in zip(rids, arrivals):
                sh.submit(s, rid, c, n)
                ids[i].append(rid)
            s.schedule()
            running = [r for r in ids[i] if s.status(r) == "running"]
            for _ in range(decode if running else 0):
                s.decode(running, 1)
            for r in running[: len(running) // 2]:
                s.finish(r)
            ids[i] = [r for r in ids[i] if s.status(r) in ("waiting", "running")]
            if forget:
                sh.forget_idle(s)
            assert sh.sync(s), (mode, rnd, sh.stats.last_error)
        if flush:
            redis_server.client().flushall()
        full, delta = runs["full"][1][0].store, runs["delta"][1][0].store
        assert delta.counters() == full.counters(), rnd
        for a, b in zip(runs["full"][0], runs["delta"][0]):
            assert {c: a.counter(c) for c in tenants} == {c: b.counter(c) for c in tenants}, rnd
    assert sum(sh.stats.full_syncs for sh in runs["delta"][1]) < 20  # mostly deltas
