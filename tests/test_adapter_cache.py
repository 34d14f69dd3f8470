"""vtc.adapter.Requests' answers to the engine's hot questions (``head``,
``num_waiting``): the head asked of the core once per change within a pass,
never stale (the count is the core's own). Every check compares the
answer with the core's own, after each kind of change, inside and outside a
scheduling pass (issue 20, item 4)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

import vtc
from vtc.adapter import ASIDE, RUNNING, Adapter, Requests
from vtc.config import EngineConfig


class Counting:
    """A core that counts the peeks the engine's hot questions make."""

    def __init__(self, core: vtc.Scheduler) -> None:
        self._core = core
        self.peeks = 0

    def peek(self) -> Any:
        self.peeks += 1
        return self._core.peek()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._core, name)


class FakeSharing:
    """Shared counters' pass edges: each edge raises the counters queued for it
    (what ``apply_deferred`` does with a background sync's raises)."""

    def __init__(self, core: vtc.Scheduler) -> None:
        self.core = core
        self.raises: list[dict[str, float]] = []

    def pass_edge(self) -> None:
        if self.raises:
            self.core.raise_counters(self.raises.pop(0))

    def close(self) -> None:
        pass


def setup() -> tuple[Adapter, Counting]:
    ad = Adapter(vtc.Scheduler(M=10**6), EngineConfig())
    counting = Counting(ad.core)
    ad.requests.core = counting
    return ad, counting


def fresh(requests: Requests) -> Any:
    """The head as the core has it now, asked without any cache."""
    rid = requests.core._core.peek()
    return None if rid is None else requests.at(rid)


def check(ad: Adapter) -> Any:
    r = ad.requests
    assert r.num_waiting() == ad.core.num_waiting
    head = r.head()
    assert head is fresh(r)
    return head


def test_hot_questions_ask_the_core_once_per_change() -> None:
    ad, core = setup()
    r = ad.requests
    ta = ad.enqueue("a1", "A1", ("a",), 10)
    ad.enqueue("b1", "B1", ("b",), 10)
    with ad.selecting():
        assert [r.head() for _ in range(3)] == [ta] * 3
        assert [r.num_waiting() for _ in range(3)] == [2] * 3
        assert core.peeks == 1
        r.admit(ta, 0)  # a change: the head is asked again, once
        tb = r.head()
        assert tb is not ta and r.head() is tb and r.num_waiting() == 1
        assert core.peeks == 2
    assert r.head() is tb and r.head() is tb  # outside a pass: asked each time
    assert core.peeks == 4
    r.charge([(ta, 5)])  # counters move, requests do not
    ad.enqueue("c1", "C1", ("c",), 10)  # one more
    assert r.num_waiting() == 2 == ad.core.num_waiting
    r.set_aside(r.head())
    assert r.num_waiting() == 1 == ad.core.num_waiting


def test_the_head_and_count_follow_every_change_within_a_pass() -> None:
    ad, _ = setup()
    r = ad.requests
    seen = []
    with ad.selecting():
        for key, tenant in [("a1", "a"), ("a2", "a"), ("b1", "b")]:
            ad.enqueue(key, key, (tenant,), 100)
            seen.append(check(ad))
        head = check(ad)
        r.admit(head, 0)  # its tenant is charged 100: the other one's head is next
        seen.append(check(ad))
        r.set_aside(check(ad))
        seen.append(check(ad))
        r.put_back(r.get(next(iter(r._aside))), ASIDE)
        seen.append(check(ad))
        running = r.get("a1") if ad.core.status(r.get("a1").rid) == RUNNING else r.get("b1")
        r.put_back(running, RUNNING)  # preempted: back to its tenant's head
        seen.append(check(ad))
        r.admit(check(ad), 0)
        seen.append(check(ad))
        r.charge([(t, 500) for t in r if ad.core.status(t.rid) == RUNNING])
        seen.append(check(ad))
        r.charge_outputs([_Out(t.key, 1000) for t in r if ad.core.status(t.rid) == RUNNING])
        seen.append(check(ad))
        r.release(check(ad).key)  # a waiting one
        seen.append(check(ad))
        r.release(next(t.key for t in r if ad.core.status(t.rid) == RUNNING), finished=True)
        seen.append(check(ad))
        ad.enqueue("b2", "b2", ("b",), 100)
        r.admit(check(ad), 0)
        seen.append(check(ad))
        r.release(next(t.key for t in r if ad.core.status(t.rid) == RUNNING))  # cancelled
        seen.append(check(ad))
        ad.enqueue("c1", "c1", ("c",), 10)  # a new tenant, lifted to the floor
        seen.append(check(ad))
    assert len({id(t) for t in seen}) >= 3  # the head did change along the way


class _Out:
    def __init__(self, request_id: str, n: int) -> None:
        self.request_id = request_id
        self.new_token_ids = [0] * n


def test_a_counter_raised_between_passes_is_seen() -> None:
    """Outside a pass nothing is kept: a counter raised there (shared counters'
    background sync, a weights reload) decides the next head. Shared counters'
    raises at a pass's edges are outside it too."""
    ad, _ = setup()
    r = ad.requests
    ta = ad.enqueue("a1", "A1", ("a",), 10)
    tb = ad.enqueue("b1", "B1", ("b",), 10)
    with ad.selecting():
        assert r.head() is ta
    ad.core.raise_counter("a", 1000.0)
    assert check(ad) is tb
    with ad.selecting():
        assert r.head() is tb
        ad.core.set_weight("b", 1e-3)  # (not within a pass in an engine)
    r.charge([(r.get("a1"), 0)])  # nothing charged: no change
    sharing = ad.sharing = FakeSharing(ad.core)
    sharing.raises = [{"b": 2000.0}, {"a": 3000.0}]  # at the next pass's start, end
    with ad.selecting():
        assert check(ad) is ta  # b raised at the start of the pass
    assert check(ad) is tb  # a raised at its end
    ad.core.set_weight("b", 1.0)


def test_a_change_made_around_the_table_within_a_pass_is_seen() -> None:
    """The head is kept while the core's ``state_version`` stands: a change made on
    the core directly within a pass (a raised counter, a weight, a cancel) is seen
    at the next question, and the core is asked once per change."""
    ad, core = setup()
    r = ad.requests
    ta = ad.enqueue("a1", "A1", ("a",), 10)
    tb = ad.enqueue("b1", "B1", ("b",), 10)
    with ad.selecting():
        assert r.head() is ta and r.head() is ta
        peeks = core.peeks
        ad.core.raise_counter("a", 1000.0)
        assert check(ad) is tb and r.head() is tb
        assert core.peeks == peeks + 1
        ad.core.set_weight("a", 1e6)  # (a's counter stays: b is still first)
        assert check(ad) is tb
        ad.core.cancel(tb.rid)
        assert check(ad) is ta
        ad.core.status(ta.rid), ad.core.num_waiting, ad.core.changes()  # reads: no change
        assert r.head() is ta and core.peeks == peeks + 3


def test_a_charge_within_a_pass_moves_the_head() -> None:
    ad, _ = setup()
    r = ad.requests
    for key in ("a1", "b1", "a2", "b2"):
        ad.enqueue(key, key, (key[0],), 10)
    with ad.selecting():
        r.admit(check(ad), 0)
        r.admit(check(ad), 0)  # a1 and b1 running, a2 and b2 waiting
        assert check(ad) is r.get("a2")
        r.charge([(r.get("a1"), 1000)])
        assert check(ad) is r.get("b2")
        r.charge_outputs([_Out("b1", 5000)])
        assert check(ad) is r.get("a2")
        r.charge_keys([("a1", 10_000)])
        assert check(ad) is r.get("b2")


class EdgeLog:
    """Stands in for the shared counters (``Adapter.sharing``): logs each pass edge,
    and raises at the edge numbered ``fail_at`` (1: the first)."""

    def __init__(self, log: list[str], fail_at: int = 0) -> None:
        self.log, self.fail_at, self.edges = log, fail_at, 0

    def pass_edge(self) -> None:
        self.edges += 1
        self.log.append(f"edge {self.edges}")
        if self.edges == self.fail_at:
            raise RuntimeError("edge failed")


def held(ad: Adapter) -> bool:
    """Whether the selection lock is held, as another thread sees it."""
    free: list[bool] = []

    def probe() -> None:
        free.append(ad.selection_lock.acquire(blocking=False))
        if free[0]:
            ad.selection_lock.release()

    t = threading.Thread(target=probe)
    t.start()
    t.join()
    return not free[0]


def test_a_scheduling_pass_sets_up_and_undoes_everything_in_order_whatever_raises() -> None:
    """``Adapter.selecting()``: the lock held throughout, the sharing's edge at both
    ends, the head kept, the prefix lookup frozen; all undone on the way out, also
    when the body raises, nested passes leaving the lookup to the outer one, and
    an edge that raises on the way in leaving nothing held."""
    log: list[str] = []
    ad = Adapter(vtc.Scheduler(M=10**6), EngineConfig(locality_quantum=100.0))
    ad.sharing = EdgeLog(log)
    lookup = ad.set_prefix_lookup(lambda request: 0, source="a test")
    r = ad.requests

    def state() -> tuple[bool, bool, bool]:
        """(the lock held, as another thread sees it; in a pass; the lookup frozen)"""
        return (held(ad), r._in_pass, lookup.frozen)

    assert state() == (False, False, False)
    with ad.selecting():
        assert state() == (True, True, True) and log == ["edge 1"]
        with ad.selecting():  # nested: the lookup stays frozen by the outer pass
            assert state() == (True, True, True)
        assert lookup.frozen and log == ["edge 1", "edge 2", "edge 3"]
    assert state() == (False, False, False) and log[-1] == "edge 4"
    with pytest.raises(KeyError, match="the engine's pass failed"), ad.selecting():
        raise KeyError("the engine's pass failed")
    assert state() == (False, False, False) and log[-1] == "edge 6"
    ad.sharing = EdgeLog(log := [], fail_at=1)
    with pytest.raises(RuntimeError, match="edge failed"), ad.selecting():
        raise AssertionError("not entered")  # pragma: no cover
    assert state() == (False, False, False) and log == ["edge 1"]  # no closing edge


def test_one_pass_object_serves_pass_after_pass_one_at_a_time() -> None:
    """An engine keeps one ``SchedulingPass`` and enters it every step: each pass
    sets up and undoes everything as a fresh one does, a failed pass included, and
    entering it while it is in a pass raises, leaving that pass as it was."""
    log: list[str] = []
    ad = Adapter(vtc.Scheduler(M=10**6), EngineConfig(locality_quantum=100.0))
    ad.sharing = EdgeLog(log)
    lookup = ad.set_prefix_lookup(lambda request: 0, source="a test")
    r = ad.requests
    ta = ad.enqueue("a1", "A1", ("a",), 10)
    kept = ad.selecting()
    for n in range(3):
        if n == 1:
            with pytest.raises(KeyError, match="failed"), kept:
                raise KeyError("the engine's pass failed")
        with kept:
            assert (r._in_pass, lookup.frozen, r.head()) == (True, True, ta)
            with pytest.raises(RuntimeError, match="already entered"), kept:
                raise AssertionError("not entered")  # pragma: no cover
            assert (r._in_pass, lookup.frozen, held(ad)) == (True, True, True)
        assert (r._in_pass, lookup.frozen, held(ad)) == (False, False, False)
    assert log == [f"edge {i}" for i in range(1, 9)]  # 4 passes, 2 edges each
