"""Accounting beyond tokens (issue 6): cost functions, prefix caching, preemption,
per-client memory caps and length prediction, on the Rust core and the reference."""

from __future__ import annotations

import math
import pickle

import pytest

import vtc
from helpers import state
from vtc import reference

BOTH = [vtc.Scheduler, reference.Scheduler]


def h_quadratic(n, q, a_p=2.1, a_q=1.0, a_pq=0.04, a_qq=0.032, c=11.46):
    return a_p * n + a_q * q + a_pq * n * q + a_qq * q * q + c


def h_context(n, q, wp=1.0, wq=2.0, beta=1 / 512):
    return wp * n + wq * q + beta * (n * q + q * (q - 1) / 2)


# ------------------------------------------------------------- cost objects


def test_cost_objects_are_frozen_values_with_constructor_reprs():
    q = vtc.QuadraticCost()
    assert repr(q) == "QuadraticCost(a_p=2.1, a_q=1.0, a_pq=0.04, a_qq=0.032, c=11.46)"
    assert eval(repr(q), vars(vtc)) == q
    assert hash(q) == hash(vtc.QuadraticCost(2.1, 1, 0.04, 0.032, 11.46))
    assert repr(vtc.ContextCost(beta=0.5)) == "ContextCost(wp=1.0, wq=2.0, beta=0.5)"
    assert repr(vtc.LinearCost()) == "LinearCost(wp=1.0, wq=2.0)"
    assert vtc.ContextCost().beta == 1 / 512
    assert vtc.LinearCost(1, 3) != vtc.LinearCost(1, 2)
    with pytest.raises(AttributeError):
        q.a_p = 3.0


@pytest.mark.parametrize(
    "make",
    [
        lambda: vtc.QuadraticCost(a_pq=-0.1),
        lambda: vtc.ContextCost(beta=float("nan")),
        lambda: vtc.LinearCost(wq=float("inf")),
    ],
)
def test_bad_coefficients_are_rejected(make):
    with pytest.raises(vtc.InvalidArgumentError):
        make()


@pytest.mark.parametrize("cls", BOTH)
def test_cost_argument_checks(cls):
    with pytest.raises(vtc.InvalidArgumentError):
        cls(100, 1.0, 2.0, cost=vtc.QuadraticCost())  # wp/wq and cost
    with pytest.raises(vtc.InvalidArgumentError):
        cls(100, cost="cubic")
    with pytest.raises(TypeError):
        cls(100, cost=3)


def test_scheduler_reports_its_cost():
    s = vtc.Scheduler(100, cost="quadratic", client_cap=0.5, predictor="mean")
    assert s.cost == vtc.QuadraticCost()
    assert s.client_cap == 50
    assert s.predictor == "mean"
    assert (s.wp, s.wq) == (2.1, 1.0)
    assert repr(s) == (
        "Scheduler(M=100, policy='vtc', cost=QuadraticCost(a_p=2.1, a_q=1.0, a_pq=0.04, "
        "a_qq=0.032, c=11.46), client_cap=50, predictor='mean')"
    )
    assert vtc.Scheduler(100).cost == vtc.LinearCost(1.0, 2.0)
    assert repr(vtc.Scheduler(100)) == "Scheduler(M=100, wp=1.0, wq=2.0, policy='vtc')"


# -------------------------------------------------------------- linear cost


@pytest.mark.parametrize("cls", BOTH)
def test_linear_cost_object_is_bit_for_bit_plain_vtc(cls):
    a, b = cls(500, 0.5, 3.0), cls(500, cost=vtc.LinearCost(0.5, 3.0))
    for s in (a, b):
        s.set_weight("x", 3.0)
        for rid in range(12):
            s.submit(rid, "xyz"[rid % 3], 17 + 5 * rid, cached_len=rid % 4)
        for _ in range(30):
            s.schedule()
            s.decode()
        s.decode(s.running(), 3)
    assert state(a) == state(b)


# ---------------------------------------------------------- quadratic cost


@pytest.mark.parametrize("cls", BOTH)
def test_quadratic_charges_h_incrementally(cls):
    s = cls(10_000, cost=vtc.QuadraticCost())
    s.submit(1, "a", 300, cached_len=100)
    s.schedule()
    # prefill: h(computed, 0)
    assert s.counter("a") == pytest.approx(h_quadratic(200, 0))
    for _ in range(7):
        s.decode()
    s.decode([1], [13])  # several tokens at once: the sum of the increments
    # decode increments use the whole prompt (the cached prefix is still read)
    want = h_quadratic(200, 0) + h_quadratic(300, 20) - h_quadratic(300, 0)
    assert s.counter("a") == pytest.approx(want, rel=1e-12)


def test_quadratic_core_matches_reference_bit_for_bit():
    cost = vtc.QuadraticCost(2.1, 1.0, 0.04, 0.032, 11.46)
    a, b = vtc.Scheduler(4000, cost=cost), reference.Scheduler(4000, cost=cost)
    for s in (a, b):
        for rid in range(40):
            s.submit(rid, rid % 5, 10 + 7 * rid)
    for step in range(60):
        assert a.schedule() == b.schedule()
        if step % 2:
            assert a.decode() == b.decode()
        else:
            ids = a.running()
            a.decode(ids[::-1], [(i * 7) % 5 for i in ids[::-1]])
            b.decode(ids, [(i * 7) % 5 for i in ids])  # other order, same charge
        for rid in a.running()[:2]:
            a.finish(rid)
            b.finish(rid)
        assert state(a) == state(b)


# ------------------------------------------------------- context-aware cost


@pytest.mark.parametrize("cls", BOTH)
def test_context_cost_charges_more_for_long_contexts(cls):
    s = cls(100_000, cost=vtc.ContextCost(1.0, 2.0, 0.01))
    s.submit(1, "short", 256)
    s.submit(2, "long", 4096)
    s.schedule()
    s.decode()
    assert s.counter("short") == pytest.approx(256 + 2 + 0.01 * 256)
    assert s.counter("long") == pytest.approx(4096 + 2 + 0.01 * 4096)
    s.decode([1, 2], 10)
    assert s.counter("short") == pytest.approx(h_context(256, 11, beta=0.01))
    assert s.counter("long") == pytest.approx(h_context(4096, 11, beta=0.01))


# ---------------------------------------------------- prefix cache, preemption


@pytest.mark.parametrize("cls", BOTH)
def test_prefix_cache_hit_is_free_but_holds_memory(cls):
    s = cls(1000)
    s.submit(1, "hit", 400, cached_len=300)
    s.submit(2, "miss", 400)
    s.schedule()
    assert s.counter("hit") == 100.0 and s.counter("miss") == 400.0
    assert s.occupancy == 800
    s.submit(3, "late", 100)
    assert s.pop(cached_len=100) == 3  # the hit is known only at admission: fully cached
    assert s.counter("late") == 400.0  # lifted to the last-left client, charged nothing


@pytest.mark.parametrize("cls", BOTH)
@pytest.mark.parametrize("cost", [None, vtc.QuadraticCost(), vtc.ContextCost()])
def test_preempted_request_is_not_charged_again(cls, cost):
    s = cls(10_000, cost=cost) if cost else cls(10_000)
    s.submit(1, "a", 100)
    s.schedule()
    s.decode([1], 5)
    before = s.counter("a")
    s.preempt(1)
    assert s.status(1) == "waiting" and s.occupancy == 0
    assert s.schedule() == [1]
    assert s.counter("a") == before
    assert s.occupancy == 105


# ------------------------------------------------------------------ the cap


@pytest.mark.parametrize("cls", BOTH)
def test_capped_client_is_left_out_of_selection(cls):
    s = cls(1000, client_cap=250)
    for rid in range(5):
        s.submit(rid, "hog", 100)
    s.submit(10, "other", 100)
    s.submit(11, "other", 100)
    assert s.schedule() == [0, 10, 1, 11]
    assert s.num_waiting == 3 and s.occupancy == 400
    s.finish(0)
    assert s.schedule() == [2]


@pytest.mark.parametrize("cls", BOTH)
def test_cap_as_fraction_and_lone_large_request(cls):
    s = cls(1000, client_cap=0.1)
    assert s.client_cap == 100
    s.submit(1, "a", 400)  # larger than the cap: runs alone
    s.submit(2, "a", 10)
    assert s.schedule() == [1]
    for bad in (0, -5, 0.0, 1.5):
        with pytest.raises(vtc.InvalidArgumentError):
            cls(1000, client_cap=bad)


# ---------------------------------------------------------------- prediction


@pytest.mark.parametrize("cls", BOTH)
def test_prediction_is_charged_up_front_then_only_beyond(cls):
    s = cls(10_000)
    s.submit(1, "a", 100, predicted_output=10)
    s.schedule()
    assert s.counter("a") == 120.0
    s.decode([1], 8)
    assert s.counter("a") == 120.0
    s.decode([1], 5)
    assert s.counter("a") == 126.0
    s.finish(1)
    assert s.credit("a") == 0.0


@pytest.mark.parametrize("cls", BOTH)
def test_over_prediction_becomes_credit_counters_never_decrease(cls):
    s = cls(10_000, policy="lcf")
    s.submit(1, "a", 100, predicted_output=50)
    s.schedule()
    s.decode([1], 10)
    s.finish(1)
    assert s.counter("a") == 200.0 and s.credit("a") == 80.0
    s.submit(2, "a", 50)
    s.schedule()
    assert s.counter("a") == 200.0 and s.credit("a") == 30.0
    s.decode([2], 20)
    assert s.counter("a") == 210.0 and s.credit("a") == 0.0
    assert s.service("a") == 210.0


@pytest.mark.parametrize("cls", BOTH)
def test_quadratic_refund_is_the_unused_increments(cls):
    s = cls(10_000, cost="quadratic", policy="lcf")
    s.submit(1, "a", 100, predicted_output=30)
    s.schedule()
    assert s.counter("a") == pytest.approx(h_quadratic(100, 30))
    s.decode([1], 12)
    s.finish(1)
    assert s.credit("a") == pytest.approx(h_quadratic(100, 30) - h_quadratic(100, 12))


@pytest.mark.parametrize("cls", BOTH)
def test_mean_predictor(cls):
    s = cls(10_000, predictor="mean")
    s.submit(1, "a", 10)
    s.schedule()
    assert s.counter("a") == 10.0
    s.decode([1], 40)
    s.finish(1)
    s.submit(2, "a", 10, predicted_output=0)  # an explicit prediction wins
    s.submit(3, "a", 10)
    s.schedule()
    assert s.counter("a") == 90.0 + 10.0 + (10.0 + 80.0)
    with pytest.raises(vtc.InvalidArgumentError):
        s.submit(4, "a", 10, predicted_output=-1)
    with pytest.raises(vtc.InvalidArgumentError):
        cls(10, predictor="oracle")


def test_cost_objects_survive_pickle_by_value_or_refuse_cleanly():
    q = vtc.QuadraticCost(1.0, 2.0, 3.0, 4.0, 5.0)
    try:
        assert pickle.loads(pickle.dumps(q)) == q
    except TypeError:
        pass  # frozen pyclasses without __reduce__ may refuse; never silently change
    assert not math.isnan(q.c)


# ---------------------------------------------------------------- simulator


def test_accounting_experiment_runs_and_shows_each_effect():
    from vtc.sim.experiments import EXPERIMENTS, Options

    report = EXPERIMENTS["accounting"](Options(progress=False))
    tables = {t.name: t for t in report.tables}
    assert set(tables) == {
        "accounting-cost",
        "accounting-prefix",
        "accounting-preemption",
        "accounting-cap",
        "accounting-predict",
    }
    cost = {r["cost"]: r for r in tables["accounting-cost"].rows}
    # each cost equalises its own metric better than plain VTC does
    assert abs(cost["context"]["context_share"] - 0.5) < abs(
        cost["linear (plain vtc)"]["context_share"] - 0.5
    )
    assert abs(cost["quadratic"]["quadratic_share"] - 0.5) < abs(
        cost["linear (plain vtc)"]["quadratic_share"] - 0.5
    )
    prefix = tables["accounting-prefix"].rows
    assert prefix[0]["shared_share"] < 0.4 and abs(prefix[1]["shared_share"] - 0.5) < 0.05
    for row in tables["accounting-preemption"].rows:
        assert row["preemptions"] > 0 and row["max_overcharge"] == 0.0
    cap = tables["accounting-cap"].rows
    assert cap[0]["utilization"] > cap[1]["utilization"] > cap[2]["utilization"]


def test_snapshot_restores_the_options_and_arguments_replace_them():
    s = vtc.Scheduler(1000, cost="context", client_cap=0.5)
    s.submit(1, "a", 100)
    s.schedule()
    s.decode()
    data = s.snapshot()
    plain = vtc.Scheduler.from_snapshot(data)  # a version 2 snapshot stores them
    assert plain.cost == s.cost and plain.client_cap == 500 and plain.predictor == "none"
    again = vtc.Scheduler.from_snapshot(data, cost=s.cost, client_cap=0.5, predictor="mean")
    assert again.cost == s.cost and again.client_cap == 500 and again.predictor == "mean"
    assert again.counter("a") == s.counter("a")
