"""The multi-replica engine model: ``R`` engines in lockstep, counters shared or not.

Each replica is an :class:`~vtc.sim.engine.Engine` (the single-engine model's
step, on its own ``vtc.Scheduler``) over one :class:`~vtc.sim.engine.Ledger`
of the requests; a router sends each request to one replica.  In ``global``
mode every replica keeps a :class:`vtc.distributed.SharedCounters` on one
store (by default a :class:`vtc.distributed.LocalStore`, the in-process twin
of the Redis script) and syncs every ``sync_interval`` steps, staggered.  The
bounds the runs are checked against (:func:`vtc.distributed.staleness_bound`,
:func:`vtc.distributed.drift_bound`) are the sync's contract and live with it
(``docs/distributed.md``).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Callable

import vtc
from vtc.distributed import LocalStore, SharedCounters, Store, encode, staleness_bound
from vtc.sim.engine import Engine, Ledger, SimResult
from vtc.sim.workloads import Client, Request

MODES = ("fcfs", "per-replica", "global")


@dataclass
class ReplicaRun:
    """A multi-replica run: the aggregate :class:`~vtc.sim.engine.SimResult` and the extras.

    ``result.service`` sums every replica's service per tenant; ``backlogged``
    means waiting on at least one replica.  ``staleness`` is the largest gap
    seen between a tenant's true global counter (store + every replica's
    unsynced charges) and a replica's local counter, over tenants waiting
    there; ``rate`` (``mu``) the largest weighted service one replica delivered
    over any window of ``2 * sync_interval`` steps, per step; ``syncs`` the
    number of round trips.
    """

    result: SimResult
    replicas: int
    mode: str
    sync_interval: int
    staleness: float = 0.0
    rate: float = 0.0
    syncs: int = 0

    @property
    def staleness_bound(self) -> float:
        """``eps = 2 (R - 1) S mu`` with the measured ``mu`` (``docs/distributed.md``)."""
        return staleness_bound(self.replicas, self.sync_interval, self.rate)


class _Replica:
    def __init__(self, engine: Engine, shared: SharedCounters | None) -> None:
        self.engine = engine
        self.s = engine.sched
        self.shared = shared
        self.history = array("d", [0.0])  # engine.work after every step


def pinned_router(replicas: int, pinned: Sequence[Client] = (0,)) -> Callable[[Request], int]:
    """Skewed ingress: ``pinned`` tenants always go to replica 0, the others round-robin."""
    pins = set(pinned)
    sent: dict[Client, int] = {}

    def route(r: Request) -> int:
        if r.client in pins:
            return 0
        k = sent.get(r.client, hash(r.client) % replicas)
        sent[r.client] = k + 1
        return k % replicas

    return route


def simulate_replicas(
    requests: Sequence[Request],
    steps: int,
    *,
    replicas: int,
    mode: str,
    route: Callable[[Request], int],
    M: int,
    wp: float = 1.0,
    wq: float = 2.0,
    sync_interval: int = 10,
    store: Store | None = None,
    measure: bool = True,
) -> ReplicaRun:
    """Run ``requests`` on ``replicas`` engines (the :mod:`vtc.sim.engine` model) in lockstep.

    ``mode``: ``"fcfs"`` or ``"per-replica"`` (independent FCFS / VTC schedulers),
    or ``"global"`` (VTC with :class:`~vtc.distributed.SharedCounters` on ``store``,
    default a fresh :class:`~vtc.distributed.LocalStore`; replica ``r`` syncs at
    steps ``t`` with ``(t + r * sync_interval // replicas) % sync_interval == 0``,
    staggered).  ``route(request)`` picks the replica.  With ``measure`` the
    staleness of the local counters is computed at every step (reads the
    store's counters).
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")
    policy = "fcfs" if mode == "fcfs" else "vtc"
    ledger = Ledger(requests, M)
    clients = ledger.clients
    step = [0]
    if mode == "global" and store is None:
        store = LocalStore(clock=lambda: float(step[0]))
    reps: list[_Replica] = []
    for k in range(replicas):
        shared = None
        if mode == "global":
            shared = SharedCounters(
                store, replica_id=f"sim-r{k}", sync_interval=sync_interval, liveness_ms=1 << 40
            )
        sched = vtc.Scheduler(M, wp, wq, policy)
        reps.append(_Replica(Engine(sched, ledger, wp, wq), shared))
    n = len(requests)
    where = [route(r) for r in requests]
    arrival, prompt = ledger.arrival, ledger.prompt
    service = [array("d", [0.0]) for _ in clients]
    backlog = [bytearray() for _ in clients]
    work = array("d", [0.0])
    staleness = 0.0
    nxt = 0
    for t in range(steps):
        step[0] = t
        while nxt < n and arrival[nxt] <= t:
            rep = reps[where[nxt]]
            rep.engine.arrive(nxt)
            if rep.shared is not None:
                rep.shared.submit(rep.s, nxt, requests[nxt].client, prompt[nxt])
            else:
                rep.s.submit(nxt, requests[nxt].client, prompt[nxt])
            nxt += 1
        for k, rep in enumerate(reps):
            rep.engine.admit(t)
            rep.engine.run(t)
            rep.history.append(rep.engine.work)
            if rep.shared is not None and (t + k * sync_interval // replicas) % sync_interval == 0:
                rep.shared.sync(rep.s)
        for j, c in enumerate(clients):
            service[j].append(sum(rep.s.service(c) for rep in reps))
            backlog[j].append(any(rep.engine.waiting[j] > 0 for rep in reps))
        work.append(sum(rep.engine.work for rep in reps))
        if mode == "global" and measure and store is not None:
            staleness = max(staleness, _staleness(store, reps, clients))
    result = SimResult(
        requests=requests,
        steps=steps,
        M=M,
        wp=wp,
        wq=wq,
        policy=policy,
        rpm=None,
        clients=clients,
        weights={c: 1.0 for c in clients},
        service={c: service[j] for j, c in enumerate(clients)},
        backlogged={c: backlog[j] for j, c in enumerate(clients)},
        work=work,
        first_admit=ledger.first_admit,
        finish=ledger.finish,
        output_len=ledger.output,
        preemptions=sum(rep.engine.preemptions for rep in reps),
    )
    syncs = sum(rep.shared.stats.round_trips for rep in reps if rep.shared is not None)
    span = min(2 * sync_interval, steps)
    rate = max(
        max(h[i] - h[i - span] for i in range(span, len(h))) / span if len(h) > span else 0.0
        for h in (rep.history for rep in reps)
    )
    return ReplicaRun(
        result, replicas, mode, sync_interval, staleness=staleness, rate=rate, syncs=syncs
    )


def _staleness(store: Store, reps: Sequence[_Replica], clients: Sequence[Client]) -> float:
    """max over replicas r, tenants c waiting on r of ``true global counter(c) - counter_r(c)``."""
    glob = store.counter if isinstance(store, LocalStore) else None
    if glob is None:
        glob = {encode(c): v for c, v in store.counters().items()}
    worst = 0.0
    for j, c in enumerate(clients):
        key = encode(c)
        true = glob.get(key, 0.0)
        for rep in reps:
            assert rep.shared is not None
            true += rep.shared.unsynced(rep.s, c)
        for rep in reps:
            if rep.engine.waiting[j]:
                worst = max(worst, true - rep.s.counter(c))
    return worst
