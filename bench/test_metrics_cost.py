"""What the per-tenant metrics (vtc.metrics.TenantMetrics) add to an engine step,
side by side in one run: the adapter's step (one decode charge of the running
batch + step_done) at 1,000 tenants, 256 running requests of 256 tenants, 744
tenants waiting, without metrics and with them (refreshed every second, as by
default), and one refresh on its own, into a registry and into a prometheus_client
multiprocess directory (how vLLM and SGLang serve them: vtc's own files,
``vtc.multiproc``). Issue 16's target: under 10 us added per step at 1,000
tenants. Figures: bench/README.md (group metrics-cost)."""

from __future__ import annotations

import math
import random
import time

import pytest
from prometheus_client import CollectorRegistry

import vtc
from vtc.adapter import Adapter
from vtc.config import EngineConfig
from vtc.metrics import TenantMetrics

TENANTS = 1_000
RUNNING = 256


def build(with_metrics: bool, running: int = RUNNING) -> tuple[Adapter, list, TenantMetrics | None]:
    metrics = TenantMetrics(CollectorRegistry(), interval=1.0) if with_metrics else None
    adapter = Adapter(
        vtc.Scheduler(M=10**9),
        EngineConfig(max_tenants=10 * TENANTS),
        observers=[metrics] if metrics else [],
    )
    for i in range(TENANTS):
        adapter.arrive(f"r{i}", None, [f"tenant-{i}"], 100)
        adapter.arrive(f"w{i}", None, [f"tenant-{i}"], 100)  # one stays waiting
    admitted = []
    while len(admitted) < running:
        t = adapter.requests.head()
        adapter.requests.admit(t, 0)
        admitted.append(t)
    adapter.step_done()
    return adapter, [(t, 1) for t in admitted], metrics


@pytest.mark.parametrize("metrics", ["off", "on"])
def test_adapter_step(benchmark, metrics):
    adapter, produced, _ = build(metrics == "on")

    def step() -> None:
        adapter.requests.charge(produced)
        adapter.step_done()

    benchmark.group = f"metrics-cost: adapter step, {TENANTS} tenants, {RUNNING} running"
    benchmark.pedantic(step, rounds=3000, iterations=1, warmup_rounds=50)


@pytest.mark.parametrize("where", ["registry", "directory"])
def test_refresh(benchmark, where, tmp_path, monkeypatch):
    if where == "directory":
        monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    else:
        monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    adapter, produced, metrics = build(True)
    adapter.requests.charge(produced)
    benchmark.group = f"metrics-cost: one refresh, {TENANTS} tenants"
    benchmark.pedantic(lambda: metrics.refresh(adapter), rounds=200, iterations=1, warmup_rounds=5)


@pytest.mark.parametrize("where", ["registry", "directory"])
def test_refresh_rotating(benchmark, where, tmp_path, monkeypatch):
    """One refresh per simulated second while the tenants served rotate: every
    tenant has a request running, each second 256 of them drawn at random get
    U[1, 384] tokens, so over the window the tenants are near-equal and the
    labelled set churns (extra_info: labels changed per refresh). The window slides:
    the simulated seconds follow the metrics' clock, which build()'s first refresh
    read."""
    if where == "directory":
        monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    else:
        monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    adapter, produced, metrics = build(True, running=TENANTS)
    assert metrics is not None
    rng = random.Random(1)
    clock = {"now": time.monotonic()}  # after build()'s refresh, on the metrics' clock
    changed: list[int] = []

    def second() -> tuple[tuple, dict]:
        batch = rng.sample(produced, RUNNING)
        adapter.requests.charge([(t, rng.randint(1, 384)) for t, _ in batch])
        clock["now"] += 1.0
        return (), {}

    def refresh() -> None:
        before = set(metrics._labelled)
        metrics.refresh(adapter, clock["now"])
        changed.append(len(metrics._labelled - before))

    for _ in range(40):  # past the first window (30 s)
        second()
        refresh()
    changed.clear()
    benchmark.group = f"metrics-cost: one refresh, {TENANTS} tenants rotating"
    benchmark.pedantic(refresh, setup=second, rounds=200, iterations=1)
    benchmark.extra_info["labels_changed_per_refresh"] = sum(changed) / len(changed)


def engine_like(where: str, tmp_path, monkeypatch):
    """A TenantMetrics (refreshed by hand) on an engine-like workload at 1,000 tenants,
    as in test_vllm_overhead.py's metrics sets: 2,000 requests of tenants drawn at
    random, 256 running, each step decodes one token of each running request, requests
    finish after U[32, 384] tokens and are replaced by new arrivals, 30 steps per
    simulated second (~310 tenants changed per refresh, a few labels changed).
    ``(adapter, metrics, second)``: ``second()`` runs a simulated second; 40 of them
    with a refresh after each have run (past the first window, 30 s)."""
    if where == "directory":
        monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    else:
        monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    rng = random.Random(1)
    clock = {"now": 0.0}
    metrics = TenantMetrics(CollectorRegistry(), interval=math.inf, clock=lambda: clock["now"])
    adapter = Adapter(
        vtc.Scheduler(M=10**9), EngineConfig(max_tenants=10 * TENANTS), observers=[metrics]
    )
    arrived = [0]

    def arrive() -> None:
        arrived[0] += 1
        tenant = f"tenant-{rng.randrange(TENANTS)}"
        adapter.arrive(f"q{arrived[0]}", None, [tenant], rng.randint(64, 512))

    running: list[list] = []

    def step() -> None:
        while len(running) < RUNNING:
            t = adapter.requests.head()
            adapter.requests.admit(t, 0)
            running.append([t, rng.randint(32, 384)])
        adapter.requests.charge([(t, 1) for t, _ in running])
        for entry in running:
            entry[1] -= 1
        for entry in [e for e in running if e[1] <= 0]:
            running.remove(entry)
            adapter.requests.release(entry[0].key, finished=True)
            arrive()
        adapter.step_done()

    def second() -> tuple[tuple, dict]:
        for _ in range(30):
            step()
        clock["now"] += 1.0
        return (), {}

    for _ in range(2 * TENANTS):
        arrive()
    for _ in range(40):  # past the first window (30 s)
        second()
        metrics.refresh(adapter)
    return adapter, metrics, second


@pytest.mark.parametrize("where", ["registry", "directory"])
def test_refresh_engine_like(benchmark, where, tmp_path, monkeypatch):
    """One refresh after a second of the engine-like workload (:func:`engine_like`).
    Run with ``--benchmark-timer=time.process_time`` on a loaded machine."""
    adapter, metrics, second = engine_like(where, tmp_path, monkeypatch)
    benchmark.group = f"metrics-cost: one refresh, {TENANTS} tenants engine-like"
    benchmark.pedantic(lambda: metrics.refresh(adapter), setup=second, rounds=60, iterations=1)


def test_pull_engine_like(benchmark, tmp_path, monkeypatch):
    """The part of that refresh that reads the core's changes into the metrics' mirror
    of every tenant and tallies them (``TenantMetrics._pull``: the core's
    ``MetricsMirror.read`` of ``Scheduler.changes``; ``MetricsMirror.take``: the
    labelled tenants' rows and increments and the sums of the rest, for the ~310
    tenants changed, with the labels of the refresh, as ``refresh`` does), alone: a
    change to it is lost in the noise of a whole refresh. The refresh after it is not
    timed (it keeps the labels moving). (Before the mirror moved to the core:
    ``_read`` and ``_tally``, Python over the changed tenants.)"""
    adapter, metrics, second = engine_like("registry", tmp_path, monkeypatch)

    def setup() -> tuple[tuple, dict]:
        metrics.refresh(adapter)
        return second()

    def pull() -> None:
        if hasattr(metrics, "_tally"):  # before the mirror moved to the core
            metrics._tally(*metrics._read(adapter.core), metrics._labelled)
            return
        labelled = metrics._labelled
        metrics._pull(adapter.core)
        metrics._mirror.take(list(labelled), labelled - metrics._rows.keys())

    benchmark.group = f"metrics-cost: a refresh's pull of the changes, {TENANTS} tenants"
    benchmark.pedantic(pull, setup=setup, rounds=200, iterations=1)
