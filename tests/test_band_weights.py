"""Weighted priority bands (``band_weights={priority: weight}``).

Bands share service in proportion to their weights instead of taking turns by
urgency: a band counter per band (actual service / band weight), the least
band counter first, then VTC among the band's clients; a band entering the
backlog is lifted as a client is. Run against every implementation in ``impl``.
"""

from __future__ import annotations

import random
from fractions import Fraction

import pytest

import vtc
from helpers import state
from vtc import reference
from vtc.errors import InvalidArgumentError

POLICIES = ["vtc", "lcf", "fcfs"]


@pytest.fixture(params=[reference.Scheduler, vtc.Scheduler], ids=["reference", "core"])
def impl(request):
    return request.param


def _serve(s, n: int, tokens: int = 10) -> list:
    """Admit one request at a time, generate ``tokens`` for it, finish it; the
    clients' names of what was served, in order."""
    served = []
    for _ in range(n):
        rid = s.pop()
        if rid is None:
            break
        served.append(rid)
        s.decode([rid], [tokens])
        s.finish(rid)
    return served


def _backlog(s, plan: dict, n: int, prompt: int = 10) -> dict:
    """``n`` requests for every (client, priority) of ``plan``; ids by owner."""
    owner = {}
    rid = 1000 * (len(plan) + 1)
    for _ in range(n):
        for client, priority in plan.items():
            rid += 1
            s.submit(rid, client, prompt, priority=priority)
            owner[rid] = (client, priority)
    return owner


def test_strict_bands_by_default(impl):
    s = impl(100)
    assert s.band_weights() is None
    assert s.band_counters() == {}
    owner = _backlog(s, {"u": 0, "b": 1}, 5)
    assert [owner[r][1] for r in _serve(s, 10)] == [0] * 5 + [1] * 5


@pytest.mark.parametrize(
    "weights, share", [({0: 4, 1: 1}, 0.8), ({0: 1, 1: 1}, 0.5), ({1: 3}, 0.25)]
)
def test_two_backlogged_bands_share_service_by_weight(impl, weights, share):
    s = impl(1000, band_weights=weights)
    owner = _backlog(s, {"u": 0, "b": 1}, 100)
    served = _serve(s, 100)
    urgent = sum(owner[r][1] == 0 for r in served)
    assert urgent == pytest.approx(100 * share, abs=2)


def test_band_counters_are_service_over_band_weight(impl):
    # wp = 1, wq = 2: a request of prompt 10 that generates 10 tokens costs 30
    s = impl(1000, band_weights={0: 4, 1: 1})
    s.set_weight("b", 3.0)  # a client's weight does not enter its band's counter
    s.submit(1, "u", 10, priority=0)
    s.submit(2, "b", 10, priority=1)
    assert s.band_counters() == {0: 0.0, 1: 0.0}
    assert s.schedule() == [1, 2]
    assert s.band_counters() == {0: 10 / 4, 1: 10.0}
    s.decode([1, 2], [10, 10])
    assert s.band_counters() == {0: 30 / 4, 1: 30.0}
    assert s.counter("b") == 10.0  # 30 / client weight 3


def test_predicted_output_is_not_charged_to_the_band(impl):
    s = impl(1000, band_weights={})
    s.submit(1, "a", 10, predicted_output=50)
    s.schedule()
    assert s.counter("a") == 10 + 2 * 50
    assert s.band_counters() == {0: 10.0}  # actual service only
    s.decode([1], [5])
    assert s.counter("a") == 110.0
    assert s.band_counters() == {0: 20.0}


def test_a_band_entering_the_backlog_is_lifted_to_the_least_band_counter(impl):
    s = impl(1000, band_weights={0: 1, 1: 1, 2: 1})
    owner = _backlog(s, {"a": 0, "b": 1}, 3)
    _serve(s, 4)  # two each
    assert s.band_counters() == {0: 60.0, 1: 60.0}
    s.submit(1, "c", 10, priority=2)  # a new band banks nothing
    assert s.band_counters()[2] == 60.0
    assert len(owner) == 6


def test_an_idle_band_banks_nothing(impl):
    s = impl(1000, band_weights={0: 1, 1: 1})
    s.submit(1, "b", 10, priority=1)
    s.schedule()  # band 1 runs, nothing waits in it
    owner = _backlog(s, {"a": 0}, 20)
    _serve(s, 10)  # band 0 alone: 10 x 30
    s.decode([1], [5])
    s.submit(2, "b", 10, priority=1)  # band 1 returns, still holding a request
    counters = s.band_counters()
    assert counters[1] == counters[0] == 310.0  # band 0 started at band 1's 10
    assert len(owner) == 20


def test_with_no_backlog_a_new_band_starts_at_the_last_band_to_leave(impl):
    s = impl(1000, band_weights={})
    s.submit(1, "a", 10, priority=0)
    assert s.schedule() == [1]
    s.decode([1], [45])
    s.finish(1)  # band 0 leaves for good at 100
    assert s.band_counters() == {}
    s.submit(2, "b", 10, priority=5)
    assert s.band_counters() == {5: 100.0}


@pytest.mark.parametrize("policy", ["lcf", "fcfs"])
def test_no_band_lift_outside_vtc(impl, policy):
    s = impl(1000, policy=policy, band_weights={})
    s.submit(1, "a", 10, priority=0)
    s.submit(2, "a", 10, priority=0)
    s.pop()
    s.submit(3, "b", 10, priority=1)
    assert s.band_counters() == {0: 10.0, 1: 0.0}
    assert s.peek() == 3


def test_preemption_charges_the_band_once(impl):
    s = impl(29, band_weights={0: 2})
    s.submit(1, "a", 14, priority=0)
    s.submit(2, "b", 14, priority=1)
    assert s.schedule() == [1, 2]
    assert s.band_counters() == {0: 7.0, 1: 14.0}
    victims = s.decode()  # 28 + 2 > 30: the least urgent band's request goes
    assert victims == [2]
    assert s.band_counters() == {0: 8.0, 1: 14.0}
    s.finish(1)
    assert s.schedule() == [2]  # back without paying its prompt again
    assert s.band_counters() == {1: 14.0}


def test_the_band_counter_goes_with_the_bands_last_request(impl):
    s = impl(1000, band_weights={})
    for rid, p in enumerate(random.Random(3).choices([0, 1, 2, -9], k=40)):
        s.submit(rid, "a", 5, priority=p)
    popped = [s.pop() for _ in range(10)]
    s.set_aside()
    assert len(s.band_counters()) == 4
    for rid in popped:
        s.finish(rid)
    for rid in set(range(40)) - set(popped):
        s.cancel(rid)
    assert s.band_counters() == {}


def test_weights_change_and_modes_switch_with_requests_live(impl):
    s = impl(1000)
    _backlog(s, {"u": 0, "b": 1}, 3)
    s.set_band_weights({0: 4})
    assert s.band_counters() == {0: 0.0, 1: 0.0}
    _serve(s, 2)
    assert s.band_counters() == {0: 7.5, 1: 30.0}
    before = s.band_counters()
    s.set_band_weights({0: 1, 1: 2})  # counters kept, later charges use the new weights
    assert s.band_counters() == before
    s.set_band_weights(None)
    assert s.band_weights() is None and s.band_counters() == {}
    assert s.peek() is not None and s.num_waiting == 4


@pytest.mark.parametrize(
    "bad, error",
    [
        ([(0, 1.0)], TypeError),
        ({0: 0.0}, InvalidArgumentError),
        ({0: float("nan")}, InvalidArgumentError),
        ({0: 1e7}, InvalidArgumentError),
        ({0: 2.0, 1: -1}, InvalidArgumentError),
        ({"x": 2.0}, TypeError),
        ({1.5: 2.0}, TypeError),
        ({True: 2.0}, TypeError),
        ({2**63: 2.0}, InvalidArgumentError),
        ({0: "2"}, TypeError),
    ],
)
def test_bad_band_weights_raise_and_change_nothing(impl, bad, error):
    with pytest.raises(error):
        impl(100, band_weights=bad)
    s = impl(100, band_weights={0: 3.0})
    s.submit(1, "a", 10, priority=1)
    before = (state(s, [1]), s.band_weights(), s.band_counters())
    with pytest.raises(error):
        s.set_band_weights(bad)
    assert (state(s, [1]), s.band_weights(), s.band_counters()) == before


def test_weights_of_any_real_and_index_type(impl):
    import numpy as np

    s = impl(100, band_weights={np.int64(-3): Fraction(1, 2), 7: np.float32(2.0), 1: 3})
    assert s.band_weights() == {-3: 0.5, 1: 3.0, 7: 2.0}


def test_a_restored_scheduler_takes_band_weights():
    s = vtc.Scheduler(100, band_weights={0: 2})
    s.submit(1, "a", 10)
    s.schedule()
    r = vtc.Scheduler.from_snapshot(s.snapshot(), band_weights={0: 2})
    assert r.band_weights() == {0: 2.0}
    assert r.counter("a") == 10.0
    assert r.band_counters() == {}  # like the batch, band counters restart
    assert "band_weights={0: 2.0}" in repr(r)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("seed", range(6))
def test_backlogged_bands_stay_within_the_bound(policy, seed):
    """Random arrivals into three weighted bands under a full batch, through the
    core and the reference alike: while two bands are both backlogged their
    counters never drift apart by more than 2 * max(wp * L, wq * M) / min weight
    (vtc; lcf and fcfs carry no bound)."""
    rng = random.Random(seed)
    M, L = 200, 20
    weights = {0: 4.0, 1: 1.0, 2: 2.0}
    core = vtc.Scheduler(M, policy=policy, band_weights=weights)
    ref = reference.Scheduler(M, policy=policy, band_weights=weights)
    bound = 2 * max(1.0 * L, 2.0 * M) / min(weights.values())
    rid = 0
    worst = 0.0
    for _ in range(400):
        for _ in range(rng.randint(0, 3)):
            rid += 1
            args = (rid, rng.choice("abcd"), rng.randint(1, L))
            priority = rng.choice([0, 1, 2])
            core.submit(*args, priority=priority)
            ref.submit(*args, priority=priority)
        assert core.schedule() == ref.schedule()
        assert core.decode() == ref.decode()
        for r in list(core.running()):
            if rng.random() < 0.15:
                core.finish(r)
                ref.finish(r)
        counters = core.band_counters()
        assert counters == ref.band_counters()
        waiting = {p for c in ref._clients.values() for p in c.bands}
        if len(waiting) >= 2:
            vals = [counters[p] for p in waiting]
            worst = max(worst, max(vals) - min(vals))
    if policy == "vtc":
        assert 0 < worst <= bound
    assert rid > 300
