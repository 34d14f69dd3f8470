"""vtc.adapter.Tenancy: the tenant rule, weights, forgetting and the tenant cap
shared by the vLLM and SGLang shells, with a real core and no engine."""

from __future__ import annotations

import logging

import pytest

import vtc
from vtc.adapter import Tenancy
from vtc.config import EngineConfig


def make(**kw) -> tuple[vtc.Scheduler, Tenancy]:
    core = vtc.Scheduler(M=10_000)
    forget_every = kw.pop("forget_every", 1000)
    return core, Tenancy(core, EngineConfig(**kw), forget_every=forget_every)


def serve(core: vtc.Scheduler, rid: int, tenant: str) -> None:
    """One request of ``tenant`` from arrival to finish."""
    core.submit(rid, tenant, 10)
    assert core.pop() == rid
    core.finish(rid)


def test_weights_are_set_and_fields_name_tenants():
    core, t = make(weights={"gold": 2.0})
    assert core.weight("gold") == 2.0
    assert t.arrive(["acme", "ignored"]) == "acme"
    assert t.arrive([None, 7]) == "7"
    assert t.arrive([True, "", {"x": 1}]) == "default"  # malformed: absent
    assert t.arrive([]) == "default"
    assert t.num_tracked == 3  # gold, acme, 7 (the default tenant is not counted)


def test_the_cap_bounds_active_tenants_not_tenants_ever_seen(caplog):
    core, t = make(max_tenants=2)
    serve(core, 1, t.arrive(["b"]))  # b served, idle again
    assert t.arrive(["a"]) == "a"
    core.submit(2, "a", 10)
    assert core.pop() == 2  # a running: active (and b is no longer the last to leave)
    with caplog.at_level(logging.WARNING, logger="vtc"):
        # c is new with 2 tracked: b is idle and forgettable, so c takes its place
        assert t.arrive(["c"]) == "c"
        core.submit(3, "c", 10)
        assert t.arrive(["d"]) == "default"  # a and c active: d shares the default
        assert t.arrive(["e"]) == "default"
    warning = "VTC: 2 tenants active (VTC_MAX_TENANTS); new ones share tenant 'default'"
    assert [r.getMessage() for r in caplog.records] == [warning]  # logged once
    assert t.arrive(["a"]) == "a"  # a known tenant keeps its name
    assert "b" not in core.clients()


def test_idle_tenants_are_forgotten_every_forget_every_arrivals():
    core, t = make(forget_every=50)
    for i in range(200):
        tenant = t.arrive([f"one-off-{i}"])
        serve(core, i, tenant)
        assert core.num_clients <= 51  # swept every 50 arrivals
    assert t.num_tracked <= 51


def test_weighted_tenants_are_never_forgotten():
    core, t = make(weights={"gold": 3.0}, forget_every=1)
    serve(core, 1, t.arrive(["gold"]))
    for i in range(5):
        serve(core, 10 + i, t.arrive([f"x{i}"]))
    assert core.weight("gold") == 3.0 and "gold" in core.clients()


def test_forget_every_must_be_positive():
    with pytest.raises(ValueError, match="forget_every"):
        Tenancy(vtc.Scheduler(10), EngineConfig(), forget_every=0)


def test_counters_and_services_by_tenant_name():
    core, t = make()
    serve(core, 1, t.arrive([42]))
    assert t.services() == {"42": 10.0} and t.counters() == {"42": 10.0}
