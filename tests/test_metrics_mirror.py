"""vtc.metrics.TenantMetrics with its mirror in the core (``vtc._core.MetricsMirror``)
against the Python computation it replaced (``metrics_before.py``: vtc.metrics as it
was, its mirror, old-row look-ups and tallies in Python): two cores driven alike by
random workloads (int keys and names of the same digits, ``7`` and ``"7"``, a tenant
named ``_other``, forgets told to the observer and not, preemptions), one
TenantMetrics of each kind over each, limits under, at and over the tenants'
count; after every refresh both registries hold the same series with the same
values. And ``MetricsMirror``'s bad arguments."""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry

import metrics_before
import vtc
from vtc._core import MetricsMirror
from vtc.config import EngineConfig
from vtc.metrics import TenantMetrics


def samples(registry: CollectorRegistry) -> dict[tuple, float]:
    """Every sample but the counters' creation times, NaN as a string."""
    out: dict[tuple, float] = {}
    for family in registry.collect():
        for s in family.samples:
            if s.name.endswith("_created"):
                continue
            v = "nan" if isinstance(s.value, float) and math.isnan(s.value) else s.value
            out[(s.name, tuple(sorted(s.labels.items())))] = v
    return out


class Side:
    """A core, its view and a TenantMetrics of one kind over it."""

    def __init__(self, cls, max_tenants: int, window: float) -> None:
        self.registry = CollectorRegistry()
        self.metrics = cls(self.registry, interval=0.0, window=window, max_tenants=max_tenants)
        self.core = vtc.Scheduler(M=400)
        self.view = SimpleNamespace(
            core=self.core, tenancy=SimpleNamespace(weight=self.core.weight), config=EngineConfig()
        )


@pytest.mark.parametrize("seed", range(12))
def test_a_refresh_sets_what_the_python_computation_set(seed):
    rng = random.Random(seed)
    tenants: list[int | str] = [f"t{i}" for i in range(rng.randint(2, 14))]
    tenants += [7, "7", 8, "08", -3, "_other"]
    limit = [1, 3, len(tenants) - 1, len(tenants), len(tenants) + 4][seed % 5]
    window = [2.0, 10.0, math.inf][seed % 3]
    old = Side(metrics_before.TenantMetrics, limit, window)
    new = Side(TenantMetrics, limit, window)
    sides = (old, new)
    rid, now, refreshes = 0, 0.0, 0
    for _ in range(500):
        op = rng.random()
        if op < 0.3:
            rid += 1
            tenant, tokens = rng.choice(tenants), rng.randint(1, 30)
            for side in sides:
                side.core.submit(rid, tenant, tokens)
        elif op < 0.4:
            for side in sides:
                side.core.schedule()
        elif op < 0.6:
            running = sorted(old.core.running())
            if running:
                batch, k = rng.sample(running, rng.randint(1, len(running))), rng.randint(1, 9)
                for side in sides:
                    side.core.decode(batch, k)
        elif op < 0.7:
            running = sorted(old.core.running())
            if running:
                r = rng.choice(running)
                for side in sides:
                    side.core.finish(r)
        elif op < 0.75:
            tenant = SimpleNamespace(tenant=rng.choice(tenants))
            for side in sides:
                side.metrics.preempted(tenant)
        elif op < 0.82:
            told = rng.random() < 0.7  # as the adapter does; else the core alone
            for side in sides:
                before = set(side.core.counters())
                if told:
                    side.metrics.forgetting(side.core)
                side.core.forget_idle()
                if told:
                    side.metrics.forgot(sorted(before - set(side.core.counters()), key=repr))
        else:
            now += rng.choice([0.0, 0.5, 1.0, 3.0])
            for side in sides:
                side.metrics.refresh(side.view, now)
            refreshes += 1
            assert samples(new.registry) == samples(old.registry), (seed, refreshes)
            assert new.metrics._labelled == old.metrics._labelled
    assert refreshes > 10


def test_bad_arguments_raise_specific_errors():
    m = MetricsMirror()
    core = vtc.Scheduler(M=100)
    with pytest.raises(TypeError, match="scheduler"):
        m.read(object())
    with pytest.raises(vtc.InvalidArgumentError, match="reader"):
        m.read(core, 99)
    with pytest.raises(TypeError, match="reader"):
        m.read(core, "0")
    with pytest.raises(TypeError):
        m.take([1.5], [])
    with pytest.raises(TypeError):
        m.take(["a"], [None])
    with pytest.raises(TypeError):
        m.drop([b"a"], True)
    with pytest.raises(TypeError):
        m.drop(["a"], "yes")
    with pytest.raises(TypeError):
        _ = 1.5 in m
    assert m.read(core) is True and m.read(core) is False
    core.submit(1, "a", 10)
    core.submit(2, 7, 5)
    core.schedule()
    assert m.read(core, 0) is False
    assert sorted(m.keys(), key=repr) == ["a", 7] and len(m) == 2 and "a" in m and "7" not in m
    assert m.totals() == (2, 0, 2)
    assert m.take(["a", "a", "nobody"], ["nobody"]) == (
        [(0, core.counter("a"), 0, 1), (2, None, 0, 0)],
        [(0, 10, 0)],
        5,
        0,
        0,
        1,
        2,
    )
    assert m.take(["a"], []) == ([], [], 0, 0, 0, 1, 2)  # nothing changed since
    assert repr(m) == "MetricsMirror(tenants=2)"
