"""Several replica processes sharing counters on a real Redis: fairness, kills, restarts."""

from __future__ import annotations

import os
import signal

import sync_helpers
from replica import TENANTS, M, ctx, run

from vtc import distributed as D

S = 10
U = max(1.0 * 512, 2.0 * M)  # wp * L_input, wq * M
RATE = 2.0 * M  # a replica charges at most wq * M per decode step (+ prefill, amortised)


def bound(replicas: int) -> float:
    """``2 (R U + eps)`` with a conservative per-replica rate (docs/distributed.md)."""
    return D.drift_bound(replicas, S, RATE / S, U)


DEADLINE_S = 120.0  # generous: the 2-core machine may be busy with other work


def wait_for(cond, what: str) -> None:
    """:func:`sync_helpers.wait_for` with this module's longer deadline."""
    sync_helpers.wait_for(cond, what, DEADLINE_S, every=0.02)


def launch(
    n: int,
    url: str | None,
    steps: int,
    health: list | None = None,
    unsynced: list | None = None,
    **kw,
):
    """Start ``n`` replicas; with ``health`` (a list) it receives each one's shared
    ``[degraded steps, successful syncs]``, with ``unsynced`` each one's service
    per tenant the store has not acknowledged."""
    c = ctx()
    out = c.Queue()
    procs, prog, svcs = [], [], []
    for i in range(n):
        # lock-free: a replica is SIGKILLed mid-run, and a lock it held would be lost
        p_, s_ = c.Value("l", 0, lock=False), c.Array("d", TENANTS, lock=False)
        extra = {}
        if health is not None:
            health.append(c.Array("l", 2, lock=False))
            extra["health"] = health[-1]
        if unsynced is not None:
            unsynced.append(c.Array("d", TENANTS, lock=False))
            extra["unsynced"] = unsynced[-1]
        args = (i, n, url, "rep", steps, S, out, p_, s_)
        proc = c.Process(target=run, args=args, kwargs={**kw, **extra})
        proc.start()
        procs.append(proc)
        prog.append(p_)
        svcs.append(s_)
    return procs, prog, svcs, out


def collect(procs, out, n: int) -> dict[int, dict]:
    got = {}
    for _ in range(n):
        r = out.get(timeout=60)
        got[r["idx"]] = r
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    return got


def totals(results: dict[int, dict]) -> dict[int, float]:
    return {c: sum(r["services"][c] for r in results.values()) for c in range(TENANTS)}


def test_three_replicas_global_vs_per_replica(redis_server):
    """Tenant 0 pinned to replica 0 gets its fair third with shared counters, not without."""
    steps, n = 6000, 3
    procs, _, _, out = launch(n, redis_server.url, steps, barrier=ctx().Barrier(n))
    glob = collect(procs, out, n)
    procs, _, _, out = launch(n, None, steps, barrier=ctx().Barrier(n))
    local = collect(procs, out, n)
    g, loc = totals(glob), totals(local)
    spread = (g[1] + g[2]) / 2
    assert abs(g[0] - spread) <= bound(n)  # within the derived bound of an exact global VTC
    assert abs(loc[0] - (loc[1] + loc[2]) / 2) > bound(n)  # per-replica VTC is not
    # after the final syncs Redis holds every charge (counters = service + lifts)
    counters = D.RedisStore.from_url(redis_server.url, "rep").counters()
    for c in range(TENANTS):
        assert counters[c] >= g[c] - 1e-6
        assert counters[c] - g[c] <= bound(n)  # lifts are bounded too


def test_killed_replica_loses_at_most_its_unsynced_charges(redis_server):
    """A SIGKILLed replica loses only what it charged since its last acknowledged
    sync and the store had not applied yet: at most one sync interval."""
    n = 3
    uns: list = []
    procs, prog, svcs, out = launch(n, redis_server.url, 10**6, unsynced=uns, liveness_ms=300)
    most = S * RATE + 512  # S steps (+ one prefill) of charges
    wait_for(lambda: min(p.value for p in prog) >= 2000, "every replica to reach step 2000")
    # until it served far more than it may lose, so a loss of everything would show
    wait_for(lambda: sum(svcs[2]) > 3 * most, "replica 2 to serve three sync intervals' worth")
    os.kill(procs[2].pid, signal.SIGKILL)
    procs[2].join(timeout=10)
    unacked = list(uns[2])  # as of its last completed step
    st = D.RedisStore.from_url(redis_server.url, "rep", timeout_ms=5000)  # a loaded machine
    rec = st.client.hgetall(st.prefix + "s:replica-2")  # applied, reply not yet seen
    assert rec and int(rec[b"#seq"]) > 0  # it did sync
    inflight = [float(rec.get(D.encode(c).encode(), 0)) for c in range(TENANTS)]
    lost = [unacked[c] - inflight[c] for c in range(TENANTS)]
    assert abs(sum(lost)) <= most  # the shared arrays may lag one step behind
    # the survivors keep serving and reap the dead replica from the backlog
    before = [p.value for p in prog[:2]]
    wait_for(lambda: "replica-2" not in st.replicas(), "the dead replica to be reaped")
    wait_for(
        lambda: all(p.value > b for p, b in zip(prog[:2], before)), "the survivors to keep serving"
    )
    for p in procs[:2]:
        p.terminate()
        p.join(timeout=10)


def test_redis_restart_mid_run_keeps_counters_and_serving(redis_aof):
    """Redis stops mid-run and comes back: the replicas serve on (degraded), then
    reconcile, and nothing charged during the outage is lost. Every wait is for a
    condition the replicas report, never for a fixed time."""
    n = 2
    stop = ctx().Event()
    health: list = []
    procs, prog, _, out = launch(n, redis_aof.url, 10**6, health=health, stop=stop)
    wait_for(lambda: min(p.value for p in prog) >= 1500, "every replica to reach step 1500")
    assert all(h[1] > 0 for h in health)  # they synced before the outage
    st = D.RedisStore.from_url(redis_aof.url, "rep", timeout_ms=2000)
    redis_aof.stop()
    down = [p.value for p in prog]
    wait_for(
        lambda: (
            all(h[0] > 0 for h in health) and all(p.value > d + 100 for p, d in zip(prog, down))
        ),
        "every replica to notice the outage and serve on",
    )
    redis_aof.start()
    after_restart = st.counters()
    assert after_restart and min(after_restart.values()) > 0  # the AOF kept the counters
    synced = [h[1] for h in health]
    wait_for(
        lambda: all(h[1] > k for h, k in zip(health, synced)),
        "every replica to sync again after the restart",
    )
    stop.set()
    res = collect(procs, out, n)
    assert all(r["degraded_steps"] > 0 and r["final_ok"] for r in res.values())
    final, served = st.counters(), totals(res)
    for c in range(TENANTS):
        assert final[c] >= after_restart[c]
        assert final[c] >= served[c] - 1e-6  # reconciled: nothing charged during the outage lost
