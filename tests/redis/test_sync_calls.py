"""What a sync costs in Redis calls and core calls (issue 15 item 5, the push): the
script's push takes a few batched calls per sync, not ~8 per tenant charged, and a
sync that returns many counters reads no O(tenants) ``services()`` from the core; with
the same results as before (the twin, on batches larger than one command)."""

from __future__ import annotations

import random
import sys

import vtc
from vtc import distributed as D


def store(server, ns: str) -> D.RedisStore:
    return D.RedisStore.from_url(server.url, ns, timeout_ms=5000)


def script_calls(server) -> int:
    """Redis commands run since the last ``CONFIG RESETSTAT`` (the script's own calls
    count; the EVALSHA, and the INFO and CONFIG of this measure, do not)."""
    stats = server.client().info("commandstats")
    skip = {"cmdstat_evalsha", "cmdstat_eval", "cmdstat_info", "cmdstat_config"}
    return sum(v["calls"] for k, v in stats.items() if k not in skip)


def test_a_sync_pushing_many_tenants_makes_few_redis_calls(redis_server):
    n = 1000
    s = vtc.Scheduler(1 << 20)
    for c in range(n):
        s.submit(c, c, 10)
    s.schedule()  # one running request per tenant
    for c in range(n):
        s.submit(n + c, c, 10)  # and one waiting
    sh = D.SharedCounters(store(redis_server, "calls"), replica_id="r0")
    assert sh.sync(s, D.CORE_WAITING)  # the first, full sync
    s.decode(list(range(n)), 1)  # every tenant charged
    redis_server.client().config_resetstat()
    assert sh.sync(s, D.CORE_WAITING)
    calls = script_calls(redis_server)
    # ~8 a tenant before (the record of what was applied, the counter, its version,
    # the backlog score, the re-read for the reply): > 8,000 here
    assert calls < 150, calls
    want = {c: s.service(c) for c in range(n)}  # one replica: the global is the local
    assert sh.store.counters() == want and sh.store.backlog() == want


def test_a_sync_returning_many_counters_reads_no_service_of_every_tenant(redis_server):
    """``services()`` is a dict of every tenant: a sync returning more than 64 counters
    used to call it; with the change feed it reads the feed again instead."""
    s = vtc.Scheduler(1 << 20)
    n = 300
    for c in range(n):
        s.submit(c, c, 10)
    s.schedule()
    for c in range(n):
        s.submit(n + c, c, 10)
    a = D.SharedCounters(store(redis_server, "svc"), replica_id="a")
    b = D.SharedCounters(store(redis_server, "svc"), replica_id="b")
    s2 = vtc.Scheduler(1 << 20)
    assert a.sync(s, D.CORE_WAITING)
    b.attach(s2)  # what s2 is charged from here on is pushed
    serve = {c: 5 for c in range(n)}
    for c, k in serve.items():  # replica b charges every tenant waiting at a
        s2.submit(10**6 + c, c, k)
    s2.schedule()
    assert b.sync(s2, [])
    s.decode([0, 1], 1)  # a little local service, charged between two syncs

    called: list[str] = []

    def spy(_frame, event, arg):
        if event == "c_call" and getattr(arg, "__name__", "") == "services":
            called.append(arg.__qualname__)

    p0 = a.stats.pulled_tenants
    sys.setprofile(spy)
    try:
        ok = a.sync(s, D.CORE_WAITING)
    finally:
        sys.setprofile(None)
    assert ok
    assert a.stats.pulled_tenants - p0 == n  # this sync returned every waiting tenant
    assert called == []
    # and each local counter is the global one (+ what was charged here since the fold)
    g = a.store.counters()
    for c in range(n):
        assert s.counter(c) == g[c] == s.service(c) + 5, c


def test_the_batched_push_agrees_with_the_twin_across_batches(redis_server):
    """More tenants charged in one sync than one batched command holds (1,000), some
    waiting here, some elsewhere, some nowhere, a few with amounts already applied
    (a lost reply): the script and LocalStore agree on every counter, score and reply."""
    rng = random.Random(3)
    red, twin = store(redis_server, "batch"), D.LocalStore()
    tenants = [f"i:{k}" for k in range(2500)]
    seqs = {"a": 0, "b": 0}
    base = {"a": 0, "b": 0}
    epoch = ""
    since = {"a": 0, "b": 0}
    amounts: dict[str, dict[str, float]] = {"a": {}, "b": {}}
    for step in range(8):
        r = "ab"[step % 2]
        for c in rng.sample(tenants, 1800):
            amounts[r][c] = amounts[r].get(c, 0.0) + rng.choice([0.5, 1.0, 7.25, 100.0])
        seqs[r] += 1
        waiting = rng.sample(tenants, 1200)
        q = D.SyncRequest(
            r,
            epoch,
            f"{r}0",
            seqs[r],
            base[r],
            step < 2,
            dict(amounts[r]),
            waiting if step < 2 else rng.sample(tenants, 300),
            [] if step < 2 else rng.sample(tenants, 300),
            tenants[:5],
            10**9,
            forget_ms=10**9,
            since=since[r],
        )
        x, y = red.sync(q), twin.sync(q)
        ex = x.epoch.decode() if isinstance(x.epoch, bytes) else x.epoch
        assert (x.status, ex, x.floor, x.counters) == (y.status, y.epoch, y.floor, y.counters)
        assert red.counters() == twin.counters() and red.backlog() == twin.backlog(), step
        assert x.version == y.version
        assert y.changed.items() <= x.changed.items()
        epoch = ex
        if step != 4:  # step 4's reply is lost: its amounts come again, counted once
            base[r], amounts[r], since[r] = seqs[r], {}, x.version or 0


def test_decode_all_is_decode_of_each():
    keys = [D.encode(c) for c in (0, -5, 10**20, "", "i:7", "s:x", "é", "a,b", "0")]
    assert D._decode_all(keys) == [D.decode(k) for k in keys]
    assert D._decode_all(keys) == [0, -5, 10**20, "", "i:7", "s:x", "é", "a,b", "0"]


def test_the_cpu_of_syncs_is_counted_also_when_one_fails(redis_server):
    """``stats.cpu_seconds`` adds each sync's CPU time (the bound on what background
    syncs take from the engine thread), a failed one's too, and nothing else."""
    n = 1000
    s = vtc.Scheduler(1 << 20)
    for c in range(n):
        s.submit(c, f"tenant-{c}", 10)
    s.schedule()
    sh = D.SharedCounters(store(redis_server, "cpu"), replica_id="r0")
    assert sh.stats.cpu_seconds == 0.0
    assert sh.sync(s, D.CORE_WAITING)
    first = sh.stats.cpu_seconds
    assert first > 0.0
    sum(range(200_000))  # CPU outside a sync is not counted
    assert sh.stats.cpu_seconds == first

    class Down:
        def sync(self, req):
            sum(range(50_000))  # the failing store's own work is the sync's
            raise ConnectionError("down")

    sh.store = Down()
    assert not sh.sync(s, D.CORE_WAITING)
    assert sh.stats.failures == 1
    assert sh.stats.cpu_seconds > first
