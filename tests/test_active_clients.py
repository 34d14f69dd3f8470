"""``Scheduler.active_clients()``: every client with live requests and its
``(waiting, running)`` counts, set-aside requests counted as waiting, read
from counts the core keeps per client (and counted from the requests in
``vtc.reference``)."""

from __future__ import annotations

import random
import sys
import threading
import time

import pytest

import vtc
from vtc import reference

BOTH = [vtc.Scheduler, reference.Scheduler]


def by_status(s, rids) -> dict:
    """What counting each client's requests by ``status`` gives."""
    want: dict = {}
    for rid, client in rids.items():
        where = s.status(rid)
        if where is None:
            continue
        w, r = want.get(client, (0, 0))
        want[client] = (w, r + 1) if where == "running" else (w + 1, r)
    return want


@pytest.mark.parametrize("cls", BOTH)
def test_counts_after_each_operation(cls):
    s = cls(1000)
    assert s.active_clients() == {}
    s.set_weight("idle", 2.0)  # known, no request: absent
    s.submit(1, "a", 10)
    s.submit(2, "a", 10)
    s.submit(3, 7, 10)
    assert s.active_clients() == {"a": (2, 0), 7: (1, 0)}
    assert s.schedule() == [1, 3, 2]
    assert s.active_clients() == {"a": (0, 2), 7: (0, 1)}
    s.submit(4, "b", 10)
    s.submit(5, 7, 10)
    assert s.active_clients() == {"a": (0, 2), 7: (1, 1), "b": (1, 0)}
    s.preempt(2)
    assert s.active_clients() == {"a": (1, 1), 7: (1, 1), "b": (1, 0)}
    s.decode()
    s.finish(1)
    assert s.active_clients() == {"a": (1, 0), 7: (1, 1), "b": (1, 0)}
    s.cancel(5)  # waiting
    s.cancel(3)  # running: an abort
    assert s.active_clients() == {"a": (1, 0), "b": (1, 0)}
    assert "idle" in s.counters() and "idle" not in s.active_clients()
    active = s.active_clients()
    assert all(type(k) in (int, str) for k in active)
    assert all(type(x) is int for pair in active.values() for x in pair)


@pytest.mark.parametrize("cls", BOTH)
def test_a_client_that_finished_everything_disappears(cls):
    s = cls(1000)
    s.submit(1, "a", 10)
    s.submit(2, "b", 500)
    s.schedule()
    s.decode([1], 3)
    s.finish(1)
    assert s.active_clients() == {"b": (0, 1)}
    assert "a" in s.counters()  # still known (until forget_idle, in the core)
    if cls is vtc.Scheduler:  # the reference has no forget_idle
        assert s.forget_idle() == 1
        assert "a" not in s.counters()
        assert s.active_clients() == {"b": (0, 1)}  # b has a request: kept
    s.submit(3, "a", 5)  # back: a new client, perhaps at the forgotten id
    assert s.active_clients() == {"a": (1, 0), "b": (0, 1)}
    s.finish(2)
    s.cancel(3)
    assert s.active_clients() == {}


@pytest.mark.parametrize("cls", BOTH)
def test_a_set_aside_request_counts_as_waiting(cls):
    s = cls(1000)
    s.submit(1, "a", 10)
    s.submit(2, "a", 10)
    s.submit(3, "b", 10)
    first = s.set_aside()
    assert s.status(first) == "aside"
    assert s.num_waiting == 2  # out of the queue...
    assert s.active_clients() == {"a": (2, 0), "b": (1, 0)}  # ...still waiting here
    second, third = s.set_aside(), s.set_aside()
    assert s.set_aside() is None and s.num_waiting == 0
    assert s.active_clients() == {"a": (2, 0), "b": (1, 0)}
    if cls is vtc.Scheduler:
        assert s.forget_idle() == 0  # a client with set-aside requests is not idle
    s.put_back(third)
    s.put_back(second)
    assert s.active_clients() == {"a": (2, 0), "b": (1, 0)}
    owner = {1: "a", 2: "a", 3: "b"}
    want = {"a": (2, 0), "b": (1, 0)}
    s.cancel(first)  # cancelled while set aside
    w, r = want[owner[first]]
    want[owner[first]] = (w - 1, r)
    assert s.active_clients() == {c: v for c, v in want.items() if v != (0, 0)}
    rid = s.pop()
    w, r = want[owner[rid]]
    want[owner[rid]] = (w - 1, r + 1)
    assert s.active_clients() == {c: v for c, v in want.items() if v != (0, 0)}
    assert s.active_clients() == by_status(s, owner)


def test_decode_preempting_by_itself_moves_the_victim_to_waiting():
    for cls in BOTH:
        s = cls(25)
        s.submit(1, "x", 12)
        s.submit(2, "y", 11)
        s.schedule()
        assert s.decode() == []
        assert s.active_clients() == {"x": (0, 1), "y": (0, 1)}
        assert s.decode() == [1]
        assert s.active_clients() == {"x": (1, 0), "y": (0, 1)}


def test_a_restored_scheduler_has_no_active_client():
    s = vtc.Scheduler(1000)
    s.submit(1, "a", 10)
    s.schedule()
    assert s.active_clients() == {"a": (0, 1)}
    assert vtc.Scheduler.from_snapshot(s.snapshot()).active_clients() == {}


def test_core_and_reference_agree_with_counting_statuses_on_a_random_run():
    rng = random.Random(3)
    fast, ref = vtc.Scheduler(300), reference.Scheduler(300)
    clients: dict = {}
    seen_both = seen_aside = False
    for rid in range(3000):
        op = rng.random()
        for s in (fast, ref):
            if op < 0.35:
                s.submit(rid, clients.setdefault(rid, "abcde"[rid * 7 % 5]), 1 + rid % 40)
            elif op < 0.5:
                s.schedule()
            elif op < 0.6:
                try:
                    s.decode()
                except vtc.CapacityError:  # a lone request cannot grow: it is done
                    s.finish(s.running()[0])
            elif op < 0.7 and s.running():
                s.preempt(s.running()[0])
            elif op < 0.78 and s.running():
                s.finish(s.running()[-1])
            elif op < 0.84:
                s.set_aside()
            elif op < 0.9:
                aside = [r for r in clients if s.status(r) == "aside"]
                if aside:
                    s.put_back(max(aside))
            elif op < 0.95:
                live = [r for r in clients if s.status(r) is not None]
                if live:
                    s.cancel(live[rid % len(live)])
            elif s is fast:  # the reference has no forget_idle; it changes no decision
                s.forget_idle()
        active = fast.active_clients()
        assert active == ref.active_clients() == by_status(fast, clients), rid
        seen_both |= any(w and r for w, r in active.values())
        seen_aside |= any(fast.status(r) == "aside" for r in clients)
    fast._check_invariants()
    assert seen_both and seen_aside


def test_a_call_from_another_thread_sees_consistent_counts():
    """While the main thread schedules, decodes, preempts, sets aside and puts
    back (none of which adds or ends a request), every read from another thread
    gives each client exactly its request count; then, while the main thread
    finishes and cancels, every read shows counts that only shrink and that
    agree with the running total it saw."""
    s = vtc.Scheduler(4000)
    per_client = {f"t{i}": 20 + i for i in range(8)} | {3: 5}
    owner: dict = {}
    for client, n in per_client.items():
        for _ in range(n):
            rid = len(owner) + 1
            owner[rid] = client
            s.submit(rid, client, 1 + rid % 50)
    stop = threading.Event()
    reads: list = []
    errors: list = []

    def reader():
        try:
            while not stop.is_set():
                reads.append(s.active_clients())
        except Exception as e:  # noqa: BLE001 -- reported below
            errors.append(e)

    def let_reader_run():
        """Wait (the GIL released) until the reader has read again."""
        n, deadline = len(reads), time.monotonic() + 10.0
        while len(reads) == n and not errors and time.monotonic() < deadline:
            time.sleep(0.0005)

    t = threading.Thread(target=reader)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch threads often: reads fall between many calls
    t.start()
    try:
        for step in range(400):
            if step % 10 == 0:
                let_reader_run()
            s.schedule()
            s.decode()
            running = s.running()
            if running and step % 3 == 0:
                s.preempt(running[step % len(running)])
            aside = [s.set_aside() for _ in range(step % 4)]
            for r in reversed([r for r in aside if r is not None]):
                s.put_back(r)
        phase1 = len(reads)
        for step in range(400):
            if step % 10 == 0:
                let_reader_run()
            s.schedule()
            s.decode()
            running = s.running()
            if running:
                s.finish(running[0])
            if step % 5 == 0 and s.peek() is not None:
                s.cancel(s.peek())
    finally:
        stop.set()
        t.join()
        sys.setswitchinterval(interval)
    assert not errors, errors
    assert phase1 >= 40 and len(reads) >= phase1 + 40  # the reader ran during both phases
    totals = dict(per_client)
    for active in reads[:phase1]:
        assert {c: w + r for c, (w, r) in active.items()} == totals
    prev = totals
    for active in reads[phase1:]:
        now = {c: w + r for c, (w, r) in active.items()}
        assert all(0 < n <= prev.get(c, 0) for c, n in now.items())  # no one gains
        prev = now
    assert s.active_clients() == by_status(s, owner)
    s._check_invariants()
