"""Differential tests: the Rust core against the pure-Python reference.

Thousands of random operation sequences go through both; after every
operation the outcome (result or exception type) and every observable piece
of state must be identical: admissions, counters, services, occupancy,
queues, running order, credits, token tallies and each active client's
(waiting, running) counts.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

import vtc
from helpers import state
from vtc import reference

CLIENTS = [0, 1, 2, "a", "b", "tenant-x", -5]


class LookupBroken(Exception):
    """A prefix lookup's own failure (the engine's cache is unreachable)."""


def _apply(s, op, args):
    try:
        return ("ok", getattr(s, op)(*args))
    except vtc.SchedulerError as e:  # every core error is one of these
        return ("err", type(e).__name__)
    except TypeError:
        return ("err", "TypeError")
    except LookupBroken:
        return ("err", "LookupBroken")


class _Cache:
    """A deterministic engine cache for the locality window: the answer for a
    request is a function of (seed, request id, epoch) only, so the core and the
    reference, each with its own instance, hear the same thing. Mostly an int in
    range (coarse, so hits tie), sometimes past the request's tokens, negative,
    not an int (a float, a bool), a numpy int, or the lookup raising; the epoch
    moves when the cache changes. Each instance records the ids it was asked."""

    def __init__(self, seed: int, epoch: list[int]):
        self.seed, self.epoch, self.calls = seed, epoch, []

    def __call__(self, rid):
        self.calls.append(rid)
        r = random.Random(self.seed * 1_000_003 + rid * 7_919 + self.epoch[0] * 104_729)
        x = r.random()
        if x < 0.02:
            raise LookupBroken(f"cache down for request {rid}")
        if x < 0.03:
            return r.choice([-1, 1.5, True, "3"])
        if x < 0.05:
            return 10**6  # past any footprint here
        if x < 0.15:
            return np.int64(r.randint(0, 2))
        if x < 0.7:
            return r.choice([0, 0, 1, 1, 2])
        return r.randrange(0, 48, 8)


def _random_op(rng: random.Random, known: list[int], next_rid: list[int], M: int, bands=None):
    r = rng.random()
    if r < 0.30:
        if rng.random() < 0.05 and known:
            rid = rng.choice(known)  # duplicate (or reuse of a finished id)
        else:
            next_rid[0] += 1
            rid = next_rid[0]
            known.append(rid)
        p = rng.choice([1, 2, 5, 16, 40, M // 3, M // 2, M, M + 1, 0, -3, rng.randint(1, M)])
        if bands is not None:  # priority bands (sometimes a bad priority)
            cached = rng.choice([None, 0, rng.randint(0, max(p, 0))])
            predicted = rng.choice([None, None, None, 0, 8, -1])
            return "submit", (rid, rng.choice(CLIENTS), p, cached, predicted, rng.choice(bands))
        if rng.random() < 0.2:  # a predicted output length (sometimes an invalid one)
            cached = rng.choice([None, 0, rng.randint(0, max(p, 0))])
            return "submit", (rid, rng.choice(CLIENTS), p, cached, rng.choice([-1, 0, 1, 3, 8, 40]))
        if rng.random() < 0.3:  # a prefix-cache hit (sometimes an invalid one)
            return "submit", (rid, rng.choice(CLIENTS), p, rng.randint(-1, max(p, 0) + 1))
        return "submit", (rid, rng.choice(CLIENTS), p)
    if r < 0.45:
        return "schedule", ()
    if r < 0.60:
        if rng.random() < 0.3:  # engine form, uniform: every running request
            return "decode_all", (rng.choice([None, 1, 1, 2, 5, 0, -1]),)
        return "decode", ()
    if r < 0.66:
        ids = rng.sample(known, k=min(len(known), rng.randint(0, 4)))
        if ids and rng.random() < 0.1:
            ids.append(ids[0])  # duplicate in one call
        toks = [rng.choice([0, 1, 1, 2, 3, 7, -1 if rng.random() < 0.05 else 1]) for _ in ids]
        if rng.random() < 0.3:
            return "decode", (ids, rng.choice([1, 2]))
        if rng.random() < 0.05:
            toks.append(1)  # length mismatch
        return "decode", (ids, toks)
    if r < 0.76:
        return "finish", (rng.choice(known) if known else 999_999,)
    if r < 0.82:
        return "cancel", (rng.choice(known) if known else 999_999,)
    if r < 0.86:
        op = "put_back" if rng.random() < 0.4 else "preempt"
        return op, (rng.choice(known) if known else 999_999,)
    if r < 0.89:
        if rng.random() < 0.3:  # an engine skips the request it popped
            return "set_aside", ()
        if rng.random() < 0.4:
            return "pop", (rng.randint(-1, 50),)
        return "pop", ()
    if r < 0.92:
        if rng.random() < 0.3:  # many states at once, some ids unknown or bad
            ids = rng.sample(known, k=min(len(known), rng.randint(0, 6))) + [999_999]
            if rng.random() < 0.1:
                ids.insert(rng.randint(0, len(ids)), rng.choice([-1, "x", 2**64]))
            return "statuses", (ids,)
        return "peek", ()
    if r < 0.95:
        v = rng.choice([0.0, 50.0, 500.0, 5000.0, float("inf"), -1.0])
        if rng.random() < 0.4:  # a sync's batch: a bad value anywhere changes nothing
            vals = [0.0, 50.0, 500.0, 5000.0, -1.0] + [float("inf")] * (rng.random() < 0.1)
            batch = {c: rng.choice(vals) for c in rng.sample(CLIENTS, rng.randint(0, 3))}
            return "raise_counters", (batch,)
        return "raise_counter", (rng.choice(CLIENTS), v)
    if bands is not None and rng.random() < 0.3:  # weighted bands on, changed or off
        return "set_band_weights", (_random_band_weights(rng, bad=True),)
    w = rng.choice([0.5, 1.0, 2.0, 3.0, 0.25, 0.0, -1.0, float("inf"), float("nan")])
    return "set_weight", (rng.choice(CLIENTS), w)


def _random_band_weights(rng: random.Random, bad: bool = False):
    """None (strict bands) or weights for some of the bands the sequences use
    (with ``bad``, sometimes a bad priority or weight)."""
    if rng.random() < 0.25:
        return None
    weights = {p: rng.choice([1.0, 4.0, 0.5, 3.0]) for p in rng.sample([0, 1, -2, 7], 2)}
    if bad and rng.random() < 0.2:
        weights[rng.choice([3, 2**63, "x"])] = rng.choice([0.0, 2.0, float("nan")])
    return weights


def _random_accounting(rng: random.Random, M: int) -> dict:
    """Half the sequences run plain linear VTC; the rest a non-linear cost
    and/or a per-client cap."""
    kwargs: dict = {}
    r = rng.random()
    if r < 0.2:
        kwargs["cost"] = vtc.QuadraticCost(
            *(rng.choice([0.0, 0.04, 0.3, 1.0, 2.1, 11.46]) for _ in range(5))
        )
    elif r < 0.35:
        kwargs["cost"] = vtc.ContextCost(
            rng.choice([1.0, 0.5]), rng.choice([2.0, 0.3]), rng.choice([0.0, 1 / 512, 0.1, 0.7])
        )
    elif r < 0.4:
        kwargs["cost"] = rng.choice(["quadratic", "context", "linear"])
    if rng.random() < 0.3:
        kwargs["client_cap"] = rng.choice([1, 5, M // 4, M // 2, 0.25, 0.5, 1.0])
    if rng.random() < 0.25:
        kwargs["predictor"] = "mean"
    return kwargs


def _run_sequence(seed: int, policy: str, n_ops: int, locality: bool = False) -> int:
    rng = random.Random(seed)
    M = rng.choice([8, 16, 64, 200, 1000])
    wp = rng.choice([1.0, 0.5, 2.0])
    wq = rng.choice([2.0, 1.0, 0.3])
    kwargs = _random_accounting(rng, M)
    if "cost" in kwargs:
        fast = vtc.Scheduler(M, policy=policy, **kwargs)
        ref = reference.Scheduler(M, policy=policy, **kwargs)
    else:
        fast = vtc.Scheduler(M, wp, wq, policy, **kwargs)
        ref = reference.Scheduler(M, wp, wq, policy, **kwargs)
    # a third of the sequences submit in priority bands
    bands = None
    weights = None
    if rng.random() < 0.35:
        bands = [0, 0, 0, 1, 1, -2, 7, None] + [2**63] * (rng.random() < 0.1)
        if rng.random() < 0.5:  # weighted bands from the start
            weights = _random_band_weights(rng)
            fast.set_band_weights(weights)
            ref.set_band_weights(weights)
    caches = None
    if locality:  # a quantum and a lookup, drawn apart so the sequences stay the same
        lrng = random.Random(seed + 77)
        Q = lrng.choice([0.0, 1.0, 5.0, 50.0, 500.0, 1e9])
        if policy == "fcfs":  # no counter to be within: Q > 0 is an error, Q = 0 plain
            kw = {"wp": wp, "wq": wq} if "cost" not in kwargs else {}
            for S in (vtc.Scheduler, reference.Scheduler):
                with pytest.raises(vtc.InvalidArgumentError, match="fcfs"):
                    S(M, policy=policy, locality_quantum=max(Q, 1.0), **kw, **kwargs)
            Q = 0.0
        kw = {"wp": wp, "wq": wq} if "cost" not in kwargs else {}
        fast = vtc.Scheduler(M, policy=policy, locality_quantum=Q, **kw, **kwargs)
        ref = reference.Scheduler(M, policy=policy, locality_quantum=Q, **kw, **kwargs)
        assert fast.locality_quantum == ref.locality_quantum == Q
        if bands is not None and weights is not None:
            fast.set_band_weights(weights)
            ref.set_band_weights(weights)
        epoch = [0]
        caches = (_Cache(seed, epoch), _Cache(seed, epoch))
        lookups = list(caches)  # the lookup each scheduler has now (None: none)
        fast.set_prefix_lookup(caches[0])
        ref.set_prefix_lookup(caches[1])
    known: list[int] = []
    next_rid = [0]
    for i in range(n_ops):
        op, args = _random_op(rng, known, next_rid, M, bands)
        if caches is not None:
            r = lrng.random()
            if r < 0.05:
                epoch[0] += 1  # the engine's cache changed
            elif r < 0.08:  # the lookup taken away, or given back
                lookups = list(caches) if lrng.random() < 0.7 else [None, None]
                fast.set_prefix_lookup(lookups[0])
                ref.set_prefix_lookup(lookups[1])
                continue
            for c in caches:
                c.calls.clear()
        got = _apply(fast, op, args)
        want = _apply(ref, op, args)
        assert got == want, f"seed {seed} op {i}: {op}{args}: core {got} != reference {want}"
        if caches is not None:
            calls = (caches[0].calls, caches[1].calls)
            assert calls[0] == calls[1], f"seed {seed} op {i}: {op}: lookups {calls}"
            if Q == 0.0:
                assert calls[0] == []
            peeks = (_apply(fast, "peek", ()), _apply(ref, "peek", ()))
            assert peeks[0] == peeks[1], f"seed {seed} op {i}: peek {peeks}"
            fast.set_prefix_lookup(None)  # state() peeks: plain VTC while reading
            ref.set_prefix_lookup(None)
        a = state(fast, known[-8:])
        b = state(ref, known[-8:])
        if caches is not None:
            fast.set_prefix_lookup(lookups[0])
            ref.set_prefix_lookup(lookups[1])
        assert a == b, f"seed {seed} op {i}: {op}{args}: state diverged\ncore {a}\nref  {b}"
        credits = [(fast.credit(c), ref.credit(c)) for c in CLIENTS]
        assert all(x == y for x, y in credits), f"seed {seed} op {i}: credits {credits}"
        tallies = [(fast.client_tokens(c), ref.client_tokens(c)) for c in CLIENTS]
        assert all(x == y for x, y in tallies), f"seed {seed} op {i}: tokens {tallies}"
        bands_now = [(fast.band_weights(), fast.band_counters())]
        bands_now.append((ref.band_weights(), ref.band_counters()))
        assert bands_now[0] == bands_now[1], f"seed {seed} op {i}: bands {bands_now}"
        active = (fast.active_clients(), ref.active_clients())  # also in state()
        assert active[0] == active[1], f"seed {seed} op {i}: active_clients {active}"
        assert sum(r for _, r in active[0].values()) == fast.num_running
        fast._check_invariants()
    return len(known)


@pytest.mark.parametrize("policy", ["vtc", "lcf", "fcfs"])
def test_random_sequences_match_reference(policy):
    submitted = 0
    for seed in range(700):
        submitted += _run_sequence(seed * 7 + len(policy), policy, 60)
    assert submitted > 10_000  # the sequences really exercised the schedulers


@pytest.mark.parametrize("policy", ["vtc", "lcf", "fcfs"])
def test_random_sequences_with_a_locality_window_match_reference(policy):
    """The same sequences with a quantum and a deterministic engine cache as the
    prefix lookup (sometimes failing, out of range or not an int, sometimes taken
    away): the same outcomes, the same lookups asked in the same order, the same
    state after every call."""
    submitted = 0
    for seed in range(500):
        submitted += _run_sequence(seed * 7 + len(policy), policy, 60, locality=True)
    assert submitted > 7_000


def test_long_sequences_with_a_locality_window_match_reference():
    for seed in range(12):
        _run_sequence(20_000 + seed, "vtc", 1500, locality=True)


def test_long_sequences_match_reference():
    for seed in range(20):
        _run_sequence(10_000 + seed, "vtc", 1500)


def test_numpy_batch_decode_matches_list_form():
    a = vtc.Scheduler(10_000)
    b = reference.Scheduler(10_000)
    for s in (a, b):
        for rid in range(50):
            s.submit(rid, rid % 7, 10 + rid)
        s.schedule()
    ids = np.arange(50, dtype=np.int64)
    toks = np.arange(50, dtype=np.int64) % 4
    a.decode(ids, toks)
    b.decode(list(range(50)), [t % 4 for t in range(50)])
    assert state(a) == state(b)
    a.decode(ids.astype(np.uint64), 2)
    b.decode(list(range(50)), 2)
    assert state(a) == state(b)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"cost": vtc.QuadraticCost()},
        {"cost": vtc.ContextCost(1.0, 2.0, 0.01), "client_cap": 0.05},
        {"cost": "quadratic", "predictor": "mean"},
    ],
)
def test_large_batches_over_many_clients_match_reference(kwargs):
    """Big decode calls touching most backlogged clients (the core re-keys
    them in bulk when it charges every one, else leaves their keys stale) must
    still decide exactly like the reference."""
    rng = random.Random(5)
    if kwargs.get("cost"):
        fast = vtc.Scheduler(4000, **kwargs)
        ref = reference.Scheduler(4000, **kwargs)
    else:
        fast = vtc.Scheduler(4000, 1.0, 2.0, **kwargs)
        ref = reference.Scheduler(4000, 1.0, 2.0, **kwargs)
    rid = 0
    for step in range(150):
        for _ in range(rng.randint(0, 120)):
            rid += 1
            args = (rid, rng.randrange(90), rng.randint(1, 40))
            extra = {}
            if "predictor" in kwargs and rng.random() < 0.3:
                extra["predicted_output"] = rng.randint(0, 20)
            fast.submit(*args, **extra)
            ref.submit(*args, **extra)
        assert fast.schedule() == ref.schedule()
        if step % 3:
            assert fast.decode() == ref.decode()
        else:
            ids = fast.running()
            toks = [rng.randint(0, 3) for _ in ids]
            fast.decode(np.array(ids, dtype=np.int64), np.array(toks, dtype=np.int64))
            ref.decode(ids, toks)
        for r in fast.running():
            if rng.random() < 0.1:
                fast.finish(r)
                ref.finish(r)
        assert state(fast) == state(ref), step
    fast._check_invariants()
    assert fast.num_clients == 90


@pytest.mark.parametrize("bands", [False, True])
def test_few_running_among_many_backlogged_match_reference(bands):
    """Engine-form steps in which a decode charges a few of many backlogged
    clients (the core leaves their heap keys stale until one reaches the top
    of its band): every peek, pop and charge is the reference's, with weights,
    priority bands, preemption, set-aside requests and raised counters."""
    rng = random.Random(11 if bands else 7)
    kw = {"band_weights": {0: 1.0, 1: 3.0}} if bands else {}
    fast, ref = vtc.Scheduler(600, 1.0, 2.0, **kw), reference.Scheduler(600, 1.0, 2.0, **kw)
    both = (fast, ref)
    rid = 0
    for c in range(0, 200, 7):
        for s in both:
            s.set_weight(c, 1 + c % 3)
    aside = []
    for step in range(400):
        for _ in range(rng.randint(0, 4)):
            rid += 1
            args = (rid, rng.randrange(200), rng.randint(1, 30))
            prio = {"priority": rng.randrange(2)} if bands else {}
            for s in both:
                s.submit(*args, **prio)
        while fast.occupancy < 500 and fast.num_waiting:
            assert fast.peek() == ref.peek(), step
            if rng.random() < 0.1:  # the engine cannot take it: set aside
                got = fast.set_aside()
                assert got == ref.set_aside(), step
                aside.append(got)
            else:
                assert fast.pop() == ref.pop(), step
        if aside and rng.random() < 0.3:
            back = aside.pop()
            for s in both:
                s.put_back(back)
        ids = fast.running()
        toks = [rng.randint(0, 4) for _ in ids]
        for s in both:
            s.decode(ids, toks)
        for r in ids:
            x = rng.random()
            if x < 0.05:
                for s in both:
                    s.finish(r)
            elif x < 0.07:
                for s in both:
                    s.preempt(r)
        if step % 50 == 0:
            c = rng.randrange(200)
            if c in fast.clients():
                v = fast.counter(c) + rng.randint(0, 40)
                for s in both:
                    s.raise_counter(c, v)
        assert state(fast) == state(ref), step
        if step % 20 == 0:
            fast._check_invariants()
    assert fast.num_clients > 150
