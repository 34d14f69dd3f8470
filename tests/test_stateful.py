"""A hypothesis state machine over the Python object: after every operation,
no request is lost or duplicated, counters never decrease, occupancy stays
within M, and every client's token tally is what a model of the charges
counts, and every client's (waiting, running) counts are what the model of
the requests gives (the engine-mode calls that hand memory to the engine are left out
here; the fuzz target covers them)."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import vtc

CLIENTS = st.sampled_from(["a", "b", "c", 1, 2])


class SchedulerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.M = 64
        self.s = vtc.Scheduler(M=self.M, wp=1.0, wq=2.0)
        self.model: dict[int, str] = {}  # live request -> "waiting" | "running" | "aside"
        self.ended: set[int] = set()
        self.next_rid = 0
        self.prev: dict = {}
        # the token model: live or ended request -> (client, prompt - cached_len),
        # the requests whose prompt was charged, and each client's (prompt, decode)
        self.computed: dict[int, tuple] = {}
        self.paid: set[int] = set()
        self.tally: dict = {}

    @rule(client=CLIENTS, prompt=st.integers(-2, 70), cached=st.integers(0, 3))
    def submit(self, client, prompt, cached):
        self.next_rid += 1
        rid = self.next_rid
        try:
            self.s.submit(rid, client, prompt, cached_len=cached)
        except vtc.InvalidArgumentError:
            assert prompt < 1 or prompt > self.M or cached > prompt
            return
        self.model[rid] = "waiting"
        self.computed[rid] = (client, prompt - cached)
        self.tally.setdefault(client, (0, 0))

    def count(self, rid: int, prompt: int = 0, decode: int = 0) -> None:
        client = self.computed[rid][0]
        p, d = self.tally[client]
        self.tally[client] = (p + prompt, d + decode)

    @rule()
    def schedule(self):
        for rid in self.s.schedule():
            assert self.model[rid] == "waiting"
            self.model[rid] = "running"
            if rid not in self.paid:  # a preempted request's prompt is not charged again
                self.paid.add(rid)
                self.count(rid, prompt=self.computed[rid][1])

    @rule()
    def decode(self):
        try:
            preempted = self.s.decode()
        except vtc.CapacityError:
            (lone,) = self.s.running()
            self.s.finish(lone)
            del self.model[lone]
            self.ended.add(lone)
            return
        for rid in preempted:
            assert self.model[rid] == "running"
            self.model[rid] = "waiting"
        for rid in self.s.running():  # every request still running grew by one token
            self.count(rid, decode=1)

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def end_one(self, data):
        rid = data.draw(st.sampled_from(sorted(self.model)))
        if self.model[rid] == "running" and data.draw(st.booleans()):  # else cancel (any state)
            self.s.finish(rid)
        else:
            self.s.cancel(rid)
        del self.model[rid]
        self.ended.add(rid)

    @precondition(lambda self: any(v == "running" for v in self.model.values()))
    @rule(data=st.data())
    def preempt(self, data):
        rid = data.draw(st.sampled_from(sorted(r for r, v in self.model.items() if v == "running")))
        self.s.preempt(rid)
        self.model[rid] = "waiting"

    @rule()
    def set_aside(self):
        before = self.s.counters()
        rid = self.s.set_aside()
        if rid is None:
            assert "waiting" not in self.model.values()
            return
        assert self.model[rid] == "waiting"
        self.model[rid] = "aside"
        assert self.s.counters() == before  # nothing charged

    @precondition(lambda self: "aside" in self.model.values())
    @rule(data=st.data())
    def put_back(self, data):
        rid = data.draw(st.sampled_from(sorted(r for r, v in self.model.items() if v == "aside")))
        before = self.s.counters()
        self.s.put_back(rid)
        self.model[rid] = "waiting"
        assert self.s.counters() == before  # nothing charged, no lift

    @precondition(lambda self: self.ended)
    @rule(data=st.data())
    def ended_ids_are_unknown(self, data):
        rid = data.draw(st.sampled_from(sorted(self.ended)))
        if rid not in self.model:
            for op in (self.s.finish, self.s.cancel, self.s.preempt):
                try:
                    op(rid)
                except vtc.UnknownRequestError:
                    continue
                raise AssertionError(f"{op.__name__}({rid}) accepted an ended request")

    @rule()
    def forget(self):
        self.s.forget_idle()
        self.prev = {c: v for c, v in self.prev.items() if c in self.s.counters()}
        self.tally = {c: v for c, v in self.tally.items() if c in self.s.counters()}

    @invariant()
    def every_request_in_exactly_one_place(self):
        for rid, where in self.model.items():
            assert self.s.status(rid) == where
        assert self.s.num_waiting == sum(v == "waiting" for v in self.model.values())
        assert self.s.num_running == sum(v == "running" for v in self.model.values())
        assert set(self.s.running()) == {r for r, v in self.model.items() if v == "running"}

    @invariant()
    def counters_never_decrease_and_occupancy_fits(self):
        counters = self.s.counters()
        for c, v in counters.items():
            assert v >= self.prev.get(c, 0.0)
        self.prev = counters
        assert self.s.occupancy <= self.M
        self.s._check_invariants()

    @invariant()
    def token_tallies_are_what_was_charged(self):
        tokens = self.s.tokens()
        assert tokens == {c: self.tally.get(c, (0, 0)) for c in self.s.counters()}
        assert all(self.s.client_tokens(c) == t for c, t in tokens.items())

    @invariant()
    def active_clients_count_the_requests_of_each_client(self):
        want: dict = {}
        for rid, where in self.model.items():
            w, r = want.get(self.computed[rid][0], (0, 0))
            want[self.computed[rid][0]] = (w, r + 1) if where == "running" else (w + 1, r)
        active = self.s.active_clients()
        assert active == want  # set aside counts as waiting; idle clients are absent
        assert set(active) <= set(self.s.counters())
        aside = sum(v == "aside" for v in self.model.values())
        assert sum(w for w, _ in active.values()) == self.s.num_waiting + aside
        assert sum(r for _, r in active.values()) == self.s.num_running


TestSchedulerMachine = SchedulerMachine.TestCase
TestSchedulerMachine.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)
