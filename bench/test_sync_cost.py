"""Cost of sharing counters through Redis: one sync, and what it adds to an engine step.

Needs ``redis-server`` on PATH (started here on 127.0.0.1 at a free port, stopped after).

Groups:

* ``sync``: one ``SharedCounters.sync`` (diff mode) with T = 10 ... 10,000 tenants
  waiting, a tenth of them charged since the last sync;
* ``engine-step C=<T>``: a step of the bench engine (``workload.Engine``, M = 200k)
  with T tenants, driven the way the engines drive it (``vtc.sharing.SharedCounterSync``,
  the waiting tenants from ``Scheduler.active_clients``): without sharing; on the engine
  thread (``VTC_SYNC_MODE=step``) at ``sync_interval`` 1 and 10; and with the background
  thread the engines use by default (``VTC_SYNC_MODE=background``, a sync every 50 ms),
  where the step's own time is what the thread costs it (the GIL).

``VTC_BENCH_DISTRIBUTED=<file>`` benches another ``distributed.py`` (e.g. an older one,
``git show <commit>:python/vtc/distributed.py > /tmp/old.py``) against the current core.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import pytest

import redis
import vtc
from vtc import distributed as D
from vtc.sharing import SharedCounterSync
from workload import Engine

if os.environ.get("VTC_BENCH_DISTRIBUTED"):
    _spec = importlib.util.spec_from_file_location(
        "vtc_bench_distributed", os.environ["VTC_BENCH_DISTRIBUTED"]
    )
    D = importlib.util.module_from_spec(_spec)  # noqa: N816
    sys.modules[_spec.name] = D  # its dataclasses look their module up
    _spec.loader.exec_module(D)

BACKGROUND_MS = 50.0  # the engines' default VTC_SYNC_MS


@pytest.fixture(scope="module")
def url():
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server not found on PATH (apt-get install -y redis-server)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as d:
        args = [binary, "--bind", "127.0.0.1", "--port", str(port), "--dir", d, "--save", ""]
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL)
        try:
            for _ in range(500):
                try:
                    redis.Redis(port=port).ping()
                    break
                except redis.ConnectionError:
                    time.sleep(0.01)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            proc.terminate()
            proc.wait(timeout=10)


@pytest.mark.parametrize("tenants", [10, 100, 1000, 10_000])
def test_sync(benchmark, url, tenants):
    s = vtc.Scheduler(1 << 20)
    st = D.RedisStore.from_url(url, f"bench-{tenants}", timeout_ms=5000)
    shared = D.SharedCounters(st, replica_id="bench")
    for c in range(tenants):
        s.submit(c, c, 10)
    s.schedule()  # one running request per tenant; every tenant also counts as waiting
    waiting = list(range(tenants))
    charged = list(range(0, tenants, 10))  # a tenth of the tenants get service per step
    shared.sync(s, waiting)

    def step():
        s.decode(charged, 1)
        shared.sync(s, waiting)

    rounds = 300 if tenants <= 1000 else 40
    b0, i0, r0 = st.bytes_out, st.bytes_in, shared.stats.round_trips
    benchmark.group = "sync"
    benchmark.pedantic(step, rounds=rounds, iterations=1, warmup_rounds=5)
    n = shared.stats.round_trips - r0
    benchmark.extra_info.update(
        round_trips_per_sync=n / (rounds + 5),
        bytes_out_per_sync=(st.bytes_out - b0) / n,
        bytes_in_per_sync=(st.bytes_in - i0) / n,
    )


def _one_running_one_waiting(url, namespace, tenants):
    """A core with one running and one waiting request per tenant, a store and a
    synchronizer on ``namespace``, the running ids, and the waiting set as the engines
    pass it: the change feed ``CORE_WAITING``, or for a ``distributed.py`` without one
    ``active_clients()`` read each sync, as ``SharedCounterSync.waiting`` did."""
    s = vtc.Scheduler(1 << 20)
    st = D.RedisStore.from_url(url, namespace, timeout_ms=5000)
    shared = D.SharedCounters(st, replica_id="bench")
    running = list(range(tenants))
    for c in running:
        s.submit(c, c, 10)
    s.schedule()  # one running request per tenant ...
    for c in running:
        s.submit(tenants + c, c, 10)  # ... and one waiting
    core = getattr(D, "CORE_WAITING", None)

    def waiting():
        if core is not None:
            return core
        return [c for c, (w, _) in s.active_clients().items() if w]

    return s, st, shared, running, waiting


@pytest.mark.parametrize("tenants", [1000, 10_000])
def test_sync_all_charged(benchmark, url, tenants):
    """``test_sync_core_waiting`` with every tenant charged between syncs: nothing for a
    delta to save, the cost is the push (one counter write per tenant) and the reply."""
    s, st, shared, running, waiting = _one_running_one_waiting(url, f"bench-all-{tenants}", tenants)
    shared.sync(s, waiting())
    cpu: list[float] = []

    def step():
        s.decode(running, 1)
        t0 = time.process_time()
        shared.sync(s, waiting())
        cpu.append(time.process_time() - t0)

    def redis_cpu() -> float:  # the server's CPU seconds (its script), less noisy than wall
        info = st.client.info("cpu")
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])

    rounds = 100 if tenants <= 1000 else 20
    benchmark.group = "sync-all-charged"
    r0 = redis_cpu()
    benchmark.pedantic(step, rounds=rounds, iterations=1, warmup_rounds=3)
    benchmark.extra_info.update(
        python_cpu_ms_median=1000 * sorted(cpu)[len(cpu) // 2],
        redis_cpu_ms_per_sync=1000 * (redis_cpu() - r0) / len(cpu),
    )


@pytest.mark.parametrize("tenants", [1000, 10_000])
def test_sync_core_waiting(benchmark, url, tenants):
    """``test_sync`` as the engines sync: the waiting set from the core. With the change
    feed ``CORE_WAITING`` (only the tenants changed since the last sync); a
    ``distributed.py`` without one gets ``active_clients()`` read each sync, as
    ``SharedCounterSync.waiting`` did."""
    s, _, shared, running, waiting = _one_running_one_waiting(url, f"bench-core-{tenants}", tenants)
    charged = running[::10]  # a tenth of the tenants get service per step
    shared.sync(s, waiting())

    def step():
        s.decode(charged, 1)
        shared.sync(s, waiting())

    rounds = 300 if tenants <= 1000 else 40
    benchmark.group = "sync-core-waiting"
    benchmark.pedantic(step, rounds=rounds, iterations=1, warmup_rounds=5)


# (tenants, mode): rounds (engine steps timed). Background: ~1-2 s of steps, so the
# thread syncs 20-40 times while they run; on the engine thread: 20-100 syncs.
STEP_CASES = {
    (1000, "none"): 50_000,
    (1000, "step-1"): 200,
    (1000, "step-10"): 1000,
    (1000, "background"): 50_000,
    (10_000, "none"): 50_000,
    (10_000, "step-1"): 20,
    (10_000, "step-10"): 200,
    (10_000, "background"): 50_000,
}


@pytest.mark.parametrize("tenants,mode", list(STEP_CASES))
def test_engine_step_with_sync(benchmark, url, tenants, mode):
    waiting = 20_000 if tenants <= 1000 else 100_000
    eng = Engine(vtc.Scheduler(200_000, 1.0, 2.0), tenants, waiting, seed=1)
    sync = None
    if mode != "none":
        st = D.RedisStore.from_url(url, f"step-{tenants}-{mode}", timeout_ms=5000)
        interval = int(mode.split("-")[1]) if mode.startswith("step") else 10
        shared = D.SharedCounters(st, replica_id="bench", sync_interval=interval)
        # the engine path: vtc.adapter's observer, in the mode VTC_SYNC_MODE selects
        sync = SharedCounterSync(
            eng.s, shared, background=mode == "background", interval_ms=BACKGROUND_MS
        )
        if D is not vtc.distributed and mode != "background":
            # an older on_step takes no callable: the waiting list on every step, as then
            sync.stepped = lambda _ad: shared.on_step(eng.s, sync.waiting())

    def step():
        eng.step()
        if sync is not None:
            sync.stepped(None)  # what Adapter.step_done does for this observer

    for _ in range(200):
        step()
    if sync is not None:
        sync.shared.sync(eng.s, sync.waiting())  # warm: the first (full) sync is done
        r0, p0 = sync.shared.stats.round_trips, sync.shared.stats.pulled_tenants
        d0 = len(sync.shared.durations)
        c0 = getattr(sync.shared.stats, "cpu_seconds", 0.0)
    benchmark.group = f"engine-step C={tenants} M=200k"
    benchmark.extra_info["mode"] = mode
    began = time.perf_counter()
    try:
        benchmark.pedantic(step, rounds=STEP_CASES[tenants, mode], iterations=1, warmup_rounds=5)
    finally:
        wall = time.perf_counter() - began
        if sync is not None:
            sync.shared.stop()
    if sync is not None:
        st = sync.shared.stats
        n = st.round_trips - r0
        durs = list(sync.shared.durations)[d0:]
        # the syncs' own CPU (their thread's, vtc.distributed.SyncStats.cpu_seconds):
        # in the background, the most they can take from the engine thread (the GIL)
        cpu = getattr(st, "cpu_seconds", 0.0) - c0
        benchmark.extra_info.update(
            syncs=n,
            pulled_per_sync=(st.pulled_tenants - p0) / max(n, 1),
            round_trip_ms_median=1000 * sorted(durs)[len(durs) // 2] if durs else None,
            sync_cpu_ms_per_sync=1000 * cpu / max(n, 1),
            sync_cpu_share=cpu / wall,
        )


def _engine_time_lost(eng, shared, waiting, pairs: int, block: int) -> dict:
    """Blocks of ``block`` engine steps, alternately with the background thread
    running and stopped (``pairs`` of each). Per block: the engine thread's time off
    the CPU (wall minus its ``thread_time``): with the thread stopped ~0, with it
    running what the syncs took through the interpreter lock (and the cores)."""
    off_cpu: dict[bool, list[float]] = {True: [], False: []}
    step_us: dict[bool, list[float]] = {True: [], False: []}
    sync_share = []
    syncs0, cpu0 = shared.stats.round_trips, shared.stats.cpu_seconds
    for pair in range(pairs):
        for on in (True, False) if pair % 2 else (False, True):
            if on:
                c0 = shared.stats.cpu_seconds
                shared.start(eng.s, interval_ms=BACKGROUND_MS, waiting=waiting)
            w0, t0 = time.perf_counter(), time.thread_time()
            for _ in range(block):
                eng.step()
            wall, cpu = time.perf_counter() - w0, time.thread_time() - t0
            if on:
                shared.stop()
                sync_share.append((shared.stats.cpu_seconds - c0) / wall)
            off_cpu[on].append((wall - cpu) / wall)
            step_us[on].append(1e6 * wall / block)
    med = statistics.median
    syncs = shared.stats.round_trips - syncs0
    sync_cpu = shared.stats.cpu_seconds - cpu0
    return {
        "syncs": syncs,
        "sync_cpu_ms_per_sync": 1000 * sync_cpu / max(syncs, 1),
        "engine_off_cpu_share_with_sync": med(off_cpu[True]),
        "engine_off_cpu_share_without": med(off_cpu[False]),
        "engine_time_lost": med(off_cpu[True]) - med(off_cpu[False]),
        "sync_cpu_share": med(sync_share),
        "step_us_median_with_sync": med(step_us[True]),
        "step_us_median_without": med(step_us[False]),
    }


@pytest.mark.parametrize("cpu_share", [0.005, 0.01])
def test_engine_time_lost_to_background_sync(benchmark, url, cpu_share):
    """What the background sync takes from the engine thread, measured on that thread:
    the share of its wall time it spends off the CPU (waiting for the interpreter lock
    or a core) with the sync thread running, minus the same without it, over alternated
    blocks of the same engine (1,000 tenants, every one charged between two syncs).
    The step's own time is too noisy for this: two blocks of the same engine differ by
    a few percent with no sync at all."""
    eng = Engine(vtc.Scheduler(200_000, 1.0, 2.0), 1000, 20_000, seed=1, refills=2_000_000)
    st = D.RedisStore.from_url(url, f"lost-{cpu_share}", timeout_ms=5000)
    shared = D.SharedCounters(st, replica_id="bench", cpu_share=cpu_share)
    sync = SharedCounterSync(eng.s, shared, background=False)
    for _ in range(2000):
        eng.step()
    shared.sync(eng.s, sync.waiting())  # the first (full) sync is done
    benchmark.group = "engine thread's time lost to background syncs, C=1000"
    result = benchmark.pedantic(
        _engine_time_lost,
        args=(eng, shared, sync._waiting, 8, 40_000),
        rounds=1,
        iterations=1,
    )
    benchmark.extra_info.update(cpu_share=cpu_share, **result)
