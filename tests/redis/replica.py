"""A replica process for the multi-process tests: an engine loop with shared counters."""

from __future__ import annotations

import heapq
import multiprocessing as mp
import time
from typing import Any

import vtc
from vtc import distributed
from vtc.sim import workloads
from vtc.sim.replicas import pinned_router

M = 2048
TENANTS = 3  # tenant 0 pinned to replica 0; tenants 1, 2 spread over every replica
HORIZON = 40_000


def requests_for(idx: int, replicas: int, seed: int = 0) -> list[workloads.Request]:
    """This replica's share of one deterministic overloaded workload, by the pinned router."""
    reqs = workloads.overloaded([1.5] * TENANTS, HORIZON, M, seed=seed)
    route = pinned_router(replicas)
    return [r for r in reqs if route(r) == idx]


def run(
    idx: int,
    replicas: int,
    url: str | None,
    namespace: str,
    steps: int,
    sync_interval: int,
    out: Any,
    progress: Any = None,
    svc: Any = None,
    stop: Any = None,
    liveness_ms: int = 10_000,
    barrier: Any = None,
    health: Any = None,
    unsynced: Any = None,
) -> None:
    """Serve this replica's requests for ``steps`` steps (or until ``stop``), then report.

    ``progress.value`` is the step reached; ``svc`` (shared doubles) this
    replica's delivered service per tenant after every step.  Every submitted
    request must end up finished, waiting or running: none is dropped.
    ``barrier`` (shared by all replicas) keeps them in step: every replica
    waits for the others after each sync interval, as replicas of equal speed
    would be. Without it, on a loaded machine one process can run far ahead of
    the others, and the counters it pulls then describe the past.
    ``health`` (two shared longs) is kept at ``[degraded steps, successful
    syncs]`` after every step, so a test can wait for a fault to be seen and
    for reconciliation instead of sleeping. ``unsynced`` (shared doubles) is
    kept at the service per tenant charged here that the store has not
    acknowledged (:meth:`SharedCounters.unsynced`), so a test can tell what a
    killed replica lost.
    """
    reqs = requests_for(idx, replicas)
    s = vtc.Scheduler(M, 1.0, 2.0, "vtc")
    shared = None
    if url is not None:
        store = distributed.RedisStore.from_url(url, namespace, timeout_ms=50)
        shared = distributed.SharedCounters(
            store,
            replica_id=f"replica-{idx}",
            sync_interval=sync_interval,
            liveness_ms=liveness_ms,
            retry_ms=20,
        )
    heap: list[tuple[int, int]] = []
    due: dict[int, int] = {}
    gen: dict[int, int] = {}
    out_len = {i: min(r.output_len, M - r.prompt_len) for i, r in enumerate(reqs)}
    finished = degraded_steps = 0
    nxt = t = 0
    for t in range(steps):
        if stop is not None and stop.is_set():
            break
        while nxt < len(reqs) and reqs[nxt].arrival <= t:
            r = reqs[nxt]
            if shared is not None:
                shared.submit(s, nxt, r.client, r.prompt_len)
            else:
                s.submit(nxt, r.client, r.prompt_len)
            nxt += 1
        for rid in s.schedule():
            f = t + out_len[rid] - gen.get(rid, 0) - 1
            due[rid] = f
            heapq.heappush(heap, (f, rid))
        for rid in s.decode():
            gen[rid] = s.generated(rid)
            del due[rid]
        while heap and heap[0][0] <= t:
            f, rid = heapq.heappop(heap)
            if due.get(rid) == f:
                del due[rid]
                s.finish(rid)
                finished += 1
        if shared is not None:
            shared.on_step(s)
            degraded_steps += shared.degraded
            if health is not None:
                health[0], health[1] = degraded_steps, shared.stats.syncs
        if barrier is not None and t % sync_interval == sync_interval - 1:
            barrier.wait(timeout=60)  # raises (the process fails) rather than hang
        if progress is not None:
            progress.value = t + 1
        if svc is not None:
            for c in range(TENANTS):
                svc[c] = s.service(c)
        if unsynced is not None and shared is not None:
            for c in range(TENANTS):
                unsynced[c] = shared.unsynced(s, c)
    final_ok = None
    if shared is not None:
        # the store's 50 ms timeout can expire on a busy machine: retry for a while
        deadline = time.monotonic() + 30
        final_ok = shared.sync(s)
        while not final_ok and time.monotonic() < deadline:
            time.sleep(0.02)
            final_ok = shared.sync(s)
    assert finished + s.num_waiting + s.num_running == nxt, "a request was dropped"
    out.put(
        {
            "idx": idx,
            "steps": t + 1,
            "services": {c: s.service(c) for c in range(TENANTS)},
            "counters": {c: s.counter(c) for c in range(TENANTS)},
            "submitted": nxt,
            "degraded_steps": degraded_steps,
            "final_ok": final_ok,
            "failures": shared.stats.failures if shared else 0,
        }
    )


def ctx() -> Any:
    """The multiprocessing context the tests use (fork: fast, children build their clients)."""
    return mp.get_context("fork")
