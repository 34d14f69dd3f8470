"""``Scheduler.tokens()`` / ``client_tokens(client)``: the raw prompt and decode
tokens each client was charged, counted in the core (and in ``vtc.reference``),
whatever they cost."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import vtc
from vtc import reference
from vtc.adapter import Adapter, Observer
from vtc.config import EngineConfig

BOTH = [vtc.Scheduler, reference.Scheduler]


def out(key, n):
    return SimpleNamespace(request_id=key, new_token_ids=[0] * n)


@pytest.mark.parametrize("cls", BOTH)
def test_prompt_and_decode_are_counted_and_cached_tokens_are_not(cls):
    s = cls(10_000)
    assert s.tokens() == {} and s.client_tokens("a") == (0, 0)
    s.submit(1, "a", 400, cached_len=300)
    s.submit(2, "a", 50)
    s.submit(3, "b", 20)
    assert s.tokens() == {"a": (0, 0), "b": (0, 0)}  # submitting charges nothing
    assert s.schedule() == [1, 3, 2]
    assert s.tokens() == {"a": (100 + 50, 0), "b": (20, 0)}
    s.decode()
    s.decode([1, 3], [4, 0])
    s.decode([2, 3], 2)
    assert s.tokens() == {"a": (150, 1 + 1 + 4 + 2), "b": (20, 1 + 2)}
    assert (s.client_tokens("a"), s.client_tokens("b")) == ((150, 8), (20, 3))
    s.finish(1)
    s.cancel(3)
    assert s.tokens() == {"a": (150, 8), "b": (20, 3)}  # nothing is taken back
    assert all(type(x) is int for t in s.tokens().values() for x in t)


@pytest.mark.parametrize("cls", BOTH)
def test_pop_counts_the_hit_the_engine_reports_at_admission(cls):
    s = cls(10_000)
    s.submit(1, 7, 200, cached_len=10)
    s.submit(2, 7, 60, cached_len=60)
    s.submit(3, 7, 30)
    assert s.pop(cached_len=150) == 1  # replaces the hit given at submit
    assert s.pop() == 2  # wholly cached: nothing computed, nothing counted
    assert s.client_tokens(7) == (50, 0)
    with pytest.raises(vtc.InvalidArgumentError):
        s.pop(cached_len=31)  # refused: nothing admitted, nothing counted
    assert s.client_tokens(7) == (50, 0)
    assert s.pop(cached_len=30) == 3
    assert s.client_tokens(7) == (50, 0)


@pytest.mark.parametrize("cls", BOTH)
def test_a_preempted_request_is_not_counted_again(cls):
    s = cls(10_000)
    s.submit(1, "a", 100, cached_len=30)
    s.schedule()
    s.decode([1], 4)
    s.preempt(1)
    assert s.schedule() == [1]  # re-admitted: recomputed, not charged
    assert s.client_tokens("a") == (70, 4)
    s.preempt(1)
    assert s.pop(cached_len=0) == 1
    assert s.client_tokens("a") == (70, 4)
    # decode() preempting by itself: the victim grows no token this step
    s = cls(25)
    s.submit(1, "x", 12)
    s.submit(2, "y", 11)
    s.schedule()
    assert s.decode() == []
    assert s.decode() == [1]
    assert s.tokens() == {"x": (12, 1), "y": (11, 2)}
    assert s.schedule() == []  # x does not fit again yet
    s.finish(2)
    assert s.schedule() == [1]
    s.decode()
    assert s.tokens() == {"x": (12, 2), "y": (11, 2)}


@pytest.mark.parametrize("cls", BOTH)
def test_a_failing_call_counts_nothing(cls):
    s = cls(12)
    s.submit(1, "a", 10)
    s.submit(2, "b", 1)
    s.schedule()
    for args in ([1, 99], 1), ([1, 1], 1), ([1, 2], [1, -1]), ([1, 2], [1]):
        with pytest.raises(vtc.SchedulerError):
            s.decode(*args)
    assert s.tokens() == {"a": (10, 0), "b": (1, 0)}
    assert s.decode() == [1]  # 13 > 12: a (the larger counter) is evicted
    s.finish(2)
    assert s.schedule() == [1]
    s.decode()
    s.decode()
    with pytest.raises(vtc.CapacityError):
        s.decode()  # a alone cannot grow: nothing changes
    assert s.tokens() == {"a": (10, 2), "b": (1, 1)}


@pytest.mark.parametrize("cls", BOTH)
def test_a_prediction_is_counted_when_it_is_charged(cls):
    s = cls(10_000)
    s.submit(1, "a", 100, cached_len=20, predicted_output=10)
    s.schedule()
    assert s.client_tokens("a") == (80, 10)  # the counter was charged 80 + 2 * 10
    s.decode([1], 8)
    assert s.client_tokens("a") == (80, 10)  # within the prediction: paid already
    s.decode([1], 5)
    assert s.client_tokens("a") == (80, 13)
    s.submit(2, "a", 10, predicted_output=50)
    s.schedule()
    s.decode([2], 5)
    s.finish(2)  # 45 refunded as credit: not taken back from the tally
    assert s.credit("a") > 0.0 and s.client_tokens("a") == (90, 63)
    s = cls(10_000, predictor="mean")
    s.submit(1, "a", 10)
    s.schedule()
    s.decode([1], 6)
    s.finish(1)
    s.submit(2, "a", 10)  # predicted 6 (the mean), charged at admission
    s.schedule()
    assert s.client_tokens("a") == (20, 12)
    s.decode([2], 7)
    assert s.client_tokens("a") == (20, 13)


@pytest.mark.parametrize("cls", BOTH)
@pytest.mark.parametrize(
    "kwargs",
    [
        {"wp": 0.0, "wq": 0.0},
        {"wp": 1e9, "wq": 0.5},
        {"cost": vtc.QuadraticCost()},
        {"cost": vtc.ContextCost(1.0, 2.0, 0.1)},
        {"cost": "quadratic"},
    ],
)
def test_prices_costs_and_weights_do_not_change_the_counts(cls, kwargs):
    """Under fcfs the counters decide nothing: every configuration admits,
    preempts and decodes the same requests, so the counts must be equal."""

    def run(weights, **kw):
        s = cls(300, policy="fcfs", **kw)
        for client, w in weights.items():
            s.set_weight(client, w)
        for rid in range(40):
            s.submit(rid, "xyz"[rid % 3], 20 + (7 * rid) % 90, cached_len=rid % 15)
        for step in range(300):
            s.schedule()
            s.decode()
            running = s.running()
            if running and step % 5 == 0:
                s.decode(running[:2], 3)
            if running and step % 7 == 0:
                s.finish(running[0])
        return s.tokens(), s.services()

    want, services = run({})
    assert all(p > 0 and d > 0 for p, d in want.values())
    # linear, weight 1: the service is exactly the tokens' price (wp=1, wq=2)
    assert services == {c: p + 2.0 * d for c, (p, d) in want.items()}
    for weights in ({}, {"x": 4.0, "y": 1e-6}, {"z": 1e6}):
        got, services = run(weights, **kwargs)
        assert got == want
        assert services != {c: p + 2.0 * d for c, (p, d) in want.items()}


def test_decode_outputs_counts_what_decode_counts():
    keys = [f"req-{i}" for i in range(20)]
    ids = {k: 1000 + i for i, k in enumerate(keys)}
    counts = [i % 4 for i in range(20)]
    a, b = vtc.Scheduler(1_000_000), vtc.Scheduler(1_000_000)
    for s in (a, b):
        for i, rid in enumerate(ids.values()):
            s.submit(rid, f"c{i % 3}", 10 + i)
        s.schedule()
    a.decode_outputs([out(k, n) for k, n in zip(keys, counts)], ids)
    b.decode(list(ids.values()), counts)
    assert a.tokens() == b.tokens()
    assert sum(d for _, d in a.tokens().values()) == sum(counts)
    # missing="hash": requests submitted as key_id(key)
    c = vtc.Scheduler(1_000)
    c.submit(vtc.key_id("k"), "t", 5)
    c.schedule()
    c.decode_outputs([out("k", 3)], {}, missing="hash")
    assert c.client_tokens("t") == (5, 3)
    # all or nothing: an output of a request not running charges nothing
    before = a.tokens()
    with pytest.raises(vtc.UnknownRequestError):
        a.decode_outputs([out(keys[0], 2), out("nobody", 1)], ids)
    a.preempt(ids[keys[1]])
    with pytest.raises(vtc.RequestStateError):
        a.decode_outputs([out(keys[0], 2), out(keys[1], 1)], ids)
    assert a.tokens() == before


def test_a_forgotten_client_loses_its_tally():
    s = vtc.Scheduler(1000)
    s.submit(1, "a", 10)
    s.submit(2, "b", 500)
    s.schedule()
    s.decode([1], 3)
    s.finish(1)
    assert s.client_tokens("a") == (10, 3)
    assert s.forget_idle() == 1
    assert s.tokens() == {"b": (500, 0)}  # the others keep theirs
    assert s.client_tokens("a") == (0, 0)  # unknown again
    s.submit(3, "a", 7)  # a new client, perhaps at the forgotten id
    s.schedule()
    assert s.tokens() == {"a": (7, 0), "b": (500, 0)}


def test_a_restored_scheduler_starts_every_tally_at_zero():
    s = vtc.Scheduler(1000)
    s.set_weight("w", 2.0)
    for rid, client in enumerate(["a", 5, "a"]):
        s.submit(rid, client, 10 + rid)
    s.schedule()
    s.decode()
    data = s.snapshot()
    restored = vtc.Scheduler.from_snapshot(data)
    assert restored.counters() == s.counters()
    assert restored.tokens() == {"a": (0, 0), 5: (0, 0), "w": (0, 0)}
    assert s.tokens() == {"a": (10 + 12, 2), 5: (11, 1), "w": (0, 0)}
    assert restored.snapshot() == vtc.Scheduler.from_snapshot(data).snapshot()
    restored.submit(10, 5, 4)
    restored.schedule()
    assert restored.client_tokens(5) == (4, 0)


@pytest.mark.parametrize("cls", BOTH)
def test_the_same_clients_as_counters_and_the_same_argument_errors(cls):
    s = cls(100)
    s.set_weight("w", 2.0)
    s.raise_counter(3, 50.0)
    s.submit(1, "a", 10)
    assert set(s.tokens()) == set(s.counters()) == {"w", 3, "a"}
    assert s.client_tokens("never") == (0, 0)
    with pytest.raises(TypeError):
        s.client_tokens(1.5)
    with pytest.raises(TypeError):
        s.client_tokens(True)
    with pytest.raises(vtc.InvalidArgumentError):
        s.client_tokens(2**63)


def test_the_core_counts_what_an_adapter_observer_sums_in_python():
    """What TenantMetrics adds up from ``admitted`` and ``charged`` (one dict
    update per charged request) is what the core now counts by itself,
    through every charging path of the adapter: one ``decode_outputs`` call,
    the output-by-output fallback, and owed tokens charged at re-admission."""

    class Summer(Observer):
        def __init__(self):
            self.tokens: dict = {}

        def add(self, tenant, prompt=0, decode=0):
            p, d = self.tokens.get(tenant, (0, 0))
            self.tokens[tenant] = (p + prompt, d + decode)

        def admitted(self, t, prompt_tokens):
            self.add(t.tenant, prompt=prompt_tokens)

        def charged(self, produced):
            for t, n in produced:
                self.add(t.tenant, decode=n)

    summer = Summer()
    core = vtc.Scheduler(M=10_000)
    adapter = Adapter(core, EngineConfig(), observers=[summer], forget_every=10**6)
    reqs = adapter.requests
    a = adapter.arrive("a1", None, ["a"], 10)
    b = adapter.arrive("b1", None, ["b"], 8)
    reqs.admit(a, 4)
    reqs.admit(b, 0)
    reqs.charge_outputs([out("a1", 2), out("b1", 1)])  # one call
    reqs.put_back(b)  # preempted
    reqs.charge_outputs([out("a1", 1), out("b1", 3)])  # refused whole: one by one, b owes
    reqs.charge_totals([("a1", 5)])
    reqs.admit(b, 8)  # back: no prompt, then the 3 tokens it owed
    reqs.charge_keys([("b1", 2), ("a1", 1)])
    adapter.step_done()
    assert core.tokens() == summer.tokens == {"a": (6, 2 + 1 + 5 + 1), "b": (8, 1 + 3 + 2)}
