"""Strict priority bands (``submit(..., priority=p)``, smaller is more urgent).

Selection takes the most urgent band first and runs VTC (or lcf/fcfs) inside
it; the lift is per band; preemption evicts from the least urgent band first;
with every priority equal nothing changes. Run against every implementation
in ``impl``.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

import vtc
from helpers import state
from vtc import reference
from vtc.errors import CapacityError, InvalidArgumentError

POLICIES = ["vtc", "lcf", "fcfs"]


@pytest.fixture(params=[reference.Scheduler, vtc.Scheduler], ids=["reference", "core"])
def impl(request):
    return request.param


# -- 1. strict order between bands ---------------------------------------------


@pytest.mark.parametrize("policy", POLICIES)
def test_a_more_urgent_request_submitted_later_goes_first(impl, policy):
    s = impl(100, policy=policy)
    s.submit(1, "a", 10)
    s.submit(2, "b", 10)
    s.raise_counter("u", 1000.0)  # far more served than a and b
    s.submit(3, "u", 10, priority=-1)
    assert s.counter("u") == 1000.0
    assert s.peek() == 3
    assert s.schedule() == [3, 1, 2]


@pytest.mark.parametrize("policy", POLICIES)
def test_no_skipping_across_bands(impl, policy):
    s = impl(100, policy=policy)
    s.submit(1, "a", 60)
    assert s.schedule() == [1]
    s.submit(2, "b", 50, priority=-5)  # urgent, does not fit beside request 1
    s.submit(3, "c", 10, priority=0)  # would fit, but is less urgent
    s.submit(4, "d", 10, priority=3)
    assert s.peek() == 2
    assert s.schedule() == []
    assert s.num_waiting == 3
    s.finish(1)
    assert s.schedule() == [2, 3, 4]


@pytest.mark.parametrize("policy", POLICIES)
def test_pop_and_set_aside_take_the_most_urgent_band(impl, policy):
    s = impl(100, policy=policy)
    s.submit(1, "a", 10, priority=2)
    s.submit(2, "b", 10, priority=1)
    s.submit(3, "a", 10, priority=1)
    assert s.set_aside() == 2  # band 1: b's head (seq 2) before a's (seq 3)
    assert s.pop() == 3
    assert s.pop() == 1
    assert s.pop() is None
    s.put_back(2)
    assert s.pop() == 2


# -- 2. VTC inside a band ------------------------------------------------------


def test_inside_a_band_the_least_counter_goes_first(impl):
    s = impl(1000)
    s.submit(1, "w", 10, priority=1)  # least urgent; its counter stays the smallest
    for rid, client in [(2, "x"), (3, "x"), (4, "x"), (5, "y"), (6, "y")]:
        s.submit(rid, client, 10 if client == "x" else 25)
    # x: 0 -> 10; y: 0 -> 25; x: 10 -> 20 -> 30; y: 25 -> 50; then band 1: w
    assert s.schedule() == [2, 5, 3, 4, 6, 1]
    assert s.counters() == {"w": 10.0, "x": 30.0, "y": 50.0}


def test_a_less_urgent_band_waits_while_the_urgent_one_is_served_fairly(impl):
    s = impl(1000)
    s.submit(1, "w", 10, priority=1)
    s.submit(2, "x", 10)
    s.submit(3, "x", 10)
    s.submit(4, "y", 10)
    s.submit(5, "y", 10)
    admitted = [s.pop() for _ in range(4)]
    assert admitted == [2, 4, 3, 5]  # x and y alternate inside band 0
    assert s.counter("w") == 0.0  # the smallest counter, yet not admitted until now
    assert s.pop() == 1


# -- 3. the lift is per band ----------------------------------------------------


def test_the_lift_takes_the_floor_of_the_band_entered(impl):
    s = impl(1000)
    s.submit(1, "x", 10, priority=0)
    s.submit(2, "y", 10, priority=1)
    s.raise_counter("x", 100.0)  # band 0's min
    s.raise_counter("y", 40.0)  # band 1's min, and the global min
    s.submit(3, "n", 10, priority=0)
    assert s.counter("n") == 100.0  # band 0's floor, not the global 40
    s.submit(4, "m", 10, priority=1)
    assert s.counter("m") == 40.0
    # m is backlogged (band 1) but has nothing in band 0: entering it lifts it
    s.submit(5, "m", 10, priority=0)
    assert s.counter("m") == 100.0
    # a second request in a band it already waits in: no lift
    s.raise_counter("y", 45.0)
    s.submit(6, "y", 10, priority=1)
    assert s.counter("y") == 45.0
    # never moved backwards
    s.raise_counter("h", 500.0)
    s.submit(7, "h", 10, priority=0)
    assert s.counter("h") == 500.0


def test_an_empty_band_lifts_to_the_min_over_every_band(impl):
    s = impl(1000)
    s.submit(1, "x", 10, priority=0)
    s.submit(2, "y", 10, priority=1)
    s.raise_counter("x", 100.0)
    s.raise_counter("y", 40.0)
    s.submit(3, "e", 10, priority=7)  # nobody waits in band 7
    assert s.counter("e") == 40.0


def test_the_global_floor_counts_the_submitting_client_itself(impl):
    """Band p empty: the floor is the min over all backlogged clients, the
    submitter included when it waits in another band, so it is not lifted."""
    s = impl(1000)
    s.submit(1, "x", 10, priority=1)
    s.submit(2, "y", 10, priority=1)
    s.raise_counter("x", 5.0)
    s.raise_counter("y", 100.0)
    s.submit(3, "x", 10, priority=0)
    assert s.counter("x") == 5.0
    assert s.schedule() == [3, 1, 2]


def test_with_no_backlog_the_lift_uses_the_client_that_left_last(impl):
    s = impl(1000)
    s.submit(1, "a", 10, priority=0)
    s.submit(2, "a", 30, priority=4)
    assert s.schedule() == [1, 2]  # a leaves band 0 (still backlogged), then the backlog
    assert s.counter("a") == 40.0
    s.submit(3, "n", 10, priority=9)
    assert s.counter("n") == 40.0


@pytest.mark.parametrize("policy", ["lcf", "fcfs"])
def test_no_lift_outside_vtc(impl, policy):
    s = impl(1000, policy=policy)
    s.submit(1, "x", 10, priority=0)
    s.raise_counter("x", 100.0)
    s.submit(2, "n", 10, priority=0)
    assert s.counter("n") == 0.0


# -- 4. preempted and put-back requests keep their band, without a lift ---------


def test_put_back_returns_to_the_head_of_its_band_without_a_lift(impl):
    s = impl(1000)
    s.submit(1, "a", 10, priority=0)
    s.submit(2, "a", 10, priority=1)
    s.submit(3, "c", 10, priority=0)
    s.raise_counter("c", 50.0)
    assert s.set_aside() == 1  # a (0) before c (50) in band 0
    assert s.peek() == 3  # a has nothing left in band 0
    s.put_back(1)
    assert s.counter("a") == 0.0  # a submit would have lifted it to c's 50
    assert s.status(1) == "waiting"
    assert s.peek() == 1  # band 0 again, not band 1 where a's head is 2
    assert s.schedule() == [1, 3, 2]


@pytest.mark.parametrize("policy", POLICIES)
def test_returned_requests_go_ahead_of_their_clients_later_ones_in_their_band(impl, policy):
    s = impl(1000, policy=policy)
    s.submit(1, "a", 10, priority=1)
    s.submit(2, "a", 10, priority=0)
    assert s.pop() == 2
    assert s.pop() == 1
    s.submit(3, "a", 10, priority=1)
    s.submit(4, "a", 10, priority=0)
    s.preempt(1)  # band 1: [1, 3]
    s.preempt(2)  # band 0: [2, 4]
    assert s.set_aside() == 2
    assert s.peek() == 4
    s.put_back(2)  # band 0: [2, 4] again
    assert s.peek() == 2
    assert s.schedule() == [2, 4, 1, 3]


def test_preempted_requests_return_to_the_head_of_their_band_without_a_lift(impl):
    s = impl(1000)
    s.submit(1, "a", 10, priority=1)
    s.submit(2, "a", 10, priority=0)
    assert s.schedule() == [2, 1]
    assert s.counter("a") == 20.0
    s.submit(3, "b", 10, priority=1)  # lifted to a's 20 (the last to leave)
    s.raise_counter("b", 100.0)
    s.preempt(1)
    assert s.counter("a") == 20.0  # no lift to band 1's floor (b's 100)
    s.submit(4, "a", 10, priority=1)  # a already waits in band 1: no lift
    assert s.counter("a") == 20.0
    s.preempt(2)
    assert s.peek() == 2  # back in band 0, ahead of band 1
    # 2 and 1 are not charged again; 4 is (a: 20 -> 30); then b
    assert s.schedule() == [2, 1, 4, 3]
    assert s.counters() == {"a": 30.0, "b": 110.0}


# -- 5. decode() growth evicts the least urgent band first ----------------------


@pytest.mark.parametrize("policy", POLICIES)
def test_growth_victims_come_from_the_least_urgent_band_first(impl, policy):
    s = impl(32, policy=policy)
    s.submit(1, "b", 10, priority=5)
    assert s.schedule() == [1]
    s.submit(2, "a", 10)
    s.submit(3, "a", 10)
    assert s.schedule() == [2, 3]
    # a has the larger counter and the latest admission: without bands 3 would go
    if policy == "vtc":
        assert s.counter("a") > s.counter("b")
    assert s.decode() == [1]
    assert s.status(1) == "waiting"
    assert s.running() == [2, 3]
    assert s.peek() == 1


def test_growth_victims_inside_a_band_follow_the_counter(impl):
    s = impl(56)
    s.submit(1, "x", 10, priority=2)
    s.submit(2, "y", 20, priority=2)
    s.submit(3, "z", 10, priority=0)
    s.submit(4, "z", 10, priority=0)
    assert s.schedule() == [3, 4, 1, 2]  # occupancy 50; z: 20, x: 10, y: 20
    s.raise_counter("x", 30.0)
    s.raise_counter("z", 1000.0)  # the most served: by counters alone z would go
    assert s.decode() == []  # 50 + 4 <= 56; x: 32, y: 22
    # 54 + 4 > 56: band 2 first, and in it x (32) before y (22), though y came later
    assert s.decode() == [1]
    assert s.running() == [3, 4, 2]
    assert s.occupancy == 46  # 54 - 11 + 3
    assert s.decode() == []


# -- client_cap: an ineligible client is out of every band ---------------------


def test_a_capped_client_is_left_out_of_every_band(impl):
    s = impl(100, client_cap=20)
    s.submit(1, "a", 15, priority=0)
    assert s.schedule() == [1]
    s.submit(2, "a", 10, priority=0)  # 15 + 10 > 20: a is ineligible
    s.submit(3, "a", 3, priority=1)  # would fit a's cap, but a is out for this call
    s.submit(4, "b", 10, priority=1)
    assert s.schedule() == [4]
    assert s.status(2) == "waiting" and s.status(3) == "waiting"
    s.finish(1)
    assert s.schedule() == [2, 3]


# -- 6. bad priorities ----------------------------------------------------------


@pytest.mark.parametrize(
    "bad, error",
    [
        (True, TypeError),
        (False, TypeError),
        (1.5, TypeError),
        ("1", TypeError),
        (2**63, InvalidArgumentError),
        (-(2**63) - 1, InvalidArgumentError),
    ],
)
def test_bad_priorities_raise_and_change_nothing(impl, bad, error):
    s = impl(100)
    s.submit(1, "a", 10, priority=1)
    s.submit(2, "b", 10, priority=-1)
    s.raise_counter("b", 7.0)
    before = state(s, [1, 2, 3])
    with pytest.raises(error) as info:
        s.submit(3, "c", 10, priority=bad)
    assert "priority" in str(info.value)
    with pytest.raises(error):  # a client already waiting, in a new band
        s.submit(3, "a", 10, priority=bad)
    assert state(s, [1, 2, 3]) == before
    assert s.num_waiting == 2
    assert s.counters() == {"a": 0.0, "b": 7.0}
    assert s.status(3) is None


def test_priority_is_converted_with_the_arguments_before_any_value_check(impl):
    s = impl(100)
    s.submit(1, "a", 10)
    # before the duplicate id, the prompt_len and the predicted_output range checks...
    with pytest.raises(InvalidArgumentError, match="priority"):
        s.submit(1, "a", 10, priority=2**63)
    with pytest.raises(TypeError, match="priority"):
        s.submit(2, "a", 0, priority=True)
    with pytest.raises(TypeError, match="priority"):
        s.submit(2, "a", 101, priority=1.0)
    with pytest.raises(TypeError, match="priority"):
        s.submit(2, "a", 10, None, -1, priority="x")
    # ... after the conversion of the arguments before it
    with pytest.raises(TypeError, match="prompt_len"):
        s.submit(2, "a", 1.0, priority=2**63)
    with pytest.raises(InvalidArgumentError, match="predicted_output"):
        s.submit(2, "a", 10, None, 2**64, priority="x")
    with pytest.raises(InvalidArgumentError, match="predicted_output"):
        s.submit(2, "a", 10, None, -1, priority=5)
    assert s.num_waiting == 1


@pytest.mark.parametrize("p", [2**63 - 1, -(2**63), np.int64(-3), np.uint8(200)])
def test_the_whole_64_bit_range_and_index_types_are_accepted(impl, p):
    s = impl(100)
    s.submit(1, "a", 10, priority=0)
    s.submit(2, "b", 10, priority=p)
    assert s.schedule() == ([2, 1] if int(p) < 0 else [1, 2])


# -- 7. all-default priorities change nothing -----------------------------------


def _drive(scheds, priorities, seed: int, n_ops: int = 400) -> int:
    """The same random operations on every scheduler of ``scheds``; the i-th
    submits with ``priority=priorities[i]`` (``None``: the argument omitted).
    Checks every observable after every op; returns how many admissions."""
    rng = random.Random(seed)
    known: list[int] = []
    rid = 0
    n_admitted = 0
    for _ in range(n_ops):
        r = rng.random()
        if r < 0.35:
            rid += 1
            known.append(rid)
            args = (rid, rng.choice([0, 1, 2, "a"]), rng.choice([1, 3, 10, 30, 64, 70]))
            if rng.random() < 0.2:
                args += (rng.randint(0, args[2]), rng.choice([None, 0, 4]))
            op = "submit"
            calls = [(args, {} if p is None else {"priority": p}) for p in priorities]
        else:
            op, a = rng.choice(
                [
                    ("schedule", ()),
                    ("schedule", ()),
                    ("decode", ()),
                    ("decode", ()),
                    ("finish", (rng.choice(known),) if known else (0,)),
                    ("cancel", (rng.choice(known),) if known else (0,)),
                    ("preempt", (rng.choice(known),) if known else (0,)),
                    ("put_back", (rng.choice(known),) if known else (0,)),
                    ("set_aside", ()),
                    ("pop", ()),
                    ("raise_counter", (rng.choice([0, 1, 2, "a"]), rng.choice([5.0, 80.0]))),
                ]
            )
            calls = [(a, {})] * len(scheds)
        outcomes = []
        for s, (args, kwargs) in zip(scheds, calls):
            try:
                outcomes.append(("ok", getattr(s, op)(*args, **kwargs)))
            except Exception as e:  # noqa: BLE001 - the outcome is compared
                outcomes.append(("err", type(e).__name__))
        assert all(o == outcomes[0] for o in outcomes), (op, outcomes)
        if outcomes[0][0] == "ok" and op in ("schedule", "pop"):
            n_admitted += len(outcomes[0][1]) if op == "schedule" else outcomes[0][1] is not None
        states = [state(s, known[-8:]) for s in scheds]
        assert all(st == states[0] for st in states), (op, states)
        credits = [[s.credit(c) for c in (0, 1, 2, "a")] for s in scheds]
        assert all(c == credits[0] for c in credits)
    return n_admitted


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("seed", range(15))
def test_uniform_priorities_behave_like_the_default(impl, policy, seed):
    """Omitted, 0 explicitly, a numpy 0, or any one value for every request:
    all observable behaviour is identical."""
    M = random.Random(seed).choice([16, 64, 200])
    kwargs = {"client_cap": 0.5} if seed % 3 == 0 else {}
    if seed % 4 == 1:
        kwargs["predictor"] = "mean"
    scheds = [impl(M, policy=policy, **kwargs) for _ in range(5)]
    assert _drive(scheds, [None, 0, np.int64(0), 7, -(2**63)], seed) > 10


# -- mixed priorities: the invariants of strict bands -------------------------


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("seed", range(20))
def test_random_mixed_priorities_never_let_a_less_urgent_request_overtake(impl, policy, seed):
    rng = random.Random(1000 + seed)
    M = rng.choice([16, 64, 200])
    s = impl(M, policy=policy)
    prio: dict[int, int] = {}
    rid = 0
    admitted_total = 0
    for _ in range(300):
        r = rng.random()
        if r < 0.4:
            rid += 1
            prio[rid] = rng.choice([-2, 0, 0, 1, 5])
            s.submit(rid, rng.choice("abcd"), rng.randint(1, M // 2), priority=prio[rid])
        elif r < 0.65:
            admitted = s.schedule()
            admitted_total += len(admitted)
            waiting = [x for x in prio if s.status(x) == "waiting"]
            if admitted and waiting:
                assert max(prio[x] for x in admitted) <= min(prio[x] for x in waiting)
            assert [prio[x] for x in admitted] == sorted(prio[x] for x in admitted)
        elif r < 0.85:
            try:
                victims = s.decode()
            except CapacityError:  # one request alone cannot grow: the engine ends it
                (last,) = s.running()
                s.finish(last)
                del prio[last]
                continue
            running = s.running()
            if victims and running:
                assert min(prio[x] for x in victims) >= max(prio[x] for x in running)
        else:
            for x in s.running():
                if rng.random() < 0.5:
                    s.finish(x)
                    del prio[x]
        waiting = [x for x in prio if s.status(x) == "waiting"]
        head = s.peek()
        assert (head is None) == (not waiting)
        if head is not None:
            assert prio[head] == min(prio[x] for x in waiting)
    assert admitted_total > 20


def test_priority_none_is_the_default_band(impl):
    s = impl(100)
    s.submit(1, "a", 10, priority=None)
    s.submit(2, "b", 10, priority=-1)
    s.submit(3, "c", 10, priority=0)
    s.submit(4, "d", 10)
    assert s.schedule() == [2, 1, 3, 4]
