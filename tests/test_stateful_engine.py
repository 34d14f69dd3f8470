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


def outcome(fn):
    try:
        return ("ok", fn())
    except vtc.SchedulerError as e:
        return ("err", type(e).__name__)
    except TypeError:
        return ("err", "TypeError")


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
