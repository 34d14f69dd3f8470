"""``Scheduler.decode_all(tokens=1)``: the uniform engine-form decode (every
running request generated ``tokens``; no ids passed) against ``decode`` with
every running id, and its bad input, in the core and in ``vtc.reference``.
The random sequences of tests/test_differential.py mix it with every other
call; here it meets snapshots, forgetting, preemption, weights and bands."""

from __future__ import annotations

import random

import numpy as np
import pytest

import vtc
from helpers import state
from vtc import reference

BOTH = [vtc.Scheduler, reference.Scheduler]
COSTS = [None, vtc.QuadraticCost(), vtc.ContextCost(1.0, 2.0, 0.01)]


def _engine_run(cls, uniform: bool, seed: int, **kwargs):
    """A random engine-mode run; decodes go through ``decode_all`` or ``decode``."""
    rng = random.Random(seed)
    s = cls(1 << 20, **kwargs)
    rid = 0
    for _ in range(400):
        r = rng.random()
        if r < 0.3:
            rid += 1
            s.submit(
                rid,
                rng.choice(["a", "b", 7, "c"]),
                rng.randint(1, 40),
                predicted_output=rng.choice([None, None, 4]),
                priority=rng.choice([0, 1]),
            )
        elif r < 0.45:
            s.pop()
        elif r < 0.8:
            t = rng.choice([1, 1, 2, 0, 5])
            default = rng.random() < 0.5  # drawn in both runs: they stay alike
            if uniform:
                s.decode_all() if t == 1 and default else s.decode_all(t)
            else:
                s.decode(s.running(), t)
        elif r < 0.9 and s.num_running:
            victim = rng.choice(s.running())
            s.preempt(victim) if rng.random() < 0.3 else s.finish(victim)
        elif r < 0.95:
            s.set_weight(rng.choice(["a", "b", 7]), rng.choice([0.5, 1.0, 3.0]))
        else:
            if hasattr(s, "forget_idle"):  # the core only
                s.forget_idle()
    return s


@pytest.mark.parametrize("cls", BOTH)
@pytest.mark.parametrize("cost", COSTS, ids=["linear", "quadratic", "context"])
@pytest.mark.parametrize("bands", [None, {0: 1.0, 1: 3.0}])
def test_decode_all_charges_what_decode_with_every_running_id_charges(cls, cost, bands):
    kwargs = {"band_weights": bands, "predictor": "mean"}
    if cost is not None:
        kwargs["cost"] = cost
    for seed in range(3):
        a = _engine_run(cls, True, seed, **kwargs)
        b = _engine_run(cls, False, seed, **kwargs)
        assert state(a) == state(b)
        assert a.band_counters() == b.band_counters()
        assert a.snapshot() == b.snapshot() if cls is vtc.Scheduler else True


def test_a_snapshot_after_decode_all_keeps_its_charges():
    s = _engine_run(vtc.Scheduler, True, 11)
    restored = vtc.Scheduler.from_snapshot(s.snapshot())  # counters, not requests
    assert restored.counters() == s.counters() and restored.services() == s.services()


@pytest.mark.parametrize("cls", BOTH)
def test_decode_all_refuses_bad_counts_naming_them_and_changes_nothing(cls):
    s = cls(10_000)
    s.submit(1, "a", 10)
    s.submit(2, "b", 10)
    s.pop()
    s.pop()
    before = state(s, rids=[1, 2])
    with pytest.raises(vtc.InvalidArgumentError, match="-1"):
        s.decode_all(-1)
    with pytest.raises(vtc.InvalidArgumentError, match=str(2**32)):
        s.decode_all(2**32)
    with pytest.raises(vtc.InvalidArgumentError, match=str(2**70)):
        s.decode_all(2**70)
    for bad in (True, 1.0, "1", [1], object()):
        with pytest.raises(TypeError):
            s.decode_all(bad)
    assert state(s, rids=[1, 2]) == before
    s.decode_all(np.int32(2))  # any integer type with __index__
    s.decode_all()
    assert (s.generated(1), s.generated(2)) == (3, 3)
    assert s.occupancy == 26


@pytest.mark.parametrize("cls", BOTH)
@pytest.mark.parametrize(
    "ids", [[], (), np.array([], dtype=np.int64)], ids=["list", "tuple", "array"]
)
def test_a_decode_of_no_ids_changes_nothing_whatever_its_count(cls, ids):
    """No id, no check (the order of checks is per position), and nothing changed:
    ``decode([], -1)`` once moved the core's bound on generated counts so that the next
    ``decode_all`` broke it (and skipped the per-request limit's check)."""
    s = cls(10_000)
    s.submit(1, "a", 10)
    s.pop()
    before = state(s, rids=[1])
    for t in (-1, -(2**63), 2**32, 0, 3):
        s.decode(ids, t)
    assert state(s, rids=[1]) == before
    s.decode_all(1)
    s.decode([1], 2)
    assert s.generated(1) == 3
    if cls is vtc.Scheduler:
        s._check_invariants()


@pytest.mark.parametrize("cls", BOTH)
def test_decode_all_charges_only_running_requests_and_no_capacity_check(cls):
    s = cls(25)
    s.submit(1, "a", 12)
    s.submit(2, "b", 12)
    s.submit(3, "b", 5)  # stays waiting
    s.pop()
    s.pop()
    s.decode_all(10)  # engine mode: the engine owns memory, 44 > 25 is its call
    assert s.occupancy == 44
    assert s.status(3) == "waiting" and s.counters() == {"a": 32.0, "b": 32.0}
