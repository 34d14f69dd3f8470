"""SharedCounters and the Lua script on a real Redis: semantics, faults, the sim twin."""

from __future__ import annotations

import ast
import subprocess
import sys

import numpy as np
import pytest

import vtc
from vtc import distributed as D
from vtc import redis_store as redis_module
from vtc import store as store_module
from vtc.sim import metrics, workloads
from vtc.sim.replicas import pinned_router, simulate_replicas


def store(server, ns: str = "t") -> D.RedisStore:
    return D.RedisStore.from_url(server.url, ns, timeout_ms=2000)


def req(rid: str, svc=None, add=(), rem=(), pull=(), full=False, epoch="", live=10**9, **kw):
    """A SyncRequest; ``seq`` (default 1), ``base`` (0), ``inc`` ("e0"), ``keep``, ``hints``."""
    return D.SyncRequest(
        rid,
        epoch,
        kw.get("inc", "e0"),
        kw.get("seq", 1),
        kw.get("base", 0),
        full,
        dict(svc or {}),
        list(add),
        list(rem),
        list(pull),
        live,
        keep=list(kw.get("keep", ())),
        hints=dict(kw.get("hints", {})),
    )


def test_distributed_does_not_import_the_simulator():
    """vtc.sim.replicas imports vtc.distributed, never the other way (no import circle)."""
    code = (
        "import sys, vtc.distributed\n"
        "sim = sorted(m for m in sys.modules if m == 'vtc.sim' or m.startswith('vtc.sim.'))\n"
        "assert not sim, sim\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    # not even under TYPE_CHECKING or inside a function, nor in the modules it is made of
    for module in (D, store_module, redis_module):
        _assert_no_simulator_import(module.__file__)


def _assert_no_simulator_import(path: str) -> None:
    tree = ast.parse(open(path, encoding="utf-8").read())
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            assert not (name + ".").startswith("vtc.sim."), f"{path}:{node.lineno}: {name}"


def test_replicas_experiment_identical_on_redis_and_twin(redis_server):
    """The simulation's global VTC on real Redis makes exactly the twin's decisions."""
    steps, M, R = 2000, 8192, 4
    reqs = workloads.overloaded([1.5] * R, steps, M, seed=1)
    runs = {}
    for name, st in (("redis", store(redis_server, "sim")), ("local", None)):
        runs[name] = simulate_replicas(
            reqs, steps, replicas=R, mode="global", route=pinned_router(R), M=M, store=st
        )
    a, b = runs["redis"].result, runs["local"].result
    for c in a.clients:
        np.testing.assert_array_equal(metrics.service(a, c), metrics.service(b, c))
    assert runs["redis"].staleness == runs["local"].staleness
    assert runs["redis"].staleness <= runs["redis"].staleness_bound
    # Redis holds everything but each replica's unsynced charges (< S steps of service)
    counters = store(redis_server, "sim").counters()
    run = runs["redis"]
    for c in a.clients:
        unsynced = metrics.service(a, c)[-1] - counters[c]
        assert unsynced <= R * run.sync_interval * run.rate


def test_global_restores_fair_split_per_replica_loses():
    """Pinned tenant: per-replica VTC gives it ~1/N^2 of the service, global VTC ~1/N."""
    steps, M, R = 6000, 8192, 4
    reqs = workloads.overloaded([1.5] * R, steps, M, seed=0)
    share = {}
    for mode in ("per-replica", "global"):
        run = simulate_replicas(reqs, steps, replicas=R, mode=mode, route=pinned_router(R), M=M)
        share[mode] = metrics.shares(run.result)[0]
        drift = metrics.max_pair_drift(run.result)
        u = metrics.result_u(run.result)
        if mode == "global":
            assert drift <= D.drift_bound(R, 10, run.rate, u)
            assert run.staleness <= run.staleness_bound
        else:
            assert drift > D.drift_bound(R, 10, run.rate, u) / 4
    assert share["per-replica"] < 0.6 / R
    assert abs(share["global"] - 1 / R) < 0.02


def test_push_counts_each_amount_once_and_each_replica(redis_server):
    st = store(redis_server)
    a = st.sync(req("a", {"i:1": 10.0}, add=["i:1"], pull=["i:1"], full=True))
    assert a.status == "ok" and a.counters == [10.0]
    e = a.epoch
    # a replayed request (same seq) changes nothing
    assert st.sync(req("a", {"i:1": 10.0}, pull=["i:1"], epoch=e)).counters == [10.0]
    # its reply was lost: the next requests carry the amounts since base 0 again, and more
    assert st.sync(req("a", {"i:1": 10.0}, pull=["i:1"], epoch=e, seq=2)).counters == [10.0]
    assert st.sync(req("a", {"i:1": 15.0}, pull=["i:1"], epoch=e, seq=3)).counters == [15.0]
    # the reply to seq 3 arrived: amounts start again from there
    assert st.sync(req("a", {"i:1": 2.0}, pull=["i:1"], epoch=e, seq=4, base=3)).counters == [17.0]
    b = st.sync(req("b", {"i:1": 5.0}, pull=["i:1"], full=True))
    assert b.counters == [22.0]
    # a restarted replica keeping its id is a new incarnation: its seq 1 is not a replay
    r = st.sync(req("a", {"i:1": 1.0}, pull=["i:1"], full=True, inc="e1"))
    assert r.counters == [23.0]
    assert st.counters() == {1: 23.0}


def test_lift_to_global_floor_and_leave(redis_server):
    st = store(redis_server)
    r = st.sync(req("a", {"i:1": 100.0, "i:2": 40.0}, add=["i:1", "i:2"], full=True))
    assert r.floor == 40.0  # arriving together, they do not lift each other
    # tenant 3 becomes backlogged on another replica: lifted to the floor (40), not 0
    r = st.sync(req("b", {}, add=["i:3"], pull=["i:3"], full=True))
    assert r.counters == [40.0]
    # tenant 2 leaves replica a; it stays backlogged nowhere else -> out of the floor
    r = st.sync(req("a", {}, rem=["i:2"], epoch=r.epoch, seq=2))
    assert st.backlog() == {1: 100.0, 3: 40.0}
    # a replica that sends a diff under a stale epoch is told to resync
    assert st.sync(req("a", {}, epoch="stale")).status == "resync"


def test_namespaces_are_isolated(redis_server):
    one, two = store(redis_server, "one"), store(redis_server, "two")
    one.sync(req("a", {"s:x": 3.0}, full=True))
    assert one.counters() == {"x": 3.0} and two.counters() == {}


def test_dead_replica_is_reaped_from_the_backlog(redis_server):
    st = store(redis_server)
    st.sync(req("dead", {"i:1": 7.0}, add=["i:1"], full=True, live=50))
    assert st.backlog() == {1: 7.0}
    import time

    time.sleep(0.12)
    st.sync(req("live", {"i:2": 1.0}, add=["i:2"], full=True, live=50))
    assert st.backlog() == {2: 7.0}  # tenant 1 left with the dead replica; 2 lifted to 7
    assert st.counters()[1] == 7.0  # what the dead replica charged stays counted
    assert st.replicas() == ["live"]


def test_unreachable_redis_falls_back_then_reconciles(redis_server):
    url, port = redis_server.url, redis_server.port
    redis_server.stop()
    s = vtc.Scheduler(4096)
    shared = D.SharedCounters(
        D.RedisStore.from_url(url, "t", timeout_ms=50), sync_interval=1, retry_ms=0
    )
    for i in range(20):
        shared.submit(s, i, i % 2, 100)
    served = 0
    for _ in range(30):
        served += len(s.schedule())
        s.decode()
        assert shared.on_step(s) is False
    assert shared.degraded and served == 20  # kept serving, nothing blocked or dropped
    assert redis_server.port == port
    redis_server.start()
    assert shared.on_step(s) is True and not shared.degraded
    assert store(redis_server).counters() == pytest.approx(s.services())


def test_from_env():
    assert D.from_env({}) is None
    shared = D.from_env(
        {D.ENV_URL: "redis://127.0.0.1:1/0", D.ENV_SYNC_INTERVAL: "7", D.ENV_NAMESPACE: "x"}
    )
    assert shared is not None and shared.sync_interval == 7
    assert shared.store.prefix == "vtc:{x}:"
    assert (shared.liveness_ms, shared.retry_ms, shared.forget_ms) == (10_000, 1000.0, 60_000)
    env = {
        D.ENV_URL: "redis://h/0",
        "VTC_SYNC_LIVENESS_MS": "30000",
        "VTC_SYNC_RETRY_MS": "5",
        "VTC_SYNC_FORGET_MS": "120000",
    }
    shared = D.from_env(env)
    assert (shared.liveness_ms, shared.retry_ms, shared.forget_ms) == (30_000, 5.0, 120_000)


def test_twin_answers_every_request_as_the_script_does(redis_server):
    """Random syncs of three replicas (diffs, full syncs with keeps and hints, lost replies,
    replays, new incarnations, data loss, an old incarnation that lives on beside a new
    one under the same id, idle tenants forgotten): LocalStore and the Lua script agree
    exactly."""
    import random

    rng = random.Random(7)
    red, twin = store(redis_server, "twin"), D.LocalStore()
    tenants = [f"i:{k}" for k in range(6)]
    state = {
        r: {"id": r, "inc": f"{r}0", "seq": 0, "base": 0, "since": {}, "epoch": "", "ver": 0}
        for r in "abc"
    }
    last: dict[str, D.SyncRequest] = {}
    statuses: set[str] = set()
    for step in range(400):
        r = rng.choice(sorted(state))
        st = state[r]
        if rng.random() < 0.03:  # a restart: a new incarnation with the same id
            if rng.random() < 0.3:  # ... while the old one lives on
                state[f"{r}'{step}"] = dict(st, since=dict(st["since"]))
            st.update(inc=f"{r}{step}", seq=0, base=0, since={})
        if r in last and rng.random() < 0.05:
            q = last[r]  # a duplicated request
        else:
            for c in rng.sample(tenants, rng.randint(0, 3)):
                st["since"][c] = st["since"].get(c, 0.0) + rng.choice([0.5, 1.0, 7.25, 100.0])
            st["seq"] += 1
            full = rng.random() < 0.2
            waiting = rng.sample(tenants, rng.randint(0, 4))
            keep = [c for c in waiting if rng.random() < 0.5] if full else []
            add = [c for c in waiting if c not in keep]
            rem = [c for c in tenants if c not in waiting and rng.random() < 0.3]
            hints = {c: rng.choice([3.0, 50.0, 1e4]) for c in keep if rng.random() < 0.5}
            q = D.SyncRequest(
                st["id"],
                st["epoch"],
                st["inc"],
                st["seq"],
                st["base"],
                full,
                dict(st["since"]),
                add,
                [] if full else rem,
                sorted(set(tenants[:3]) | set(waiting)),
                10**9,
                keep=keep,
                hints=hints,
                forget_ms=rng.choice([0, 10**9]),  # forgetting due at once, or never
                since=rng.choice([None, 0, st["ver"], st["ver"], st["ver"] + 5]),
            )
            last[r] = q
        a, b = red.sync(q), twin.sync(q)
        ea = a.epoch.decode() if isinstance(a.epoch, bytes) else a.epoch
        assert (a.status, ea, a.floor, a.counters) == (b.status, b.epoch, b.floor, b.counters), step
        assert red.counters() == twin.counters() and red.backlog() == twin.backlog(), step
        assert a.version == b.version, step
        # the changed counters: the twin's, and on Redis a scrub batch more of the waiting
        assert b.changed.items() <= a.changed.items(), step
        assert all(twin.counter[k] == v for k, v in a.changed.items()), step
        statuses.add(a.status)
        if a.status == "ok":
            st["epoch"] = ea
            if rng.random() < 0.8:  # the reply arrived: the next amounts start from here
                st["base"], st["since"] = q.seq, {}
                st["ver"] = a.version or 0
        if rng.random() < 0.01:  # the store loses everything
            redis_server.client().flushall()
            twin = D.LocalStore()
    assert statuses == {"ok", "resync", "duplicate"}
