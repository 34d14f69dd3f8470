"""``Scheduler.changes``: the clients changed since a reader's last call (issue 16,
item 6). The property: after any operations, the last mirror with the changes
applied (``gone`` first) equals a fresh full read, for every reader at its own
pace, on the core (forget_idle and snapshot restore included) and on
``vtc.reference``."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

import vtc
from vtc import reference

CLIENTS = st.sampled_from(["a", "b", "c", 7, -1])


def full(s) -> dict:
    """Every client's ``changes`` row, from the full reads."""
    services, tokens, active = s.services(), s.tokens(), s.active_clients()
    return {
        k: (c, services[k], *tokens[k], *active.get(k, (0, 0))) for k, c in s.counters().items()
    }


def apply(mirror: dict, result) -> tuple[dict, set]:
    """``mirror`` with one ``changes`` result applied, and the keys it listed."""
    is_full, changed, gone = result
    if is_full:
        assert gone == []
        return dict(changed), set(changed)
    mirror = dict(mirror)
    for k in gone:
        mirror.pop(k, None)
    mirror.update(changed)
    return mirror, set(changed)


class ChangesMachine(RuleBasedStateMachine):
    @initialize(core=st.booleans(), bands=st.booleans())
    def start(self, core, bands):
        cls = vtc.Scheduler if core else reference.Scheduler
        self.core = core
        self.s = cls(64, 1.0, 2.0, band_weights={0: 1.0, 1: 3.0} if bands else None)
        self.rid = 0
        self.rids: list[int] = []
        self.mirrors: dict[int, dict] = {}

    def read(self, reader: int) -> set:
        before = self.mirrors.get(reader)
        result = self.s.changes(reader)
        assert result[0] == (before is None)
        self.mirrors[reader], listed = apply(before or {}, result)
        now = full(self.s)
        assert self.mirrors[reader] == now
        # whatever differs from the last read was listed (the property's other half)
        if before is not None:
            assert {k for k, v in now.items() if before.get(k) != v} <= listed
        return listed

    @rule(client=CLIENTS, prompt=st.integers(1, 20), priority=st.sampled_from([0, 1]))
    def submit(self, client, prompt, priority):
        self.s.submit(self.rid, client, prompt, priority=priority)
        self.rids.append(self.rid)
        self.rid += 1

    @rule()
    def schedule(self):
        self.s.schedule()

    @rule()
    def pop(self):
        self.s.pop()

    @rule()
    def set_aside(self):
        self.s.set_aside()

    @rule(data=st.data())
    def put_back(self, data):
        aside = [r for r in self.rids if self.s.status(r) == "aside"]
        if aside:
            self.s.put_back(data.draw(st.sampled_from(aside)))

    @rule(tokens=st.integers(0, 5))
    def decode(self, tokens):
        running = self.s.running()
        if running:
            self.s.decode(running, [tokens] * len(running))

    @rule(data=st.data(), op=st.sampled_from(["finish", "cancel", "preempt"]))
    def end(self, data, op):
        live = [r for r in self.rids if self.s.status(r) is not None]
        if not live:
            return
        rid = data.draw(st.sampled_from(live))
        if op != "cancel" and self.s.status(rid) != "running":
            return
        getattr(self.s, op)(rid)

    @rule(batch=st.dictionaries(CLIENTS, st.sampled_from([3.0, 50.0, 1e6]), max_size=3))
    def raise_counters(self, batch):
        self.s.raise_counters(batch)

    @rule(client=CLIENTS, w=st.sampled_from([1.0, 2.0]))
    def set_weight(self, client, w):
        self.s.set_weight(client, w)

    @rule()
    def forget_idle(self):
        if self.core:  # the reference forgets nobody
            self.s.forget_idle()

    @rule()
    def restore(self):
        if self.core:  # a restored scheduler: every reader's next call is full
            self.s = vtc.Scheduler.from_snapshot(self.s.snapshot())
            self.rids = []
            self.mirrors = {}

    @rule(reader=st.sampled_from([1, 3]))
    def read_slow_reader(self, reader):
        self.read(reader)

    @rule(reader=st.sampled_from([1, 3]))
    def reset(self, reader):
        self.s.reset_changes(reader)
        self.mirrors.pop(reader, None)

    @invariant()
    def every_step_reader_mirrors_full_read(self):
        self.read(0)
        if self.core:
            self.s._check_invariants()  # the readers' lists and marks agree


TestChanges = ChangesMachine.TestCase
TestChanges.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)


@pytest.mark.parametrize("cls", [vtc.Scheduler, reference.Scheduler])
def test_bad_reader(cls):
    s = cls(64)
    for bad in (-1, vtc.CHANGE_READERS, 2**70):
        with pytest.raises(vtc.InvalidArgumentError, match="reader must be an int in"):
            s.changes(bad)
        with pytest.raises(vtc.InvalidArgumentError, match="reader must be an int in"):
            s.reset_changes(bad)
    with pytest.raises(TypeError, match="reader"):
        s.changes("0")
    with pytest.raises(TypeError, match="reader"):
        s.changes(1.0)


def test_only_changed_clients_are_listed():
    s = vtc.Scheduler(1000)
    for i in range(100):
        s.submit(i, f"t{i}", 10)
    assert s.changes() == (True, full(s), [])
    assert s.changes() == (False, {}, [])
    s.schedule()  # everyone admitted: all changed
    assert len(s.changes()[1]) == 100
    s.decode([3, 5], [1, 2])
    _, changed, gone = s.changes()
    assert changed == {"t3": full(s)["t3"], "t5": full(s)["t5"]} and gone == []
    assert changed["t5"] == (14.0, 14.0, 10, 2, 0, 1)  # wq = 2
    s.preempt(3)
    assert s.changes()[1] == {"t3": full(s)["t3"]}
    assert full(s)["t3"][4:] == (1, 0)
    assert s.raise_counters({"t9": 1e6, "t8": 0.0}) == 1  # t8 not raised: not listed
    assert set(s.changes()[1]) == {"t9"}


def test_forgotten_clients_are_gone_with_their_keys():
    s = vtc.Scheduler(1000)
    s.submit(1, "old", 10)
    s.submit(2, "busy", 10)
    s.schedule()
    s.finish(1)
    s.changes()
    s.changes(2)
    s.submit(3, "busy", 10)  # busy's counter is now the floor: "old" forgettable
    assert s.forget_idle() == 1
    s.submit(4, "new", 5)  # takes the forgotten id
    is_full, changed, gone = s.changes()
    assert not is_full and gone == ["old"] and set(changed) == {"busy", "new"}
    assert s.changes() == (False, {}, [])
    s.finish(2)  # reader 2 has not read since: it gets everything in one go
    _, changed, gone = s.changes(2)
    assert gone == ["old"] and changed == {k: full(s)[k] for k in ("busy", "new")}


def test_restored_scheduler_starts_with_a_full_read():
    s = vtc.Scheduler(1000)
    s.submit(1, "a", 10)
    s.schedule()
    s.changes()
    restored = vtc.Scheduler.from_snapshot(s.snapshot())
    assert restored.changes() == (True, {"a": (10.0, 10.0, 0, 0, 0, 0)}, [])


def test_independent_readers_and_reset():
    s = vtc.Scheduler(1000)
    s.submit(1, "a", 10)
    assert s.changes(0)[0] and s.changes(1)[0]
    s.schedule()
    assert set(s.changes(0)[1]) == {"a"}
    assert s.changes(0) == (False, {}, [])
    assert set(s.changes(1)[1]) == {"a"}  # reader 1's own cursor
    s.reset_changes(1)
    assert s.changes(1) == (True, full(s), [])
    s._check_invariants()
