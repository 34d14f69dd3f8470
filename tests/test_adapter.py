"""vtc.adapter.Tenancy: the tenant rule, weights, forgetting and the tenant cap
shared by the vLLM and SGLang shells, with a real core and no engine."""

from __future__ import annotations

import json
import logging

import pytest

import vtc
import vtc.adapter as vtc_adapter
from helpers import Out
from vtc.adapter import (
    ASIDE,
    RUNNING,
    WAITING,
    Adapter,
    Observer,
    Requests,
    Tenancy,
    format_counters,
)
from vtc.config import EngineConfig, first_tenant


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


# -- Requests: ids, state changes and charging -------------------------------------


def tracked_pair(M=10_000):
    core = vtc.Scheduler(M=M)
    return core, Requests(core)


def test_an_engine_priority_is_the_cores_band_clamped_to_64_bits():
    core, reqs = tracked_pair()
    batch = reqs.submit("r-b", object(), "b", 10, priority=2**70)
    default = reqs.submit("r-d", object(), "d", 10)
    urgent = reqs.submit("r-u", object(), "u", 10, priority=-(2**70))
    assert reqs.head() is urgent  # the most urgent band first, whatever arrived before
    assert core.schedule() == [urgent.rid, default.rid, batch.rid]
    preempted = reqs.get("r-b")
    reqs.put_back(preempted)  # a preemption returns it to its own band
    later = reqs.submit("r-d2", object(), "d", 10, priority=0)
    assert reqs.head() is later


def test_a_request_goes_through_every_state_in_the_core():
    core, reqs = tracked_pair(M=100)
    a = reqs.submit("r-a", object(), "a", 500)  # clamped to M
    assert (a.rid, a.prompt_len, reqs.status(a)) == (vtc.key_id("r-a"), 100, WAITING)
    assert reqs.head() is a and reqs.get("r-a") is a and reqs.at(a.rid) is a
    reqs.set_aside(a)
    assert (reqs.status(a), reqs.head()) == (ASIDE, None)
    reqs.put_back(a)
    assert (reqs.status(a), core.counter("a")) == (WAITING, 0.0)
    reqs.admit(a, cached_len=30)
    assert (reqs.status(a), core.counter("a")) == (RUNNING, 70.0)
    reqs.put_back(a)  # preempted
    assert reqs.status(a) == WAITING
    reqs.admit(a, cached_len=0)
    assert core.counter("a") == 70.0  # its prompt is never charged twice
    assert reqs.by_tenant() == ({}, {"a": 1}) and reqs.queued() == {"a": 1}
    assert reqs.release("r-a", finished=True) is a
    assert core.status(a.rid) is None and len(reqs) == 0 and reqs.get("r-a") is None
    assert reqs.release("r-a") is None  # untracked: a no-op
    b = reqs.submit("r-b", None, "b", 1)
    with pytest.raises(ValueError, match="already tracked"):
        reqs.submit("r-b", None, "b", 1)
    core.cancel(b.rid)  # gone from the core behind the adapter's back
    assert reqs.release("r-b") is b and len(reqs) == 0


def test_charging_is_one_call_and_owes_tokens_of_a_request_not_running():
    core, reqs = tracked_pair()
    a = reqs.submit("a1", None, "a", 10)
    b = reqs.submit("b1", None, "b", 10)
    reqs.admit(a, 0)
    reqs.admit(b, 0)
    assert reqs.charge([(a, 3), (b, 1), (a, 2), (b, 0)]) == []  # a repeats: counts add up
    assert (core.generated(a.rid), core.generated(b.rid)) == (5, 1)
    reqs.put_back(b)  # preempted with output in flight
    assert reqs.charge([(a, 1), (b, 4)]) == [(b, 4)]  # b not running: not charged
    assert (core.generated(a.rid), core.generated(b.rid), b.owed) == (6, 1, 0)
    reqs.charge_keys([("b1", 4), ("gone", 9), ("a1", 1)])  # by key: b owes its tokens
    assert (core.generated(a.rid), core.generated(b.rid), b.owed) == (7, 1, 4)
    served = core.service("b")
    reqs.admit(b, 0)  # re-admitted: pays what it owes
    assert (core.generated(b.rid), b.owed) == (5, 0)
    assert core.service("b") == served + 4 * 2.0  # wq = 2


def test_charge_outputs_takes_one_call_or_falls_back_output_by_output(monkeypatch):
    core, reqs = tracked_pair()
    calls = []
    real = core.decode_outputs
    monkeypatch.setattr(
        reqs, "core", type("Spy", (), {"__getattr__": lambda _, n: getattr(core, n)})()
    )
    reqs.core.decode_outputs = lambda *a, **k: (calls.append(len(a[0])), real(*a, **k))[1]
    a = reqs.submit("a1", None, "a", 10)
    b = reqs.submit("b1", None, "b", 10)
    reqs.admit(a, 0)
    reqs.admit(b, 0)
    reqs.charge_outputs([Out("a1", 2), Out("b1", 3)])
    assert calls == [2] and (core.generated(a.rid), core.generated(b.rid)) == (2, 3)
    # a repeated request and an unknown one: the core refuses the whole step,
    # which is then charged output by output
    reqs.charge_outputs([Out("a1", 1), Out("a1", 1), Out("zz", 5), Out("b1", 1)])
    assert (core.generated(a.rid), core.generated(b.rid)) == (4, 4)
    reqs.charge_outputs([])
    assert len(calls) == 2


def test_a_key_whose_hash_is_taken_gets_the_next_free_id_and_outputs_still_charge():
    core, reqs = tracked_pair()
    first = reqs.submit(7, None, "a", 10)  # key_id(7) == 7
    assert first.rid == 7
    # a str key whose hash collides with 7 would be rare; force it with an int key
    # of the same hash: 7 + (2**61 - 1) hashes to 7 in CPython
    twin = 7 + (2**61 - 1)
    second = reqs.submit(twin, None, "b", 10)
    assert second.rid == 8 and reqs.overrides == {7: 7, twin: 8}  # int keys: all there
    reqs.admit(first, 0)
    reqs.admit(second, 0)
    reqs.charge_outputs([Out(7, 1), Out(twin, 2)])  # the core reads the override
    assert (core.generated(7), core.generated(8)) == (1, 2)
    reqs.release(twin, finished=True)
    assert reqs.overrides == {7: 7}
    reqs.release(7, finished=True)
    assert reqs.overrides == {}


def test_an_output_of_an_untracked_key_is_never_charged_to_another_request():
    """1 and 2**61 hash alike: an output of 1, untracked (released with output in
    flight, say), must not charge 2**61's request, which has core id 1."""
    core, reqs = tracked_pair()
    t = reqs.submit(2**61, None, "a", 10)
    assert t.rid == 1
    reqs.admit(t, 0)
    reqs.charge_outputs([Out(1, 3)])
    reqs.charge_outputs([Out(1, 3), Out(2**61, 2)])
    assert core.generated(1) == 2 and core.client_tokens("a") == (10, 2)
    s = reqs.submit("cmpl-x", None, "a", 10)  # a str key is found by its hash
    reqs.admit(s, 0)
    assert "cmpl-x" not in reqs.overrides
    reqs.charge_outputs([Out("cmpl-x", 4), Out(2**61, 1)])
    assert core.generated(s.rid) == 4 and core.generated(1) == 3


def test_put_back_all_restores_set_aside_order_then_prepends_running_in_order():
    core, reqs = tracked_pair()
    for i in (1, 2, 3, 4, 5):
        reqs.submit(f"a{i}", None, "a", 10)
    reqs.admit(reqs.head(), 0)  # a1, a2 run
    reqs.admit(reqs.head(), 0)
    reqs.set_aside(reqs.head())  # a3, a4 skipped by the engine, in this order
    reqs.set_aside(reqs.head())
    assert reqs.num_aside == 2 and reqs.head().key == "a5"
    counter = core.counter("a")
    statuses = []
    reqs.core = type("Spy", (), {"__getattr__": lambda _, n: getattr(core, n)})()
    reqs.core.status = lambda rid: (statuses.append(rid), core.status(rid))[1]
    get = reqs.get
    reqs.put_back_all([get("a4"), get("a2"), get("a5"), get("a3"), get("a1")])
    assert statuses == []  # one statuses() call, no status() per request
    reqs.core = core
    assert reqs.num_aside == 0 and core.counter("a") == counter  # nothing charged
    order = []
    while (t := reqs.head()) is not None:
        order.append(t.key)
        reqs.admit(t, 10)
    # the preempted ones as given (a2 before a1), then the set-aside ones in the
    # order they were set aside, then a5, which waited all along
    assert order == ["a2", "a1", "a3", "a4", "a5"]


def test_released_requests_leave_the_set_aside_record():
    _, reqs = tracked_pair()
    a = reqs.submit("a", None, "a", 10)
    reqs.set_aside(a)
    reqs.release("a")
    assert reqs.num_aside == 0 and len(reqs) == 0


def test_charge_totals_charges_what_is_new_once_and_later_what_was_not_running():
    core, reqs = tracked_pair()
    a = reqs.submit("a", None, "a", 10)
    b = reqs.submit("b", None, "b", 10)
    reqs.admit(a, 0)
    reqs.admit(b, 0)
    reqs.charge_totals([("a", 3), ("b", 2), ("a", 3), ("gone", 9)])  # a repeats
    assert (core.generated(a.rid), core.generated(b.rid)) == (3, 2)
    reqs.charge_totals([("a", 3), ("b", 1)])  # nothing new (a count never goes back)
    assert (core.generated(a.rid), core.generated(b.rid), a.charged) == (3, 2, 3)
    reqs.put_back(b)  # preempted with a token in flight
    reqs.charge_totals([("a", 4), ("b", 3)])
    assert (core.generated(a.rid), core.generated(b.rid), b.charged) == (4, 2, 2)
    reqs.admit(b, 0)
    reqs.charge_totals([("b", 3)])  # found again once it runs
    assert core.generated(b.rid) == 3


def test_sync_waiting_makes_the_core_waiting_set_the_engines():
    core, reqs = tracked_pair()
    running = reqs.submit("run", "R", "b", 10)
    reqs.admit(running, 0)
    kept = reqs.submit("kept", "K", "a", 10)
    reqs.submit("gone", "G", "a", 10)
    entered = []
    reqs.sync_waiting({"kept": "K", "run": "R", "new": "N"}, entered.append)
    # gone: released; kept stays; run is running, not waiting: handed over, as is new
    assert reqs.get("gone") is None and reqs.status(kept) == WAITING
    assert sorted(entered) == ["N", "R"] and reqs.status(running) == RUNNING
    entered.clear()
    reqs.sync_waiting({"kept": "K"}, entered.append)  # counts agree: nothing to enqueue
    assert entered == [] and core.num_waiting == 1


def test_enqueue_puts_back_what_the_core_holds_and_bills_what_is_new():
    core = vtc.Scheduler(M=10_000)
    adapter = Adapter(core, EngineConfig())
    t = adapter.enqueue("r", None, ["a"], 10, charged=4)
    assert (t.tenant, t.charged, adapter.requests.status(t)) == ("a", 4, WAITING)
    assert adapter.enqueue("r", None, ["other"], 10) is t  # already waiting: stays
    adapter.requests.admit(t, 0)
    assert adapter.enqueue("r", None, ["a"], 10) is t  # running: preempted
    assert adapter.requests.status(t) == WAITING and core.counter("a") == 10.0
    assert "tenant key 'tenant'" in adapter.describe() and "all 1" in adapter.describe()


# -- Adapter: one engine's VTC, and its log line -----------------------------------


def test_the_adapter_bills_arrivals_and_logs_counters_at_its_interval(caplog):
    core = vtc.Scheduler(M=10_000)
    adapter = Adapter(core, EngineConfig(weights={"gold": 2.0}, log_interval=1e-9))
    t = adapter.arrive("r1", None, ["gold"], 10)
    assert (t.tenant, core.weight("gold"), adapter.requests.get("r1")) == ("gold", 2.0, t)
    adapter.requests.admit(t, 0)
    with caplog.at_level(logging.INFO, logger="vtc"):
        assert adapter.maybe_log()
    assert caplog.records[-1].getMessage() == (
        "VTC tenant counter (service) waiting/running: gold=5 (5) 0/1"
    )
    quiet = Adapter(vtc.Scheduler(M=100), EngineConfig(log_interval=0))
    quiet.arrive("r", None, ["a"], 1)
    assert not quiet.maybe_log()  # an interval of 0: never
    assert adapter.trace is None  # no VTC_TRACE_FILE


def test_step_done_logs_the_counters_once_per_interval_and_never_at_zero(caplog, monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(vtc_adapter.time, "monotonic", lambda: now[0])
    adapter = Adapter(vtc.Scheduler(M=10_000), EngineConfig(log_interval=10))
    quiet = Adapter(vtc.Scheduler(M=10_000), EngineConfig(log_interval=0))
    for a in (adapter, quiet):
        a.arrive("r1", None, ["gold"], 10)
    logged = []
    with caplog.at_level(logging.INFO, logger="vtc"):
        for t in (1005.0, 1009.99, 1010.0, 1015.0, 1019.0, 1020.5, 1e9):
            now[0] = t
            caplog.clear()
            adapter.step_done()
            quiet.step_done()
            if caplog.records:
                logged.append(t)
                assert [r.getMessage() for r in caplog.records] == [
                    "VTC tenant counter (service) waiting/running: gold=0 (0) 1/0"
                ]
    assert logged == [1010.0, 1020.5, 1e9]


def test_the_log_line_quotes_names_that_could_break_it_and_is_bounded():
    evil = ["line\nbreak", "a=1", "x, y", "plain"]
    counters = {name: float(i) for i, name in enumerate(evil)}
    line = format_counters(counters, {}, {}, {"plain": 2})
    assert "\n" not in line
    assert '"line\\nbreak"=0 (0) 0/0' in line and '"a=1"=1' in line and '"x, y"=2' in line
    assert "plain=3 (0) 0/2" in line
    many = {f"t{i}": float(i) for i in range(100)}
    line = format_counters(many, {}, {}, {}, most=5)
    assert line.count("=") == 5 and line.endswith("(+95 more tenants)")
    assert "t99=99" in line and "t10=" not in line  # the most served are named


# -- observers: where shared counters and metrics plug in ---------------------------


class Recorder(Observer):
    """Records every call, as (point, what) with requests named by key."""

    def __init__(self):
        self.calls = []

    def admitted(self, t, prompt_tokens):
        self.calls.append(("admitted", t.key, prompt_tokens))

    def charged(self, produced):
        self.calls.append(("charged", sorted((t.key, n) for t, n in produced)))

    def preempted(self, t):
        self.calls.append(("preempted", t.key))

    def released(self, t, finished):
        self.calls.append(("released", t.key, finished))

    def forgot(self, tenants):
        self.calls.append(("forgot", tenants))

    def stepped(self, adapter):
        self.calls.append(("stepped", adapter.core.num_running))


def test_observers_see_every_charge_preemption_release_step_and_forget():
    rec = Recorder()
    core = vtc.Scheduler(M=10_000)
    adapter = Adapter(core, EngineConfig(), observers=[rec], forget_every=10**6)
    a = adapter.arrive("a1", None, ["a"], 10)
    b = adapter.arrive("b1", None, ["b"], 8)
    reqs = adapter.requests
    reqs.admit(a, 4)
    reqs.admit(b, 0)
    reqs.charge_outputs([Out("a1", 2), Out("b1", 1)])  # the one-call path
    reqs.put_back(b)  # preempted
    reqs.charge_outputs([Out("a1", 1), Out("b1", 3)])  # refused whole: output by output
    adapter.step_done()
    reqs.admit(b, 8)  # back: no prompt charge, then the 3 tokens it owed
    # what they saw is what the core charged (wp=1, wq=2)
    assert core.services() == {"a": 6 + 2 * 3, "b": 8 + 2 * 4}
    reqs.release("a1", finished=True)
    reqs.release("b1")  # cancelled
    adapter.tenancy.forget_idle()
    assert rec.calls == [
        ("admitted", "a1", 6),
        ("admitted", "b1", 8),
        ("charged", [("a1", 2), ("b1", 1)]),
        ("preempted", "b1"),
        ("charged", [("a1", 1)]),
        ("stepped", 1),
        ("admitted", "b1", 0),
        ("charged", [("b1", 3)]),
        ("released", "a1", True),
        ("released", "b1", False),
        ("forgot", ["a"]),  # b, the last to leave, holds the floor
    ]


def test_a_failing_observer_is_logged_once_and_scheduling_goes_on(caplog):
    class Broken(Observer):
        def charged(self, produced):
            raise RuntimeError("boom")

    rec = Recorder()
    core = vtc.Scheduler(M=100)
    adapter = Adapter(core, EngineConfig(), observers=[Broken(), rec])
    t = adapter.arrive("r", None, ["a"], 5)
    adapter.requests.admit(t, 0)
    with caplog.at_level(logging.ERROR, logger="vtc"):
        adapter.requests.charge([(t, 1)])
        adapter.requests.charge([(t, 1)])
    assert core.generated(t.rid) == 2  # charged both times
    assert [c[0] for c in rec.calls] == ["admitted", "charged", "charged"]  # the next one ran
    failures = [r for r in caplog.records if "observer" in r.getMessage()]
    assert len(failures) == 1 and "in charged" in failures[0].getMessage()


def test_the_trace_is_an_observer_of_charged_tokens(tmp_path):
    path = tmp_path / "t.jsonl"
    core = vtc.Scheduler(M=100)
    adapter = Adapter(core, EngineConfig(trace_file=str(path), trace_interval=0.0))
    t = adapter.arrive("r", None, ["a"], 5)
    adapter.requests.admit(t, 0)
    adapter.requests.charge([(t, 3)])
    adapter.step_done()
    record = [json.loads(line) for line in path.read_text().splitlines()][-1]
    assert record["tokens"] == {"a": 3} and record["queued"] == {"a": 1}


def test_the_trace_tells_the_truth_at_idle_after_forgetting_and_by_the_clock(tmp_path):
    """Issue 16: a final record when the engine goes idle (the step that ends the
    work is not followed by one that would write it), forgotten tenants leave
    the records, and each record is dated by the wall clock too."""
    import time

    path = tmp_path / "t.jsonl"
    adapter = Adapter(vtc.Scheduler(M=100), EngineConfig(trace_file=str(path), trace_interval=3600))

    def records():
        return [json.loads(line) for line in path.read_text().splitlines()]

    before = time.time()
    a = adapter.arrive("a1", None, ["gone"], 5)
    adapter.requests.admit(a, 0)
    adapter.step_done()  # the first record: the interval has passed since never
    adapter.requests.charge([(a, 3)])
    adapter.step_done()  # within the interval: no record
    assert len(records()) == 1
    adapter.requests.charge([(a, 2)])
    adapter.requests.release("a1", finished=True)
    adapter.step_done()  # idle now: the last tokens are recorded
    adapter.step_done()  # still idle: nothing new to say
    assert len(records()) == 2
    last = records()[-1]
    assert (last["tokens"], last["queued"]) == ({"gone": 5}, {})
    assert before <= last["time"] <= time.time() and last["t"] >= records()[0]["t"]
    b = adapter.arrive("b1", None, ["stays"], 5)
    adapter.requests.admit(b, 0)  # passes gone's counter: gone can be forgotten
    assert adapter.tenancy.forget_idle() == 1
    adapter.requests.release("b1", finished=True)
    adapter.step_done()
    assert records()[-1]["tokens"] == {}  # gone was forgotten; stays produced nothing


def test_the_tally_traces_an_engine_vtc_does_not_schedule(tmp_path):
    from vtc.adapter import TenantTally

    assert TenantTally(EngineConfig()).trace is None  # no VTC_TRACE_FILE: nothing kept
    path = tmp_path / "stock.jsonl"
    tally = TenantTally(EngineConfig(trace_file=str(path), trace_interval=0.0))
    tally.arrive("r1", [None, "acme"])
    tally.arrive("r2", [None, None])  # no tenant field: the default tenant
    tally.produced("r1", 3)
    tally.produced("r2", 2)
    tally.produced("stranger", 9)
    tally.step_done(lambda: ["r1", "r2", "stranger"])
    tally.left("r2")
    assert len(tally) == 1
    tally.produced("r2", 5)  # gone: not counted
    tally.step_done(lambda: ["r1"])
    tally.left("r1")
    tally.step_done(lambda: [])  # idle: a last record
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(records) == 3 and records[-1]["queued"] == {}
    assert records[0]["tokens"] == {"acme": 3, "default": 2}
    assert records[0]["queued"] == {"acme": 1, "default": 1}
    assert records[1] == {**records[1], "tokens": {"acme": 3, "default": 2}, "queued": {"acme": 1}}


def test_a_step_that_leaves_a_request_set_aside_is_warned_about_once(caplog):
    core = vtc.Scheduler(M=10_000)
    adapter = Adapter(core, EngineConfig())
    adapter.arrive("r", None, ["a"], 10)
    adapter.step_done()
    adapter.requests.set_aside(adapter.requests.head())
    with caplog.at_level(logging.WARNING, logger="vtc"):
        adapter.step_done()
        adapter.step_done()
    assert [r.getMessage() for r in caplog.records] == [
        "VTC: 1 skipped request(s) not put back in the waiting queue"
    ]


def test_priority_weights_follow_the_engines_priority_order():
    """VTC_PRIORITY_WEIGHTS names the engine's own priorities: the core's band is
    order * priority, so the weights are oriented the same way; no order (the
    engine ignores priorities) leaves strict bands, which are all band 0 then."""
    core = vtc.Scheduler(M=10_000)
    adapter = Adapter(core, EngineConfig(priority_weights={0: 4.0, 5: 1.0}))
    assert core.band_weights() is None
    adapter.set_priority_order(1)
    assert core.band_weights() == {0: 4.0, 5: 1.0}
    adapter.set_priority_order(-1)  # larger values first (SGLang's default)
    assert core.band_weights() == {0: 4.0, -5: 1.0}
    adapter.set_priority_order(None)
    assert core.band_weights() is None
    assert "weighted bands (0=4, 5=1; others 1)" in adapter.describe_priorities(1)
    assert "VTC_PRIORITY_WEIGHTS is unused" in adapter.describe_priorities(None)
    strict = Adapter(vtc.Scheduler(M=100), EngineConfig())
    strict.set_priority_order(1)
    assert strict.core.band_weights() is None
    assert "strict bands" in strict.describe_priorities(1)
    assert strict.describe_priorities(None) == ""


class _Arriving(Observer):
    def __init__(self) -> None:
        self.seen: list[str] = []

    def arriving(self, tenant: str) -> None:
        self.seen.append(tenant)


@pytest.mark.parametrize(
    "change",
    [
        lambda obs, o: obs.append(o),
        lambda obs, o: obs.extend([o]),
        lambda obs, o: obs.insert(0, o),
        lambda obs, o: obs.__iadd__([o]),
        lambda obs, o: obs.__setitem__(slice(0, 0), [o]),
    ],
    ids=["append", "extend", "insert", "iadd", "setitem"],
)
def test_observers_wants_follows_an_added_observer(change) -> None:
    """``wants`` is kept per point: adding a listener must be seen at once (the
    next arrival notifies it)."""
    from vtc.observer import _Observers

    core = vtc.Scheduler(M=1000)
    obs = _Observers([Observer()])
    requests = Requests(core, obs)
    requests.submit("a", None, "t1", 10)
    assert not obs.wants("arriving")
    o = _Arriving()
    change(obs, o)
    assert obs.wants("arriving")
    requests.submit("b", None, "t2", 10)
    assert o.seen == ["t2"]


@pytest.mark.parametrize(
    "change",
    [
        lambda obs: obs.remove(obs[-1]),
        lambda obs: obs.pop(),
        lambda obs: obs.clear(),
        lambda obs: obs.__delitem__(-1),
        lambda obs: obs.__setitem__(-1, Observer()),
        lambda obs: obs.__imul__(0),
    ],
    ids=["remove", "pop", "clear", "delitem", "setitem", "imul"],
)
def test_observers_wants_follows_a_removed_observer(change) -> None:
    from vtc.observer import _Observers

    o = _Arriving()
    obs = _Observers([Observer(), o])
    assert obs.wants("arriving")
    change(obs)
    assert not obs.wants("arriving")
    Requests(vtc.Scheduler(M=1000), obs).submit("a", None, "t1", 10)
    assert o.seen == []


@pytest.mark.parametrize(
    ("prompt_len", "n"),
    [(1, 1), (1000, 1000), (0, 1), (-5, 1), (1001, 1000), (True, 1), (7.9, 7), (2**80, 1000)],
)
def test_submit_clamps_the_prompt_as_the_core_needs(prompt_len, n) -> None:
    """An int prompt in [1, M] goes to the core as it is; anything else is
    clamped into it (the fast path must not change a value)."""
    core = vtc.Scheduler(M=1000)
    t = Requests(core).submit("a", None, "t1", prompt_len)
    assert t.prompt_len == n
    assert core.status(t.rid) == WAITING


class _SubmitRecorder:
    """A core whose ``submit`` calls are recorded (everything else: the core's)."""

    def __init__(self, core: vtc.Scheduler) -> None:
        self.core = core
        self.bands: list[int] = []

    def __getattr__(self, name: str):
        return getattr(self.core, name)

    def submit(self, rid, client, prompt_len, **kwargs):
        self.bands.append(kwargs.get("priority", 0))
        return self.core.submit(rid, client, prompt_len, **kwargs)


@pytest.mark.parametrize("priority", [0, 5, -5, 2**63 - 1, -(2**63), 2**70, -(2**70), True, 2.5])
def test_submit_priority_is_the_core_band(priority) -> None:
    """The band the core gets is the priority clamped to 64 bits (an int in range
    as it is, the default band 0 left out)."""
    core = _SubmitRecorder(vtc.Scheduler(M=1000))
    Requests(core).submit("x", None, "t2", 10, priority=priority)  # type: ignore[arg-type]
    assert core.bands == [min(max(int(priority), -(2**63)), 2**63 - 1)]
    assert type(core.bands[0]) is int


def test_first_tenant_str_rule() -> None:
    class Name(str):
        pass

    assert first_tenant(["", "a" * 129, "b"]) == "b"
    assert first_tenant(["a" * 128]) == "a" * 128
    name = Name("sub")
    assert first_tenant([name]) is name
    assert first_tenant([None, True, 7]) == "7"
    assert first_tenant(["", None]) is None
