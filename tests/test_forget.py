"""Forgetting idle clients (bounded memory under churn) changes no decision."""

from __future__ import annotations

import random

import pytest

import vtc
from test_differential import _apply, _random_op
from vtc import reference


def _decision_state(s) -> dict:
    """What decides the future: queue heads, running set, and the counters of
    clients that are waiting or running."""
    active = {r: s.status(r) for r in s.running()}
    return {
        "running": s.running(),
        "peek": s.peek(),
        "occupancy": s.occupancy,
        "num_waiting": s.num_waiting,
        "active": active,
    }


@pytest.mark.parametrize("policy", ["vtc", "fcfs", "lcf"])
def test_forgetting_scheduler_decides_like_one_that_forgets_nothing(policy):
    forgot = 0
    for seed in range(400):
        rng = random.Random(seed)
        M = rng.choice([16, 64, 200])
        fast = vtc.Scheduler(M, 1.0, 2.0, policy)
        ref = reference.Scheduler(M, 1.0, 2.0, policy)
        known: list[int] = []
        next_rid = [0]
        for i in range(80):
            op, args = _random_op(rng, known, next_rid, M)
            got, want = _apply(fast, op, args), _apply(ref, op, args)
            if op in ("counter", "service"):
                continue
            if op == "raise_counters" and got[0] == want[0] == "ok":
                got = want  # how many rose: a forgotten client's counter restarts at 0
            assert got == want, f"seed {seed} op {i}: {op}{args}: {got} != {want}"
            assert _decision_state(fast) == _decision_state(ref), f"seed {seed} op {i}"
            # clients that can still matter have identical counters (under fcfs
            # counters decide nothing, and a forgotten client's restarts at 0)
            busy = {c for c in fast.clients() if c in ref.counters() and policy != "fcfs"}
            for c in busy:
                if any(ref._requests[r].client == c for r in ref._requests):
                    assert fast.counter(c) == ref.counter(c), (seed, i, c)
            if rng.random() < 0.3:
                forgot += fast.forget_idle()
                fast._check_invariants()
    if policy == "lcf":
        assert forgot == 0
    else:
        assert forgot > 500  # the rule really fired


def test_over_served_client_is_kept_and_keeps_its_debt():
    s = vtc.Scheduler(M=1000)
    s.submit(1, "big", 600)
    s.submit(2, "small", 10)
    s.schedule()
    s.finish(1)
    s.finish(2)
    s.submit(3, "small", 10)  # small is backlogged at 10 < big's 600
    assert s.forget_idle() == 0  # big (600) is above the floor: it must stay
    s.submit(4, "big", 10)
    assert s.counter("big") == 600.0


def test_client_below_the_floor_is_forgotten_and_returns_at_the_floor():
    s = vtc.Scheduler(M=1000)
    s.submit(1, "gone", 10)
    s.submit(2, "heavy", 500)
    s.submit(3, "heavy", 10)
    s.schedule()
    s.finish(1)
    s.finish(2)
    s.submit(4, "other", 10)  # last to leave will be heavy; other lifted to 510
    s.submit(5, "heavy", 10)
    assert s.num_clients == 3
    assert s.forget_idle() == 1  # "gone" (10) is below the floor
    assert "gone" not in s.clients() and s.service("gone") == 0.0
    s.submit(6, "gone", 10)
    assert s.counter("gone") == min(s.counter("other"), s.counter("heavy"))


def test_weighted_and_last_left_clients_are_kept():
    s = vtc.Scheduler(M=1000)
    s.set_weight("gold", 3.0)
    s.submit(1, "gold", 10)
    s.submit(2, "x", 10)
    s.schedule()
    s.finish(1)
    s.finish(2)
    assert s.forget_idle() == 0  # gold has a weight; x left last (the lift's reference)
    assert set(s.clients()) == {"gold", "x"}


def test_churn_keeps_the_client_table_proportional_to_the_live_set():
    s = vtc.Scheduler(M=4096)
    rid = 0
    peak = 0
    for step in range(3000):
        for _ in range(64):
            rid += 1
            s.submit(rid, f"one-off-{rid}", 1 + rid % 8)
        s.schedule()
        s.decode()
        for r in s.running():
            if s.generated(r) >= 2:
                s.finish(r)
        if step % 50 == 0:
            s.forget_idle()
            peak = max(peak, s.num_clients)
    assert rid == 192_000
    assert peak < 20 * (s.num_running + s.num_waiting + 100)
    s._check_invariants()
