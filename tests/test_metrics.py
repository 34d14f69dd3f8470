"""vtc.metrics.TenantMetrics: the per-tenant Prometheus series, driven through a
real adapter and core, read back from the registry, and each test again in
prometheus_client's multiprocess mode, read back from the directory the way the
engines' ``/metrics`` read it (``MultiProcessCollector``): there a removed series
must leave the directory too."""

from __future__ import annotations

import gc
import math
import os
import weakref
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

import vtc
from helpers import Clock, FairnessReference, remove_tree
from vtc.adapter import Adapter
from vtc.config import EngineConfig
from vtc.metrics import ENDED_KEPT_PER_LABEL, OTHER, TenantMetrics, jain_index


@pytest.fixture(autouse=True, params=["registry", "directory"])
def where(request, monkeypatch, tmp_path):
    """Where the series are read: the registry, or a multiprocess directory."""
    if request.param == "directory":
        directory = tmp_path / "prom"
        directory.mkdir()
        monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(directory))
        return directory
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    return None


def setup(M=10_000, weights=None, **kw):
    """An adapter with metrics, and the registry to read them from: in multiprocess
    mode one that collects the directory, as an engine's /metrics does."""
    registry = CollectorRegistry()
    clock = Clock()
    # labels chosen at every refresh unless a test says otherwise
    kw = {"interval": 0.0, "relabel_interval": 0.0, **kw}
    metrics = TenantMetrics(registry, clock=clock, **kw)
    core = vtc.Scheduler(M=M)
    adapter = Adapter(core, EngineConfig(weights=weights or {}), observers=[metrics])
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if directory:
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=directory)
    return adapter, metrics, registry, clock


def value(registry, name, **labels):
    return registry.get_sample_value(name, labels)


def admit_head(adapter, cached=0):
    t = adapter.requests.head()
    adapter.requests.admit(t, cached)
    return t


def test_jain_index():
    assert jain_index([3.0, 3.0, 3.0]) == pytest.approx(1.0)
    assert jain_index([1.0, 0.0]) == pytest.approx(0.5)
    assert jain_index([2.0, 1.0]) == pytest.approx(0.9)
    assert math.isnan(jain_index([])) and math.isnan(jain_index([0.0, 0.0]))


def test_tokens_by_kind_counters_requests_and_preemptions():
    adapter, _, registry, _ = setup()
    a = adapter.arrive("a1", None, ["acme"], 100)
    adapter.arrive("b1", None, ["beta"], 10)
    adapter.arrive("b2", None, ["beta"], 10)
    assert admit_head(adapter, cached=30) is a  # 70 prompt tokens charged
    adapter.requests.charge([(a, 5)])
    adapter.step_done()
    assert value(registry, "vtc_tenant_service_tokens_total", tenant="acme", kind="prompt") == 70
    assert value(registry, "vtc_tenant_service_tokens_total", tenant="acme", kind="decode") == 5
    assert value(registry, "vtc_tenant_counter", tenant="acme") == adapter.core.counter("acme")
    assert value(registry, "vtc_tenant_requests", tenant="acme", state="running") == 1
    assert value(registry, "vtc_tenant_requests", tenant="beta", state="waiting") == 2
    assert value(registry, "vtc_tenants_active") == 2
    adapter.requests.put_back(a)  # preempted
    adapter.requests.release("a1")
    adapter.step_done()
    assert value(registry, "vtc_tenant_preemptions_total", tenant="acme") == 1
    assert value(registry, "vtc_tenant_requests", tenant="acme", state="waiting") == 0
    assert value(registry, "vtc_tenants_active") == 1


def test_gauges_refresh_at_the_interval_and_counters_lose_nothing_in_between():
    adapter, _, registry, clock = setup(interval=1.0)
    a = adapter.arrive("a1", None, ["acme"], 10)
    admit_head(adapter)
    adapter.step_done()  # the first step refreshes
    for _ in range(5):
        clock.now += 0.1
        adapter.requests.charge([(a, 2)])
        adapter.step_done()
    assert value(registry, "vtc_tenant_service_tokens_total", tenant="acme", kind="decode") is None
    clock.now += 0.5
    adapter.step_done()
    assert value(registry, "vtc_tenant_service_tokens_total", tenant="acme", kind="decode") == 10
    clock.now += 0.1
    adapter.requests.charge([(a, 3)])
    adapter.requests.release("a1", finished=True)
    adapter.step_done()  # the engine went idle: no later step would carry these 3
    assert value(registry, "vtc_tenant_service_tokens_total", tenant="acme", kind="decode") == 13
    assert value(registry, "vtc_tenant_requests", tenant="acme", state="running") == 0


def test_cardinality_is_bounded_and_the_rest_is_summed_under_other():
    adapter, _, registry, clock = setup(max_tenants=2)
    for i, tenant in enumerate("abcd"):
        adapter.arrive(f"{tenant}1", None, [tenant], 10 * (i + 1))
    while adapter.requests.head() is not None:
        t = admit_head(adapter)
        adapter.requests.charge([(t, 1)])
    clock.now += 1.0
    adapter.step_done()
    exposed = generate_latest(registry).decode()
    labels = {
        line.split('tenant="')[1].split('"')[0]
        for line in exposed.splitlines()
        if line.startswith("vtc_tenant_service_tokens_total{")
    }
    assert labels == {"d", "c", OTHER}  # the two most served, and the rest
    prompt = [
        value(registry, "vtc_tenant_service_tokens_total", tenant=t, kind="prompt")
        for t in ("c", "d", OTHER)
    ]
    assert prompt == [30, 40, 10 + 20]  # nothing lost: the sum is every token charged
    assert value(registry, "vtc_tenant_requests", tenant=OTHER, state="running") == 2
    assert value(registry, "vtc_tenant_counter", tenant=OTHER) is None  # a sum means nothing


def labelled(registry) -> set[str]:
    """The tenants with a series of their own."""
    return {
        labels["tenant"]
        for family in registry.collect()
        for _, labels, *_ in family.samples
        if labels.get("tenant", OTHER) != OTHER
    }


def decode_tokens(registry) -> dict[str, float]:
    return {
        labels["tenant"]: v
        for family in registry.collect()
        for name, labels, v, *_ in family.samples
        if name == "vtc_tenant_service_tokens_total" and labels["kind"] == "decode"
    }


def increase(registry, before: dict[str, float]) -> float:
    """What the decode token counters grew by since ``before`` (updated): a series
    that ends takes its total with it, a new one starts from 0."""
    after = decode_tokens(registry)
    grown = sum(v - before.get(t, 0.0) for t, v in after.items())
    before.clear()
    before.update(after)
    return grown


def serve(adapter, names):
    """One running request per tenant of ``names``, by tenant."""
    running = {}
    for name in names:
        t = adapter.arrive(f"{name}-r", None, [name], 1)
        adapter.requests.admit(t, 0)
        running[name] = t
    return running


class Seconds:
    """``second(tokens)``: charge each tenant's running request its ``tokens``, move
    the clock a second and end a step (a refresh); every token charged is counted
    once, on its tenant's series or _other's."""

    def __init__(self, adapter, running, registry, clock):
        self.adapter, self.running, self.registry, self.clock = adapter, running, registry, clock
        self.totals: dict[str, float] = {}

    def __call__(self, tokens: dict[str, int]) -> None:
        self.adapter.requests.charge([(self.running[n], k) for n, k in tokens.items()])
        self.clock.now += 1.0
        self.adapter.step_done()
        assert increase(self.registry, self.totals) == sum(tokens.values())


def test_near_equal_tenants_keep_their_labels_and_nothing_is_lost():
    import random

    rng = random.Random(7)
    adapter, _, registry, clock = setup(M=10**9, max_tenants=10, window=10.0)
    names = [f"t{i:02}" for i in range(40)]
    running = serve(adapter, names)
    changes, previous, totals = [], None, {}
    for _ in range(40):  # near-ties: each second's ranking is a new draw
        produced = [(running[n], rng.randint(95, 105)) for n in names]
        adapter.requests.charge(produced)
        clock.now += 1.0
        adapter.step_done()
        now = labelled(registry)
        assert len(now) == 10  # never more than max_tenants
        if previous is not None:
            changes.append(len(now - previous))
        previous = now
        assert increase(registry, totals) == sum(n for _, n in produced)  # labelled + _other
    assert sum(changes) == 0, changes


def test_a_tenant_that_leaves_the_top_for_good_loses_its_label():
    adapter, _, registry, clock = setup(M=10**9, max_tenants=2, window=10.0)
    second = Seconds(adapter, serve(adapter, ["a", "b", "c"]), registry, clock)
    second({"a": 100, "b": 100, "c": 10})
    assert labelled(registry) == {"a", "b"}
    for _ in range(30):  # c is served a little more than a: no swap
        second({"a": 100, "b": 100, "c": 110})
        assert labelled(registry) == {"a", "b"}
    for _ in range(30):  # a is no longer served: once the window forgets it, c takes over
        second({"b": 100, "c": 100})
        assert len(labelled(registry)) == 2
    assert labelled(registry) == {"b", "c"}


def test_at_a_swap_the_interval_goes_to_the_new_label_and_the_old_one_to_other():
    """The refresh at which c takes a's label puts c's tokens since the last refresh
    on c's own counter and a's on _other's: the tallies are split by the labels of
    this refresh, not the last one's (the pull sums unlabelled tenants' increments
    straight into _other, after the relabelling)."""
    adapter, _, registry, clock = setup(M=10**9, max_tenants=2, window=10.0)
    second = Seconds(adapter, serve(adapter, ["a", "b", "c"]), registry, clock)
    second({"a": 100, "b": 100, "c": 10})
    assert decode_tokens(registry) == {"a": 100, "b": 100, OTHER: 10}
    second({"a": 1, "b": 100, "c": 1000})
    assert labelled(registry) == {"b", "c"}
    assert decode_tokens(registry) == {"b": 200, "c": 1000, OTHER: 11}


def test_labels_are_chosen_at_most_every_relabel_interval_and_nothing_is_lost():
    """With every label taken, a tenant served far more than a labelled one waits for
    the next choice of labels, ``relabel_interval`` seconds after the last: its
    tokens go to _other until then, and to its own series after."""
    adapter, metrics, registry, clock = setup(
        M=10**9, max_tenants=2, window=10.0, relabel_interval=10.0
    )
    assert metrics.relabel_interval == 10.0
    second = Seconds(adapter, serve(adapter, ["a", "b", "c"]), registry, clock)
    second({"a": 100, "b": 100, "c": 10})  # t = 1: the first choice
    assert labelled(registry) == {"a", "b"}
    for _ in range(9):  # t = 2 .. 10: c served ten times as much as a, still unlabelled
        second({"a": 10, "b": 100, "c": 1000})
        assert labelled(registry) == {"a", "b"}
    assert decode_tokens(registry)[OTHER] == 10 + 9 * 1000
    second({"a": 10, "b": 100, "c": 1000})  # t = 11: the next choice
    assert labelled(registry) == {"b", "c"}
    assert decode_tokens(registry)["c"] == 1000  # since this refresh's choice


def test_relabel_interval_must_not_be_negative():
    with pytest.raises(ValueError, match="relabel_interval must be >= 0, got -1"):
        TenantMetrics(CollectorRegistry(), relabel_interval=-1.0)


@pytest.mark.parametrize("seed", range(5))
def test_no_tenant_without_a_label_was_served_twice_as_much_as_one_with_it(seed):
    import random

    rng = random.Random(seed)
    adapter, _, registry, clock = setup(M=10**9, max_tenants=5, window=1e6)
    names = [f"t{i:02}" for i in range(30)]
    running = serve(adapter, names)
    adapter.step_done()  # the window's start: every later refresh looks back to it
    start = adapter.core.services()
    for _ in range(30):  # a few tenants served much more than the rest, a new few each time
        hot = set(rng.sample(names, 3))
        tokens = [(running[n], rng.randint(1, 50 if n in hot else 5)) for n in names]
        adapter.requests.charge(tokens)
        clock.now += 1.0
        adapter.step_done()
        served = {t: s - start[t] for t, s in adapter.core.services().items()}
        have = labelled(registry)
        assert len(have) == 5
        assert max(served[t] for t in names if t not in have) <= 2 * min(served[t] for t in have)


@pytest.mark.parametrize("relabel_interval", [0.0, 10.0])
def test_a_tenant_labelled_while_idle_has_every_series_at_once(relabel_interval):
    # (with labels chosen every 10 s, the label a forgotten tenant frees is given at
    # the next refresh: the clock never moves here)
    adapter, _, registry, _ = setup(
        max_tenants=1, weights={"idle": 2.0}, relabel_interval=relabel_interval
    )
    adapter.arrive("x1", None, ["x"], 100)
    admit_head(adapter)
    adapter.arrive("i1", None, ["idle"], 10)  # a weight of its own: never forgotten
    admit_head(adapter)
    adapter.requests.release("x1", finished=True)
    adapter.requests.release("i1", finished=True)
    adapter.step_done()
    assert labelled(registry) == {"x"}  # the most served
    adapter.arrive("z1", None, ["z"], 1)
    admit_head(adapter, cached=1)  # z's counter passes x's (x can be forgotten); no token
    assert adapter.tenancy.forget_idle() == 1
    adapter.step_done()  # the free label: to idle (a tie at 0 since, by name), no token
    assert labelled(registry) == {"idle"}
    assert value(registry, "vtc_tenant_counter", tenant="idle") == adapter.core.counter("idle")
    assert value(registry, "vtc_tenant_weight", tenant="idle") == 2.0
    for state in ("waiting", "running"):
        assert value(registry, "vtc_tenant_requests", tenant="idle", state=state) == 0


def test_forgotten_tenants_leave_no_series():
    adapter, _, registry, _ = setup()
    adapter.arrive("a1", None, ["gone"], 10)
    admit_head(adapter)
    adapter.step_done()
    assert value(registry, "vtc_tenant_counter", tenant="gone") is not None
    adapter.requests.release("a1", finished=True)
    adapter.arrive("b1", None, ["stays"], 10)
    admit_head(adapter)  # its counter passes gone's: gone can change no decision
    assert adapter.tenancy.forget_idle() == 1
    adapter.step_done()
    exposed = generate_latest(registry).decode()
    assert 'tenant="gone"' not in exposed and 'tenant="stays"' in exposed


def test_a_tenant_forgotten_and_back_goes_on_from_its_series_total():
    """A tenant forgotten (its series removed) and back before a scrape with more
    tokens than it had: its series goes on from its old total, so a scrape sees it grow
    by what it was served since (from 0, Prometheus would read no reset and undercount
    by the whole old total). Its preemptions' counter too."""
    adapter, _, registry, _ = setup()
    prompt = {"tenant": "back", "kind": "prompt"}
    t = adapter.arrive("a1", None, ["back"], 10)
    admit_head(adapter)
    adapter.requests.put_back(t)  # preempted, admitted again
    admit_head(adapter)
    adapter.step_done()
    total = value(registry, "vtc_tenant_service_tokens_total", **prompt)
    assert total is not None and 0 < total < 30
    assert value(registry, "vtc_tenant_preemptions_total", tenant="back") == 1
    adapter.requests.release("a1", finished=True)
    adapter.arrive("b1", None, ["stays"], 10)
    admit_head(adapter)
    assert adapter.tenancy.forget_idle() == 1
    adapter.step_done()
    assert value(registry, "vtc_tenant_service_tokens_total", **prompt) is None  # ended
    adapter.arrive("a2", None, ["back"], 30)  # back, with more than its old total
    admit_head(adapter)
    adapter.step_done()
    assert value(registry, "vtc_tenant_service_tokens_total", **prompt) == total + 30
    # a counter series is made when it has something to count: preempted again
    assert value(registry, "vtc_tenant_preemptions_total", tenant="back") is None
    adapter.requests.put_back(adapter.requests.get("a2"))
    adapter.step_done()
    assert value(registry, "vtc_tenant_preemptions_total", tenant="back") == 1 + 1


def test_a_tenant_that_gets_its_label_back_goes_on_from_its_series_total():
    """A label swap ends a series; the tenant labelled again later goes on from that
    series' total (what it was served meanwhile went to _other)."""
    adapter, _, registry, _ = setup(max_tenants=1)
    tokens = decode_tokens
    for name in ("a", "b"):
        adapter.arrive(f"{name}1", None, [name], 1)
    a, b = admit_head(adapter), admit_head(adapter)
    adapter.requests.charge([(a, 50)])
    adapter.step_done()
    assert labelled(registry) == {a.tenant}
    first = tokens(registry)[a.tenant]
    clock_gap = 0
    while labelled(registry) != {b.tenant}:  # b served far more: it takes the label
        adapter.requests.charge([(b, 200)])
        adapter.step_done()
        clock_gap += 1
        assert clock_gap < 100
    adapter.requests.charge([(a, 7)])  # a, unlabelled: under _other
    while labelled(registry) != {a.tenant}:
        adapter.requests.charge([(a, 1000)])
        adapter.step_done()
    assert tokens(registry)[a.tenant] >= first + 1000  # went on from its total


def test_only_the_latest_ended_series_totals_are_kept():
    """The totals of the last ENDED_KEPT_PER_LABEL x max_tenants ended series are kept;
    a tenant whose series ended before those starts again from 0."""
    adapter, metrics, registry, _ = setup(max_tenants=1, M=10**9)
    kept = ENDED_KEPT_PER_LABEL * 1
    names = [f"t{i}" for i in range(kept)]
    for i, name in enumerate(names):  # each served 3x the last: it takes the one label
        t = adapter.arrive(f"{name}-1", None, [name], 1)
        admit_head(adapter)
        adapter.requests.charge([(t, 3 ** (i + 1))])
        adapter.step_done()
        assert labelled(registry) == {name}
    # kept - 1 tenants lost the label, each leaving 2 series (prompt and decode): the
    # first ones' totals dropped
    assert len(metrics._ended) == kept and {key[1] for key in metrics._ended} == set(
        names[-1 - kept // 2 : -1]
    )
    for name, served in ((names[0], 3 ** (kept + 2)), (names[-2], 3 ** (kept + 4))):
        before = decode_tokens(registry).get(name)
        assert before is None  # no series now
        t = adapter.requests.get(f"{name}-1")
        adapter.requests.charge([(t, served)])
        adapter.step_done()
        assert labelled(registry) == {name}
        on_from = 0 if name == names[0] else 3 ** (len(names) - 1)  # names[-2]'s old total
        assert decode_tokens(registry)[name] == on_from + served, name


def test_names_are_label_values_as_they_are():
    adapter, _, registry, _ = setup()
    name = 'a"b\nc,d=e}'
    adapter.arrive("r", None, [name], 10)
    adapter.step_done()
    assert value(registry, "vtc_tenant_requests", tenant=name, state="waiting") == 1


def test_jain_index_spread_and_bound_of_backlogged_tenants_under_vtc():
    M = 400
    adapter, _, registry, clock = setup(M=M, budget=M, window=10.0, weights={"gold": 2.0})
    for tenant in ("gold", "free"):
        for i in range(200):
            adapter.arrive(f"{tenant}{i}", None, [tenant], 20)
    for _ in range(60):  # VTC admits by counter; every running request decodes
        while (t := adapter.requests.head()) is not None and adapter.core.occupancy + 40 <= M:
            adapter.requests.admit(t, 0)
        running = [t for t in adapter.requests if adapter.requests.status(t) == "running"]
        adapter.requests.charge([(t, 2) for t in running])
        for t in running[:2]:
            adapter.requests.release(t.key, finished=True)
        clock.now += 0.5
        adapter.step_done()
    jain = value(registry, "vtc_fairness_jain_index")
    assert 0.95 <= jain <= 1.0  # 2:1 service for 2:1 weights is fair
    spread, bound = value(registry, "vtc_counter_spread"), value(registry, "vtc_fairness_bound")
    assert bound == 2 * max(1.0 * 20, 2.0 * M)
    assert 0.0 <= spread <= bound


def test_a_starved_tenant_drags_jain_down_and_an_unknown_budget_is_nan():
    adapter, _, registry, clock = setup()
    for tenant in ("a", "b"):
        adapter.arrive(f"{tenant}1", None, [tenant], 10)
    adapter.step_done()
    t = admit_head(adapter)  # one tenant served, the other still waits
    adapter.arrive(f"{t.tenant}2", None, [t.tenant], 10)
    clock.now += 1.0
    adapter.requests.charge([(t, 50)])
    adapter.step_done()
    assert value(registry, "vtc_fairness_jain_index") == pytest.approx(0.5)
    assert math.isnan(value(registry, "vtc_fairness_bound"))


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="max_tenants"):
        TenantMetrics(CollectorRegistry(), max_tenants=0)
    with pytest.raises(ValueError, match="window"):
        TenantMetrics(CollectorRegistry(), window=0.0)


# -- Adapter.enable_metrics: the VTC_METRICS modes ---------------------------------


@pytest.mark.parametrize(
    "mode, served, on", [("off", True, False), ("auto", False, False), ("auto", True, True)]
)
def test_metrics_follow_the_mode_and_whether_the_engine_serves_them(mode, served, on):
    adapter = Adapter(vtc.Scheduler(M=100), EngineConfig(metrics=mode))
    metrics = adapter.enable_metrics(served=served, budget=100, registry=CollectorRegistry())
    assert (metrics is not None) == on and (metrics in adapter.observers) == on
    assert adapter.enable_metrics(served=True, budget=100) is metrics  # decided once


def test_metrics_on_but_not_served_are_kept_and_the_hint_logged(caplog):
    config = EngineConfig(metrics="on", metrics_max_tenants=3, metrics_interval=0.0)
    adapter = Adapter(vtc.Scheduler(M=100), config)
    registry = CollectorRegistry()
    metrics = adapter.enable_metrics(served=False, budget=100, hint="do X", registry=registry)
    assert (metrics.max_tenants, metrics.interval, metrics.budget) == (3, 0.0, 100)
    assert "the engine does not serve them: do X" in caplog.text
    adapter.arrive("r", None, ["a"], 10)
    adapter.step_done()
    assert value(registry, "vtc_tenant_requests", tenant="a", state="waiting") == 1


def test_metrics_on_without_prometheus_client_is_a_config_error(monkeypatch):
    import sys

    from vtc.config import ConfigError

    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    monkeypatch.delitem(sys.modules, "vtc.metrics")
    with pytest.raises(ConfigError, match="VTC_METRICS needs prometheus_client"):
        Adapter(vtc.Scheduler(M=100), EngineConfig(metrics="on"))
    adapter = Adapter(vtc.Scheduler(M=100), EngineConfig(metrics="auto"))
    assert adapter.enable_metrics(served=True, budget=None) is None  # auto: quietly off


def test_a_new_engine_in_the_process_reuses_the_families_and_clears_their_series():
    registry = CollectorRegistry()
    first = TenantMetrics(registry, interval=0.0)
    adapter = Adapter(vtc.Scheduler(M=100), EngineConfig(), observers=[first])
    adapter.arrive("r", None, ["a"], 10)
    adapter.step_done()
    assert value(registry, "vtc_tenant_requests", tenant="a", state="waiting") == 1
    second = TenantMetrics(registry)  # registering the same names again would raise
    assert second.requests is first.requests
    assert value(registry, "vtc_tenant_requests", tenant="a", state="waiting") is None


def test_a_registry_let_go_takes_its_families_and_files_with_it(where):
    """The families of a registry (and in a multiprocess directory vtc's open files)
    live as long as the registry: an engine or a test that makes registries and lets
    them go does not pile up open files (a state machine of 1,500 examples ran out of
    file descriptors when every registry was held for the process's life)."""
    registry = CollectorRegistry()
    metrics = TenantMetrics(registry, interval=0.0)
    adapter = Adapter(vtc.Scheduler(M=100), EngineConfig(), observers=[metrics])
    adapter.arrive("r", None, ["a"], 10)
    adapter.step_done()
    families = weakref.ref(metrics._families)
    files = metrics._families.files
    assert (files is None) == (where is None)
    files = None if files is None else weakref.ref(files)
    del registry, metrics, adapter
    gc.collect()
    assert families() is None
    assert files is None or files() is None


class _Unhashable(CollectorRegistry):
    """A registry that cannot be a weak dict's key."""

    __hash__ = None  # type: ignore[assignment]

    def __eq__(self, other):
        return self is other


def test_a_registry_that_cannot_be_weakly_keyed_still_has_one_set_of_families():
    registry = _Unhashable()
    first = TenantMetrics(registry, interval=0.0)
    second = TenantMetrics(registry)  # registering the same names again would raise
    assert second.requests is first.requests


def test_tokens_come_from_the_core_and_survive_a_forget_between_refreshes():
    adapter, metrics, registry, clock = setup(interval=3600.0)
    assert not adapter.observers.wants("charged")  # no per-charge work for metrics
    a = adapter.arrive("a1", None, ["gone"], 10)
    adapter.requests.admit(a, 0)
    adapter.step_done()  # the first refresh
    adapter.requests.charge([(a, 4)])
    adapter.requests.release("a1", finished=True)
    b = adapter.arrive("b1", None, ["stays"], 10)
    adapter.requests.admit(b, 0)  # passes gone's counter: gone can be forgotten
    assert adapter.tenancy.forget_idle() == 1  # before any refresh saw gone's 4 tokens
    clock.now += 3600.0
    adapter.step_done()
    decode = {
        labels["tenant"]: v
        for family in registry.collect()
        for name, labels, v, *_ in family.samples
        if name == "vtc_tenant_service_tokens_total" and labels["kind"] == "decode"
    }
    assert "gone" not in decode and decode[OTHER] == 4  # nothing lost
    prompt = value(registry, "vtc_tenant_service_tokens_total", tenant="stays", kind="prompt")
    assert prompt == 10


def test_a_refresh_reads_and_sets_only_the_tenants_that_changed():
    """A refresh reads the core's changes (Scheduler.changes), not every tenant: its
    per-tenant work (here the weight look-ups of the labelled tenants' gauges) is
    for the tenants that changed, and its mirror stays the core's full read, through
    forgetting, a forgotten tenant's return and a new core."""
    adapter, metrics, registry, clock = setup(max_tenants=10)
    for i in range(40):
        adapter.arrive(f"r{i}", None, [f"t{i}"], 10)
    running = {}
    for _ in range(40):
        t = admit_head(adapter)
        running[t.tenant] = t
    adapter.step_done()
    looked_up: list[str] = []
    weight = adapter.tenancy.weight

    def counting(tenant: str) -> float:
        looked_up.append(tenant)
        return weight(tenant)

    adapter.tenancy.weight = counting  # type: ignore[method-assign]
    clock.now += 1.0
    adapter.step_done()
    assert looked_up == []  # nothing changed
    labelled = sorted(metrics._labelled)
    adapter.requests.charge([(running[labelled[0]], 3)])
    clock.now += 1.0
    adapter.step_done()
    assert looked_up == [labelled[0]]
    decode = value(registry, "vtc_tenant_service_tokens_total", tenant=labelled[0], kind="decode")
    assert decode == 3

    def mirrored() -> None:
        core = adapter.core
        assert _mirrored(metrics, 0) == core.counters()
        assert _mirrored(metrics, 1) == core.services()
        assert _mirrored_active(metrics) == core.active_clients()

    mirrored()
    for t in running.values():
        adapter.requests.release(t.key, finished=True)
    adapter.step_done()
    assert adapter.tenancy.forget_idle() > 0
    forgotten = sorted(running.keys() - adapter.core.counters().keys())
    assert forgotten and set(metrics._mirror.keys()).isdisjoint(forgotten)
    adapter.arrive("back", None, [forgotten[0]], 10)  # forgotten, and back
    clock.now += 1.0
    adapter.step_done()
    mirrored()


def _mirrored(metrics, field):
    """One field of every tenant's mirror row (0: counter, 1: service)."""
    return {tenant: row[field] for tenant, row in metrics._mirror.rows().items()}


def _mirrored_active(metrics):
    """The mirror's (waiting, running) of the tenants with requests, as
    ``Scheduler.active_clients()`` gives them."""
    return {t: (row[4], row[5]) for t, row in metrics._mirror.rows().items() if row[4] or row[5]}


def _series_totals(registry, name, key):
    totals: dict[str, float] = {}
    for family in registry.collect():
        for sample in family.samples:
            if sample.name == name:
                label = sample.labels[key] if key else sample.labels["tenant"]
                totals[label] = totals.get(label, 0.0) + sample.value
    return totals


@pytest.mark.parametrize("seed", range(4))
def test_the_mirror_pulled_by_changes_is_the_cores_full_read(seed, monkeypatch):
    """Differential: random arrivals, admissions, charges, finishes, preemptions and
    forgets, a refresh after a random few; after each the mirror (pulled
    incrementally, by C passes over the changed tenants) equals the core's full read,
    and the token series add up to every token charged (none lost, none twice; the
    series of a tenant forgotten or unlabelled leave with what they showed, and a
    series made again goes on from it: every ended total kept here); the
    spread and Jain's index gauges (from the core's FairnessWindow) are what the
    Python computation they replace gives (``helpers.FairnessReference``)."""
    import random

    rng = random.Random(seed)
    monkeypatch.setattr(vtc.metrics, "ENDED_KEPT_PER_LABEL", 10**6)  # none dropped
    adapter, metrics, registry, clock = setup(M=2_000, max_tenants=5)
    core = adapter.core
    reference = FairnessReference(metrics.window)
    charged = {"prompt": 0, "decode": 0}
    live: list = []
    n = 0
    # (tenant, kind) -> what a series removed (its tenant forgotten or unlabelled)
    # showed, until it is made again (then it goes on from that)
    ended: dict[tuple[str, str], float] = {}

    def by_series() -> dict[tuple[str, str], float]:
        return {
            (sample.labels["tenant"], sample.labels["kind"]): sample.value
            for family in registry.collect()
            for sample in family.samples
            if sample.name == "vtc_tenant_service_tokens_total"
        }

    def removing(call) -> None:
        """Call ``call``; keep what the series it removed showed, drop what the
        series it made again took over."""
        shown = by_series()
        call()
        now = by_series()
        for key in shown.keys() - now.keys():
            ended[key] = shown[key]
        for key in now.keys() - shown.keys():
            ended.pop(key, None)

    for _ in range(300):
        op = rng.random()
        if op < 0.3:
            n += 1
            adapter.arrive(f"r{n}", None, [f"t{rng.randrange(20)}"], rng.randint(1, 30))
        elif op < 0.5:
            t = adapter.requests.head()
            if t is not None and core.occupancy + t.prompt_len <= core.M:
                cached = rng.randint(0, t.prompt_len - 1)
                first = t.admissions == 0  # a preempted request's prompt: not again
                adapter.requests.admit(t, cached)
                charged["prompt"] += t.prompt_len - cached if first else 0
                live.append(t)
        elif op < 0.7 and live:
            batch = rng.sample(live, rng.randint(1, len(live)))
            tokens = [(t, rng.randint(1, 5)) for t in batch]
            adapter.requests.charge(tokens)
            charged["decode"] += sum(k for _, k in tokens)
        elif op < 0.8 and live:
            t = live.pop(rng.randrange(len(live)))
            adapter.requests.release(t.key, finished=True)
        elif op < 0.85 and live:
            t = live.pop(rng.randrange(len(live)))
            adapter.requests.put_back(t)  # preempted: waits again
        elif op < 0.9:
            removing(adapter.tenancy.forget_idle)
        if rng.random() < 0.3:
            clock.now += rng.random()
            removing(adapter.step_done)
            assert _mirrored(metrics, 0) == core.counters()
            assert _mirrored(metrics, 1) == core.services()
            assert _mirrored_active(metrics) == core.active_clients()
            jain, spread, _ = reference.refresh(core, clock.now)  # the Python computation
            assert value(registry, "vtc_counter_spread") == spread
            if jain is not None:
                assert value(registry, "vtc_fairness_jain_index") == pytest.approx(
                    jain, rel=1e-12, nan_ok=True
                )
            assert {t: row[2:4] for t, row in metrics._mirror.rows().items()} == core.tokens()
            n_active, waiting, running = metrics._mirror.totals()
            assert n_active == metrics._n_active == len(core.active_clients())
            assert value(registry, "vtc_tenants_active") == len(core.active_clients())
            assert waiting == sum(w for w, _ in core.active_clients().values())
            assert running == sum(r for _, r in core.active_clients().values())
            tokens = _series_totals(registry, "vtc_tenant_service_tokens_total", "kind")
            assert sum(tokens.values()) + sum(ended.values()) == (
                charged["prompt"] + charged["decode"]
            )


# registry mode only: in one process, a second registry's families would write the
# multiprocess directory's files the first one writes (what the test reads is the
# reader slot, which both modes share)
@pytest.mark.parametrize("where", ["registry"], indirect=True)
def test_two_tenant_metrics_on_one_core_each_stay_right():
    """Two TenantMetrics on one core share its reader slot (CHANGES_READER): each
    that pulls after the other starts the slot again (a full read), so neither
    misses the changes the other read."""
    adapter, first, registry, clock = setup()
    second_registry = CollectorRegistry()
    second = TenantMetrics(second_registry, clock=clock, interval=0.0)
    a = adapter.arrive("a1", None, ["acme"], 10)
    adapter.arrive("b1", None, ["beta"], 10)
    admit_head(adapter)
    for step in range(4):
        adapter.requests.charge([(a, 2)])
        clock.now += 1.0
        (first if step % 2 else second).refresh(adapter)
        (second if step % 2 else first).refresh(adapter)
        for metrics, reg in ((first, registry), (second, second_registry)):
            assert _mirrored(metrics, 0) == adapter.core.counters()
            assert _mirrored_active(metrics) == adapter.core.active_clients()
            decode = value(reg, "vtc_tenant_service_tokens_total", tenant="acme", kind="decode")
            assert decode == 2 * (step + 1)


@pytest.mark.parametrize("where", ["registry"], indirect=True)
def test_the_reader_table_keeps_one_entry_per_live_puller():
    """``vtc.metrics._READERS`` (id(core) -> the TenantMetrics that last pulled it)
    drops an entry when that TenantMetrics is collected or moves to another core,
    so engines made and dropped in one process leave nothing behind."""
    import gc

    from vtc import metrics as module

    adapter, first, _, clock = setup()
    other, _, _, _ = setup()
    clock.now += 1.0
    first.refresh(adapter)
    assert module._READERS[id(adapter.core)]() is first
    first.refresh(other)  # moves to another core: the first core's entry goes
    assert id(adapter.core) not in module._READERS
    assert module._READERS[id(other.core)]() is first
    key = id(other.core)
    del first, adapter  # the adapter observes through it
    gc.collect()
    assert key not in module._READERS


# -- a core used directly: its tenants are its keys, int keys among them ----------------


def core_setup(**kw):
    """TenantMetrics over a ``vtc.Scheduler`` used directly (no adapter, whose tenants
    are names): the view a refresh reads, and the registry to read the series from."""
    registry = CollectorRegistry()
    metrics = TenantMetrics(
        registry, **{"interval": 0.0, "relabel_interval": 0.0, "window": 8.0, **kw}
    )
    core = vtc.Scheduler(M=100_000)
    view = SimpleNamespace(
        core=core, tenancy=SimpleNamespace(weight=core.weight), config=EngineConfig()
    )
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if directory:
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=directory)
    return core, metrics, view, registry


def running_and_waiting(core, keys, rids):
    """One running and one waiting request per tenant of ``keys``; returns the
    running ones' ids by tenant."""
    running = {}
    for k in keys:
        rid = next(rids)
        core.submit(rid, k, 10)
        running[k] = rid
    assert sorted(core.schedule()) == sorted(running.values())
    for k in keys:
        core.submit(next(rids), k, 10)
    return running


def serve_tokens(core, running, tokens):
    """Charge ``tokens[k]`` generated tokens to tenant ``k``'s running request."""
    keys = [k for k in tokens if tokens[k]]
    core.decode([running[k] for k in keys], [tokens[k] for k in keys])


def assert_series_of(registry, core, label, key, tokens=True):
    """The series labelled ``label`` are tenant ``key``'s, as the core has them."""
    waiting, running = core.active_clients().get(key, (0, 0))
    assert value(registry, "vtc_tenant_counter", tenant=label) == core.counter(key)
    assert value(registry, "vtc_tenant_weight", tenant=label) == core.weight(key)
    assert value(registry, "vtc_tenant_requests", tenant=label, state="waiting") == waiting
    assert value(registry, "vtc_tenant_requests", tenant=label, state="running") == running
    if tokens:  # (a tenant labelled since its first charge)
        prompt, decode = core.tokens()[key]
        assert (
            value(registry, "vtc_tenant_service_tokens_total", tenant=label, kind="prompt")
            == prompt
        )
        assert (
            value(registry, "vtc_tenant_service_tokens_total", tenant=label, kind="decode")
            == decode
        )


def token_totals(registry, kind):
    """Every ``vtc_tenant_service_tokens_total`` of ``kind``, by tenant label."""
    return {
        labels["tenant"]: v
        for family in registry.collect()
        for name, labels, v, *_ in family.samples
        if name == "vtc_tenant_service_tokens_total" and labels["kind"] == kind
    }


def test_int_keyed_tenants_are_labelled_by_their_gains_over_the_window():
    # The labels follow the tenants' gains over the window (FairnessWindow.gains by
    # key): int keys were looked up as names, every gain NaN, and the labels stuck.
    core, metrics, view, registry = core_setup(max_tenants=2)
    rids = iter(range(1, 1_000))
    running = running_and_waiting(core, [0, 1, 2, 3], rids)
    serve_tokens(core, running, {0: 50, 1: 40, 2: 1, 3: 1})
    metrics.refresh(view, 0.0)
    assert labelled(registry) == {"0", "1"}
    for k in (0, 1):
        assert_series_of(registry, core, str(k), k)
    # then 2 and 3 are served, 0 and 1 not: over the window they are the most served
    for now in range(1, 12):
        serve_tokens(core, running, {2: 100, 3: 90})
        metrics.refresh(view, float(now))
    assert labelled(registry) == {"2", "3"}
    for k in (2, 3):
        assert_series_of(registry, core, str(k), k, tokens=False)
    # their tokens before they had labels went to _other, since then to their own
    tokens = core.tokens()
    assert token_totals(registry, "prompt") == {OTHER: tokens[2][0] + tokens[3][0]}
    assert token_totals(registry, "decode") == {
        "2": tokens[2][1] - 1,
        "3": tokens[3][1] - 1,
        OTHER: 1 + 1,
    }
    assert value(registry, "vtc_tenant_counter", tenant="0") is None  # series removed


def test_an_int_key_and_a_name_of_the_same_digits_never_share_a_series(caplog):
    # 1 and "1" are two tenants with one label value "1": one of them has it (the
    # name, taking labels at the same refresh), the other is summed under _other.
    core, metrics, view, registry = core_setup(max_tenants=10)
    rids = iter(range(1, 1_000))
    running = running_and_waiting(core, [1, "1", 2, "a"], rids)
    serve_tokens(core, running, {1: 70, "1": 5, 2: 3, "a": 9})
    with caplog.at_level("WARNING", logger="vtc"):
        metrics.refresh(view, 0.0)
    assert labelled(registry) == {"1", "2", "a"}
    assert_series_of(registry, core, "1", "1")
    assert_series_of(registry, core, "2", 2)
    assert_series_of(registry, core, "a", "a")
    tokens = core.tokens()
    for kind, i in (("prompt", 0), ("decode", 1)):
        assert token_totals(registry, kind)[OTHER] == tokens[1][i]  # int 1's, alone
    assert value(registry, "vtc_tenant_requests", tenant=OTHER, state="running") == 1
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert "'1'" in caplog.text and "_other" in caplog.text
    # the holder keeps it, however more int 1 is served; warned once
    for now in range(1, 4):
        serve_tokens(core, running, {1: 100})
        with caplog.at_level("WARNING", logger="vtc"):
            metrics.refresh(view, float(now))
    assert_series_of(registry, core, "1", "1")
    assert token_totals(registry, "decode")[OTHER] == core.tokens()[1][1]
    assert len(caplog.records) == 1


@pytest.mark.parametrize("max_tenants", [10, 2], ids=["every-tenant-fits", "relabelled"])
def test_a_tenant_named_other_is_summed_under_other_never_labelled(caplog, max_tenants):
    # "_other" is the label value of the sum of the tenants without a label: a tenant
    # of that name never takes it (its gauges and the sum's would overwrite each other,
    # and a counter would appear for the sum), even as the most served; warned once.
    core, metrics, view, registry = core_setup(max_tenants=max_tenants)
    rids = iter(range(1, 1_000))
    running = running_and_waiting(core, [OTHER, "a", "b", "c"], rids)
    with caplog.at_level("WARNING", logger="vtc"):
        for now in range(4):
            serve_tokens(core, running, {OTHER: 500, "a": 50, "b": 40, "c": 1})
            metrics.refresh(view, float(now))
    assert labelled(registry) == ({"a", "b", "c"} if max_tenants == 10 else {"a", "b"})
    assert value(registry, "vtc_tenant_counter", tenant=OTHER) is None
    unlabelled = [OTHER] if max_tenants == 10 else [OTHER, "c"]
    tokens, active = core.tokens(), core.active_clients()
    assert token_totals(registry, "decode")[OTHER] == sum(tokens[k][1] for k in unlabelled)
    for state, i in (("waiting", 0), ("running", 1)):
        assert value(registry, "vtc_tenant_requests", tenant=OTHER, state=state) == sum(
            active[k][i] for k in unlabelled
        )
    assert len(caplog.records) == 1 and "label value of the series that sums" in caplog.text


def test_a_label_value_stays_with_its_holder_until_the_core_forgets_it():
    # One label: int 1 (the most served at the first refresh) takes "1"; "1", served
    # far more later, is passed over while 1 holds it, and takes it once 1 is gone.
    core, metrics, view, registry = core_setup(max_tenants=1)
    rids = iter(range(1, 1_000))
    running = running_and_waiting(core, [1, "1"], rids)
    serve_tokens(core, running, {1: 50, "1": 5})
    metrics.refresh(view, 0.0)
    assert labelled(registry) == {"1"}
    assert_series_of(registry, core, "1", 1)
    for now in range(1, 4):
        serve_tokens(core, running, {"1": 500})
        metrics.refresh(view, float(now))
        assert_series_of(registry, core, "1", 1)
    assert token_totals(registry, "decode") == {"1": 50, OTHER: core.tokens()["1"][1]}
    for rid in range(1, 5):  # every request of both
        core.cancel(rid)
    core.submit(next(rids), "1", 10)  # "1" comes back; 1 does not
    core.forget_idle()
    assert 1 not in core.clients() and "1" in core.clients()
    metrics.refresh(view, 4.0)
    assert_series_of(registry, core, "1", "1", tokens=False)


def vtc_samples(registry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every vtc sample a scrape reads (counters' ``_created`` times left out; NaN as
    a string, to compare equal)."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): "nan" if math.isnan(s.value) else s.value
        for family in registry.collect()
        for s in family.samples
        if s.name.startswith("vtc_") and not s.name.endswith("_created")
    }


def test_series_made_and_removed_past_prometheus_clients_checks_read_the_same(
    where, tmp_path, monkeypatch
):
    """A refresh makes and removes series through ``_Families.child`` and ``remove``
    (prometheus_client's children dict, not its labels() and remove()): with labels
    changing at every refresh a scrape reads the same as through labels() and
    remove() (``_patterns`` None: what it falls back to)."""
    import random

    runs = []
    for fast in (True, False):
        if where is not None:
            directory = tmp_path / f"prom-{fast}"
            directory.mkdir()
            monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(directory))
        rng = random.Random(7)
        adapter, metrics, registry, clock = setup(M=10**9, max_tenants=5, window=1e6)
        if not fast:
            metrics._families._patterns = None
        names = [f"t{i:02}" for i in range(30)]
        running = serve(adapter, names)
        adapter.step_done()
        seen = []
        for _ in range(20):
            hot = set(rng.sample(names, 3))
            adapter.requests.charge(
                [(running[n], rng.randint(1, 50 if n in hot else 5)) for n in names]
            )
            clock.now += 1.0
            adapter.step_done()
            seen.append(vtc_samples(registry))
        runs.append(seen)
        f = metrics._families
        tenant = next(iter(metrics._rows))
        entry = metrics._series[tenant][(id(f.counter),)]
        # the refresh's writes in one call into vtc's files, with their values only
        assert f._in_files == (fast and where is not None)
        if fast:  # the fast path taken: a pattern child for each family used
            assert {id(f.service), id(f.counter), id(f.weight), id(f.requests)} == set(f._patterns)
            # and a refresh sets the value the child keeps
            assert entry[0] is f.counter.labels(tenant)._value
        else:  # through the child's set()
            assert entry[0].child is f.counter.labels(tenant)
    assert runs[0] == runs[1]
    assert len({tuple(sorted({dict(k[1]).get("tenant") for k in s} - {None})) for s in runs[0]}) > 1


def test_a_series_made_past_labels_is_the_one_labels_returns():
    registry = CollectorRegistry()
    metrics = TenantMetrics(registry, interval=0.0)
    families = metrics._families
    with families.creating():
        first = families.child(families.requests, ("a", "waiting"))  # by labels(): the pattern
        second = families.child(families.requests, ("b", "waiting"))
        assert families.child(families.requests, ("b", "waiting")) is second
        assert families.requests.labels("b", "waiting") is second
    second.set(3)
    assert first._value is not second._value and first._value.get() == 0
    assert second._labelvalues == ("b", "waiting")
    families.remove(families.requests, ("b", "waiting"))
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if directory:  # vtc's files: removed by tenant (what TenantMetrics._remove does)
        families.files.remove("b")
        families.files.compact()
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=directory)
    assert value(registry, "vtc_tenant_requests", tenant="b", state="waiting") is None
    assert value(registry, "vtc_tenant_requests", tenant="a", state="waiting") == 0


def test_the_private_path_is_taken_only_for_a_tested_prometheus_client(monkeypatch):
    """_Families.child/remove use prometheus_client's children dict only for the
    version the suites test (0.26); any other version gets labels() and remove()."""
    from vtc import metrics as M

    assert M._children_tested("0.26.0") and M._children_tested("0.26.3")
    assert not any(map(M._children_tested, ["0.25.1", "0.27.0", "1.26.0", "0.2", ""]))
    assert M._CHILDREN_TESTED == M._children_tested(M._prometheus_version())
    monkeypatch.setattr(M, "_CHILDREN_TESTED", False)
    metrics = TenantMetrics(CollectorRegistry(), interval=0.0)
    families = metrics._families
    assert families._patterns is None
    with families.creating():
        child = families.child(families.requests, ("a", "waiting"))
    assert child is families.requests.labels("a", "waiting")


@pytest.mark.parametrize("where", ["directory"], indirect=True)
def test_a_multiprocess_directory_removed_under_the_engine_comes_back_at_a_refresh(
    tmp_path, monkeypatch
):
    """A tmp cleaner removes the multiprocess directory while the engine runs: the next
    refresh writes vtc's series again in it, and a scrape then reads what it reads
    without the removal (labels changing, a tenant forgotten meanwhile)."""
    import random

    runs = []
    for remove in (False, True):
        directory = tmp_path / f"prom-{remove}"
        directory.mkdir()
        monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(directory))
        rng = random.Random(3)
        adapter, _, registry, clock = setup(M=10**9, max_tenants=4, window=1e6)
        names = [f"t{i}" for i in range(10)]
        running = serve(adapter, names)
        adapter.step_done()
        for second in range(12):
            if remove and second in (3, 8):
                remove_tree(directory)
            if second == 6:  # one tenant done and forgotten
                adapter.requests.release("t9-r", finished=True)
                adapter.tenancy.forget_idle()
            tokens = {n: rng.randint(1, 30) for n in names if n != "t9" or second < 6}
            adapter.requests.charge([(running[n], k) for n, k in tokens.items()])
            clock.now += 1.0
            adapter.step_done()
        runs.append(vtc_samples(registry))
    assert runs[0] == runs[1]
    assert {dict(k[1]).get("tenant") for k in runs[0]} >= {"_other"}
