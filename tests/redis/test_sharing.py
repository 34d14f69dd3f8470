"""Shared counters in the engine adapter (vtc.sharing), on a real Redis: both engines get
them from VTC_REDIS_URL alone (issue 15, item 2)."""

from __future__ import annotations

import itertools
import logging
import threading

import pytest
from sync_helpers import wait_for

import vtc
from vtc.adapter import Adapter
from vtc.config import ConfigError, EngineConfig

M, PROMPT, OUTPUT = 1000, 100, 20


def adapter(url: str | None, replica: str, ns: str = "share", **env: str) -> Adapter:
    full = {"VTC_LOG_INTERVAL": "0", **env}
    if url is not None:
        full.update(VTC_REDIS_URL=url, VTC_REDIS_NAMESPACE=ns, VTC_REPLICA_ID=replica)
        full.setdefault("VTC_SYNC_MS", "5")
    ad = Adapter(vtc.Scheduler(M=M), EngineConfig.from_env(full))
    ad.start_sharing()
    return ad


class Engine:
    """A toy engine over an adapter: a backlog per tenant, every running request one token
    per step, finished after OUTPUT tokens."""

    _keys = itertools.count()

    def __init__(self, ad: Adapter, tenants: list[str], depth: int = 8) -> None:
        self.ad, self.tenants, self.depth = ad, tenants, depth
        self.todo: dict[int, int] = {}

    def top_up(self) -> None:
        active = self.ad.core.active_clients()
        for tenant in self.tenants:
            for _ in range(self.depth - active.get(tenant, (0, 0))[0]):
                t = self.ad.arrive(next(self._keys), None, [tenant], PROMPT)
                self.todo[t.rid] = OUTPUT

    def step(self) -> None:
        self.top_up()
        core = self.ad.core
        core.schedule()
        core.decode()
        for rid in core.running():
            self.todo[rid] -= 1
            if self.todo[rid] <= 0:
                core.finish(rid)
                del self.todo[rid]
        self.ad.step_done()


def test_engines_share_counters_by_configuration_and_the_pinned_tenant_gets_its_share(
    redis_server,
):
    """A only on r0, B on r0 and r1, both backlogged: per-replica VTC gives A half of r0
    (a quarter of all service); shared counters give it about half (max-min fair)."""
    share = {}
    for mode in ("per-replica", "global"):
        url = redis_server.url if mode == "global" else None
        env = {"VTC_SYNC_MODE": "step", "VTC_SYNC_INTERVAL": "1"}
        r0, r1 = adapter(url, "r0", ns=mode, **env), adapter(url, "r1", ns=mode, **env)
        e0, e1 = Engine(r0, ["A", "B"]), Engine(r1, ["B"])
        for _ in range(400):
            e0.step()
            e1.step()
        a = r0.core.service("A")
        b = r0.core.service("B") + r1.core.service("B")
        share[mode] = a / (a + b)
        if mode == "global":
            assert r0.sharing.shared.stats.syncs >= 300 and not r0.sharing.shared.degraded
    assert share["per-replica"] < 0.3
    assert share["global"] > 0.4


def test_step_mode_reads_the_waiting_tenants_only_on_a_syncing_step(redis_server):
    """``VTC_SYNC_MODE=step``: the steps between syncs cost no per-tenant work (issue 15,
    item 5); the syncing steps see the waiting tenants of that moment."""
    ad = adapter(
        redis_server.url, "r0", VTC_SYNC_MODE="step", VTC_SYNC_INTERVAL="4", VTC_SYNC_MS="3600000"
    )  # every 4th step, never on time
    sync = ad.sharing
    reads = []
    original = sync.waiting

    def counted():
        out = original()
        reads.append(sorted(out))
        return out

    sync.waiting = counted
    eng = Engine(ad, ["A", "B"], depth=30)
    for _ in range(12):
        eng.step()
    assert reads == [["A", "B"]] * 3 and sync.shared.stats.syncs == 3
    assert set(sync.shared.store.backlog()) == {"A", "B"}
    ad.close()


def test_background_sync_keeps_the_store_equal_to_what_the_cores_charged(redis_server):
    r0, r1 = adapter(redis_server.url, "r0"), adapter(redis_server.url, "r1")
    assert r0.sharing.background and "shared counters on Redis" in r0.describe()
    e0, e1 = Engine(r0, ["A", "B"]), Engine(r1, ["B", "C"], depth=30)
    e0.depth = 30  # deeper than a batch: every tenant stays backlogged
    for _ in range(100):
        e0.step()
        e1.step()
    store = r0.sharing.shared.store

    def charged() -> dict:
        out: dict[str, float] = {}
        for ad in (r0, r1):
            for c, v in ad.core.services().items():
                out[c] = out.get(c, 0.0) + v
        return out

    def all_pushed() -> bool:
        return all(
            ad.sharing.shared.unsynced(ad.core, c) == 0 and not ad.sharing.shared.degraded
            for ad in (r0, r1)
            for c in ad.core.services()
        )

    # the thread pushed every charge and the store acknowledged it; counters hold the
    # service of both replicas (plus the lift of a tenant when it arrived)
    wait_for(all_pushed, "the store to acknowledge every charge")
    got = store.counters()
    assert all(got[c] >= v for c, v in charged().items()) and set(got) == {"A", "B", "C"}
    # waiting tenants are in the global backlog: A from r0, B from both, C from r1
    wait_for(lambda: set(store.backlog()) == {"A", "B", "C"}, "the global backlog")
    # a new tenant arriving on r1 is lifted to the global floor before it is submitted
    floor = min(store.backlog().values())
    wait_for(lambda: r1.sharing.shared.floor == floor, "r1 to see the floor")
    r1.arrive("new", None, ["D"], PROMPT)
    assert r1.core.counter("D") >= floor > 0
    for ad in (r0, r1):
        ad.close()
    assert store.backlog() == {}  # closed replicas leave the backlog
    # nothing was served since: the last syncs moved no counter (D, never served, is in
    # the store only if a sync saw it waiting before the close, then at its lift)
    after = store.counters()
    assert after.pop("D", r1.core.counter("D")) == r1.core.counter("D")
    assert after == got


def test_forgetting_in_the_adapter_loses_no_service(redis_server):
    ad = adapter(redis_server.url, "r0", VTC_SYNC_MODE="step", VTC_SYNC_INTERVAL="1")
    core = ad.core
    y = ad.arrive("y", None, ["Y"], 900)  # Y keeps running with the largest counter
    x = ad.arrive("x", None, ["X"], 50)
    assert {y.rid, x.rid} <= set(core.schedule())
    core.finish(x.rid)
    z = ad.arrive("z", None, ["Z"], 10)  # Z leaves last: X is not the last-left reference
    core.schedule()
    core.finish(z.rid)
    ad.step_done()
    assert ad.tenancy.forget_idle() >= 1 and "X" not in core.services()
    x2 = ad.arrive("x2", None, ["X"], 80)
    core.schedule()
    core.finish(x2.rid)
    ad.step_done()
    assert ad.sharing.shared.store.counters()["X"] == 130.0


def test_redis_down_at_start_the_engine_serves_locally_then_reconciles(redis_server, caplog):
    url = redis_server.url
    redis_server.stop()
    caplog.set_level(logging.WARNING, logger="vtc.distributed")
    ad = adapter(url, "r0", VTC_REDIS_TIMEOUT_MS="50")
    ad.sharing.shared.retry_ms = 10
    eng = Engine(ad, ["A", "B"])
    wait_for(lambda: ad.sharing.shared.stats.failures >= 2, "failed syncs")
    for _ in range(50):
        eng.step()
    assert ad.core.service("A") > 0 and ad.sharing.shared.degraded
    unreachable = [r for r in caplog.records if "unreachable" in r.getMessage()]
    assert len(unreachable) == 1  # logged once
    redis_server.start()
    store = ad.sharing.shared.store
    wait_for(lambda: not ad.sharing.shared.degraded, "reconciliation")
    wait_for(lambda: store.counters() == pytest.approx(ad.core.services()), "the store to catch up")
    ad.close()


@pytest.mark.parametrize(
    "env, named",
    [
        ({"VTC_REDIS_URL": "localhost:6379"}, "VTC_REDIS_URL"),
        ({"VTC_REDIS_URL": "redis://x", "VTC_REDIS_NAMESPACE": "a{b"}, "VTC_REDIS_NAMESPACE"),
        ({"VTC_REDIS_URL": "redis://x", "VTC_SYNC_MODE": "sometimes"}, "VTC_SYNC_MODE"),
        ({"VTC_REDIS_URL": "redis://x", "VTC_SYNC_INTERVAL": "abc"}, "VTC_SYNC_INTERVAL"),
        ({"VTC_REDIS_URL": "redis://x", "VTC_SYNC_MS": "-1"}, "VTC_SYNC_MS"),
        ({"VTC_REDIS_URL": "redis://x", "VTC_REDIS_TIMEOUT_MS": "0"}, "VTC_REDIS_TIMEOUT_MS"),
    ],
)
def test_bad_shared_counter_settings_stop_the_adapter_naming_the_variable(env, named):
    with pytest.raises(ConfigError, match=named):
        EngineConfig.from_env(env)


def test_without_a_url_nothing_is_shared():
    ad = Adapter(vtc.Scheduler(M=M), EngineConfig.from_env({"VTC_SYNC_MS": "5"}))
    assert ad.start_sharing() is None and "Redis" not in ad.describe()


def test_mirrored_ranks_do_not_share(redis_server, caplog):
    env = {"VTC_REDIS_URL": redis_server.url, "VTC_LOG_INTERVAL": "0"}
    ad = Adapter(vtc.Scheduler(M=M), EngineConfig.from_env(env))
    with caplog.at_level(logging.ERROR, logger="vtc"):
        assert ad.start_sharing(ranks=2) is None
    assert "mirrored ranks" in caplog.text and ad.start_sharing() is None


def test_a_url_without_the_redis_client_says_what_to_install(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "redis", None)  # import redis -> ImportError
    ad = Adapter(vtc.Scheduler(M=M), EngineConfig.from_env({"VTC_REDIS_URL": "redis://x"}))
    with pytest.raises(ConfigError, match=r"vtc\[redis\]"):
        ad.start_sharing()


def test_a_rank_suffix_keeps_replica_ids_apart(redis_server):
    env = {"VTC_REDIS_URL": redis_server.url, "VTC_REPLICA_ID": "pod", "VTC_SYNC_MODE": "step"}
    ids = []
    for rank in (0, 1):
        ad = Adapter(vtc.Scheduler(M=M), EngineConfig.from_env(env))
        ids.append(ad.start_sharing(suffix=f"-dp{rank}").shared.replica_id)
    assert ids == ["pod-dp0", "pod-dp1"]


def test_sync_health_is_on_the_metrics(redis_server):
    """vtc_sync_seconds (one observation per sync attempt) and vtc_sync_degraded."""
    from prometheus_client import CollectorRegistry

    reg = CollectorRegistry()
    ad = adapter(redis_server.url, "r0", VTC_SYNC_MODE="step", VTC_SYNC_INTERVAL="1")
    ad.sharing.shared.retry_ms = 0
    metrics = ad.enable_metrics(served=True, budget=M, registry=reg)
    eng = Engine(ad, ["A"])
    for _ in range(5):
        eng.step()
    metrics.refresh(ad)
    assert reg.get_sample_value("vtc_sync_seconds_count") == 5
    assert reg.get_sample_value("vtc_sync_degraded") == 0.0
    redis_server.stop()
    eng.step()
    metrics.refresh(ad)
    assert reg.get_sample_value("vtc_sync_degraded") == 1.0
    assert reg.get_sample_value("vtc_sync_seconds_count") == 6


@pytest.mark.parametrize("mode", ["background", "step"])
def test_a_sync_interval_the_mode_does_not_read_is_logged_at_start(redis_server, caplog, mode):
    """``VTC_SYNC_INTERVAL`` counts engine steps, which only ``step`` mode reads: with the
    background thread it is named in a warning at start-up, not ignored silently."""
    env = {"VTC_SYNC_MODE": mode, "VTC_SYNC_INTERVAL": "3", "VTC_SYNC_MS": "20"}
    settings = EngineConfig.from_env({"VTC_REDIS_URL": redis_server.url, **env}).shared
    with caplog.at_level(logging.INFO, logger="vtc"):
        ad = adapter(redis_server.url, f"r-{mode}", ns=f"ignored-{mode}", **env)
    lines = [(r.levelno, r.getMessage()) for r in caplog.records]
    warned = [text for level, text in lines if level == logging.WARNING]
    started = [text for _, text in lines if "shared counters on Redis" in text]
    try:
        if mode == "background":
            assert settings.ignored and warned == [f"VTC: {settings.ignored[0]}"]
            assert "VTC_SYNC_INTERVAL='3' is ignored" in warned[0]
            tail = "every 20 ms in the background (their CPU at most 0.5%)"
            assert started and started[0].endswith(tail)
        else:
            assert settings.ignored == () and warned == []
            assert started and started[0].endswith("every 3 steps")
    finally:
        ad.close()


def test_without_a_sync_interval_nothing_is_ignored():
    settings = EngineConfig.from_env({"VTC_REDIS_URL": "redis://x"}).shared
    assert settings is not None and settings.ignored == ()


def test_a_counter_pulled_during_a_scheduling_pass_waits_for_the_pass_to_end(redis_server):
    """vLLM peeks a request, works on it, then pops and must get the one it peeked.
    A background sync that pulls a higher counter during the pass (Adapter.selecting)
    leaves the raise to the pass's end; the order the pass sees never changes."""
    r0 = adapter(redis_server.url, "r0", ns="pass")
    r1 = adapter(redis_server.url, "r1", ns="pass")
    a = r0.arrive("a0", None, ["A"], PROMPT)
    b = r0.arrive("b0", None, ["B"], PROMPT)
    assert r0.core.peek() == a.rid  # A first: same counter, earlier
    with r0.selecting():
        assert r0.core.peek() == a.rid
        # replica r1 serves A: its sync pushes the service, r0's sync pulls it
        t = r1.arrive("a1", None, ["A"], PROMPT)
        r1.core.schedule()
        for _ in range(10):
            r1.core.decode([t.rid], 100)
        served = r1.core.service("A")
        assert served > r0.core.counter("B")
        shared = r0.sharing.shared
        wait_for(
            lambda: shared._deferred.get("A", 0.0) >= served or r0.core.counter("A") >= served,
            "r0's background sync to pull A's counter",
        )
        # pulled, not applied: the pass still pops what it peeked
        assert r0.core.counter("A") < served
        assert r0.core.peek() == a.rid
    # the pass is over: the raise is applied, and B goes first now
    assert r0.core.counter("A") >= served
    assert r0.core.peek() == b.rid
    with r0.selecting():  # nothing left over
        assert shared._deferred == {}
    for ad in (r0, r1):
        ad.close()


def test_a_raise_left_for_the_next_pass_is_dropped_for_a_forgotten_tenant(redis_server):
    """A tenant forgotten before the pass that would apply its deferred raise is not
    brought back by it (its service starts again from 0, as forgetting says)."""
    r0 = adapter(redis_server.url, "r0", ns="forgot")
    shared = r0.sharing.shared
    shared.stop()  # no background syncs: the deferral is driven by hand
    with r0.selecting():
        done = threading.Event()

        def pull() -> None:
            shared._apply_raise(r0.core, {"gone": 500.0, "kept": 400.0})
            done.set()

        threading.Thread(target=pull).start()
        wait_for(done.is_set, "the raise to be left for the pass")
        assert shared._deferred == {"gone": 500.0, "kept": 400.0}
    assert r0.core.counter("kept") == 400.0 and r0.core.counter("gone") == 500.0
    with r0.selecting():
        threading.Thread(target=shared._apply_raise, args=(r0.core, {"x": 7.0})).start()
        wait_for(lambda: "x" in shared._deferred, "the raise to be left for the pass")
        shared.forgot(["x"])
    assert "x" not in r0.core.counters()
    r0.close()
