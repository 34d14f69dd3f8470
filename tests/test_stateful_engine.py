"""A hypothesis state machine over the engine-mode calls (issue 14), run on the
Rust core and on ``vtc.reference`` side by side: after every operation both
gave the same result or the same exception type and hold the same observable
state; every counter is finite and every snapshot restores.

Batch arguments come in every shape an engine or a hostile caller may pass:
lists, tuples, generators, numpy arrays of every integer dtype and byte order,
and objects whose ``__len__`` lies. Values reach the limits the API accepts:
``M = 2**53``, ``MAX_TOKENS_PER_CALL`` tokens per call, weights 1e-6 and 1e6,
counters raised to 1e30, prices up to 1e9.
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

import vtc
from helpers import state
from test_hardening import INT_DTYPES, LyingLen
from vtc import reference

CLIENTS = st.sampled_from(["a", "b", "c\ud800", 1, -7])
DTYPES = INT_DTYPES
TOKENS = st.one_of(
    st.integers(0, 8),
    st.sampled_from([vtc.MAX_TOKENS_PER_CALL, vtc.MAX_TOKENS_PER_CALL + 1, -1, 2**64]),
)


def shaped(values: list[int], how: str, dtype) -> object:
    """``values`` passed as ``how``: the shapes a batch argument comes in."""
    if how == "array":
        info = np.iinfo(dtype)
        if all(info.min <= v <= info.max for v in values):
            return np.array(values, dtype=dtype)
        return list(values)  # not representable in that dtype: a list instead
    if how == "tuple":
        return tuple(values)
    if how == "generator":
        return (v for v in values)
    if how == "lying":
        return LyingLen(2**62, values)
    return list(values)


SHAPES = st.sampled_from(["list", "tuple", "generator", "lying", "array"])


class LookupBroken(Exception):
    """A prefix lookup's own failure (the engine's cache is unreachable)."""


def outcome(fn):
    try:
        return ("ok", fn())
    except vtc.SchedulerError as e:
        return ("err", type(e).__name__)
    except TypeError:
        return ("err", "TypeError")
    except LookupBroken:
        return ("err", "LookupBroken")


class EngineMachine(RuleBasedStateMachine):
    @initialize(
        M=st.sampled_from([64, 4096, vtc.MAX_BUDGET]),
        wp=st.sampled_from([1.0, 0.0, 1e9]),
        wq=st.sampled_from([2.0, 1e9, 0.5]),
    )
    def start(self, M, wp, wq):
        self.M = M
        self.pair = (vtc.Scheduler(M, wp, wq), reference.Scheduler(M, wp, wq))
        self.next_rid = 0
        self.rids: list[int] = []

    def both(self, op: str, *args, **kwargs):
        fast, ref = (outcome(lambda s=s: getattr(s, op)(*args, **kwargs)) for s in self.pair)
        assert fast == ref, f"{op}{args}: core {fast} != reference {ref}"
        return fast

    def both_shaped(self, op: str, make_args):
        """``make_args()`` builds fresh arguments per scheduler (generators are single use)."""
        got = [outcome(lambda s=s: getattr(s, op)(*make_args())) for s in self.pair]
        assert got[0] == got[1], f"{op}: core {got[0]} != reference {got[1]}"

    @rule(
        client=CLIENTS,
        prompt=st.sampled_from([1, 5, 40, 2**40]),
        cached=st.booleans(),
        priority=st.sampled_from([None, 0, 0, 1, -3, 2**63 - 1, 2**63]),
    )
    def submit(self, client, prompt, cached, priority):
        self.next_rid += 1
        self.rids.append(self.next_rid)
        cached_len = prompt // 2 if cached else None
        self.both("submit", self.next_rid, client, prompt, cached_len, None, priority)

    @rule(cached=st.one_of(st.none(), st.integers(-1, 50), st.just(2**70)))
    def pop(self, cached):
        self.both("pop", cached)

    @rule()
    def set_aside(self):
        self.both("set_aside")

    @rule(data=st.data())
    def put_back(self, data):
        if self.rids:
            self.both("put_back", data.draw(st.sampled_from(self.rids)))

    @rule(data=st.data(), how=SHAPES, tok_how=SHAPES, dtype=st.sampled_from(DTYPES))
    def decode(self, data, how, tok_how, dtype):
        running = self.pair[1].running()
        pool = running + self.rids[-3:] + [10**6]
        # Long enough to pass the limit an iterable without a real length is
        # read to (one more id than there are running requests).
        ids = data.draw(st.lists(st.sampled_from(pool), max_size=len(running) + 3))
        if data.draw(st.booleans()):
            tokens = data.draw(
                st.lists(TOKENS, min_size=max(0, len(ids) - 1), max_size=len(ids) + 1)
            )
            self.both_shaped(
                "decode", lambda: (shaped(ids, how, dtype), shaped(tokens, tok_how, dtype))
            )
        else:
            t = data.draw(TOKENS)
            self.both_shaped("decode", lambda: (shaped(ids, how, dtype), t))

    @rule(data=st.data())
    def end(self, data):
        if self.rids:
            rid = data.draw(st.sampled_from(self.rids))
            self.both(data.draw(st.sampled_from(["finish", "cancel", "preempt"])), rid)

    @rule(client=CLIENTS, w=st.sampled_from([1e-6, 1e6, 2.0, 5e-7, 2e6, 1e-308]))
    def set_weight(self, client, w):
        self.both("set_weight", client, w)

    @rule(client=CLIENTS, v=st.sampled_from([1e30, -1e30, 3.0, 2e30, 10**400]))
    def raise_counter(self, client, v):
        self.both("raise_counter", client, v)

    @rule(
        batch=st.dictionaries(
            CLIENTS, st.sampled_from([1e30, -1e30, 3.0, 2e30, 10**400, 7.5]), max_size=3
        )
    )
    def raise_counters(self, batch):
        self.both("raise_counters", batch)

    @invariant()
    def same_state_finite_counters_restorable_snapshot(self):
        fast, ref = self.pair
        assert state(fast, self.rids[-6:]) == state(ref, self.rids[-6:])
        assert fast.tokens() == ref.tokens()  # also in state(); said here as well
        assert fast.active_clients() == ref.active_clients()  # likewise
        counters = fast.counters()
        assert all(math.isfinite(v) for v in counters.values())
        restored = vtc.Scheduler.from_snapshot(fast.snapshot())
        assert restored.counters() == counters
        assert restored.tokens() == {c: (0, 0) for c in counters}  # tallies are not kept
        assert restored.active_clients() == {}  # requests are not kept
        fast._check_invariants()


TestEngineMachine = EngineMachine.TestCase
TestEngineMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


class LocalityEngineMachine(EngineMachine):
    """The same machine with the locality window (issue 19): a quantum and a
    prefix lookup whose answer per request a rule sets, sometimes out of range,
    not an int, or raising. Both schedulers must also ask the lookup for the
    same requests in the same order."""

    @initialize(
        M=st.sampled_from([64, 4096, vtc.MAX_BUDGET]),
        wp=st.sampled_from([1.0, 0.0, 1e9]),
        wq=st.sampled_from([2.0, 1e9, 0.5]),
        Q=st.sampled_from([0.0, 1.0, 50.0, 1e9, 1e300]),
        policy=st.sampled_from(["vtc", "lcf"]),
    )
    def start(self, M, wp, wq, Q, policy):
        self.M = M
        self.Q = Q
        self.pair = (
            vtc.Scheduler(M, wp, wq, policy, locality_quantum=Q),
            reference.Scheduler(M, wp, wq, policy, locality_quantum=Q),
        )
        self.next_rid = 0
        self.rids: list[int] = []
        self.hits: dict = {}
        self.calls: tuple[list, list] = ([], [])
        self.lookups = tuple(self._lookup(calls) for calls in self.calls)
        self.on = True
        for s, lookup in zip(self.pair, self.lookups):
            s.set_prefix_lookup(lookup)

    def _lookup(self, calls):
        def lookup(rid):
            calls.append(rid)
            hit = self.hits.get(rid, 0)
            if hit == "raise":
                raise LookupBroken(f"cache down for request {rid}")
            return hit

        return lookup

    def both(self, op: str, *args, **kwargs):
        for calls in self.calls:
            calls.clear()
        got = super().both(op, *args, **kwargs)
        assert self.calls[0] == self.calls[1], f"{op}{args}: lookups {self.calls}"
        assert self.Q > 0.0 or self.calls[0] == []
        return got

    @rule(clients=st.lists(CLIENTS, min_size=2, max_size=5, unique=True))
    def submit_burst(self, clients):
        """One request for each of several clients in one band: windows of several."""
        for client in clients:
            self.next_rid += 1
            self.rids.append(self.next_rid)
            self.both("submit", self.next_rid, client, 5)

    @rule(
        data=st.data(),
        hit=st.sampled_from([0, 1, 3, 20, 40, 2**40, -1, 2**70, 1.5, True, np.int32(2), "raise"]),
    )
    def set_hit(self, data, hit):
        if self.rids:
            self.hits[data.draw(st.sampled_from(self.rids))] = hit

    @rule()
    def schedule(self):
        self.both("schedule")

    @rule()
    def peek(self):
        self.both("peek")

    @rule(on=st.booleans())
    def set_prefix_lookup(self, on):
        self.on = on
        for s, lookup in zip(self.pair, self.lookups):
            s.set_prefix_lookup(lookup if on else None)

    @invariant()
    def same_state_finite_counters_restorable_snapshot(self):
        # state() peeks: plain VTC while reading (peek with the lookup is a rule)
        for s in self.pair:
            s.set_prefix_lookup(None)
        try:
            super().same_state_finite_counters_restorable_snapshot()
        finally:
            for s, lookup in zip(self.pair, self.lookups):
                s.set_prefix_lookup(lookup if self.on else None)
        fast, ref = self.pair
        assert fast.locality_quantum == ref.locality_quantum == self.Q
        restored = vtc.Scheduler.from_snapshot(fast.snapshot(), locality_quantum=self.Q)
        assert restored.locality_quantum == self.Q


TestLocalityEngineMachine = LocalityEngineMachine.TestCase
TestLocalityEngineMachine.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None
)
