"""Counters after very long uptimes still order clients correctly.

Counters are f64. Charges with integral prices and weights are integers, and
an f64 holds every integer exactly up to 2**53 (about 9e15 weighted tokens:
a century at three million tokens per second), so a scheduler whose
counters start at 10**12 makes exactly the decisions of one starting at 0.
With fractional weights a charge is rounded to 53 bits, about 1e-4 of a
token at 10**12: orderings can only differ between counters closer than
that, i.e. on near-ties.
"""

from __future__ import annotations

import random

import vtc
from helpers import drive_random

OFFSET = 10.0**12


def _run(s, base: float, rng: random.Random, clients: list[str]) -> list[list[int]]:
    for c in clients:
        s.raise_counter(c, base)
    return drive_random(s, rng, 400, clients, arrivals=4, prompt=50, output=30)


def test_counters_at_1e12_decide_exactly_like_counters_at_0():
    clients = [f"c{i}" for i in range(6)]
    seed = 42
    a = vtc.Scheduler(M=400, wp=1.0, wq=2.0)
    b = vtc.Scheduler(M=400, wp=1.0, wq=2.0)
    for s in (a, b):
        s.set_weight("c1", 2.0)
        s.set_weight("c2", 4.0)
    got_a = _run(a, 0.0, random.Random(seed), clients)
    got_b = _run(b, OFFSET, random.Random(seed), clients)
    assert got_a == got_b and sum(map(len, got_a)) > 300
    for c in clients:
        assert b.counter(c) - OFFSET == a.counter(c)


def test_one_token_apart_at_1e12_is_still_an_order():
    s = vtc.Scheduler(M=1000, wp=1.0, wq=1.0)
    s.set_weight("third", 3.0)
    s.submit(1, "a", 5)
    s.submit(2, "b", 5)
    s.submit(3, "third", 5)  # all backlogged at 0; now age them
    s.raise_counter("a", OFFSET + 1.0)
    s.raise_counter("b", OFFSET)
    s.raise_counter("third", OFFSET + 1.0 / 3.0)
    assert s.counter("b") < s.counter("third") < s.counter("a")
    assert s.schedule() == [2, 3, 1]
