"""Snapshots: fairness state survives an engine restart."""

from __future__ import annotations

import random

import pytest

import vtc
from helpers import drive_random, state


def _drive(s, rng: random.Random, steps: int, first_rid: int) -> list[list[int]]:
    """Submit, schedule, decode and finish for ``steps`` steps; return admissions."""
    clients = ["a", "b", 7, "long-tenant-name"]
    return drive_random(
        s, rng, steps, clients, arrivals=3, prompt=60, output=20, first_rid=first_rid
    )


def _drain(s) -> None:
    for r in s.running():
        s.finish(r)
    while (r := s.peek()) is not None:
        s.cancel(r)


def test_restored_scheduler_makes_the_same_decisions():
    rng = random.Random(1)
    a = vtc.Scheduler(M=300, wp=1.0, wq=2.0)
    a.set_weight("b", 3.0)
    _drive(a, rng, 200, 0)
    _drain(a)  # the engine restarts: its batch and queue are gone
    b = vtc.Scheduler.from_snapshot(a.snapshot())
    assert state(b, tokens=False) == state(a, tokens=False)
    assert b.tokens() == {c: (0, 0) for c in a.clients()}  # tallies are not kept
    assert b.clients() == a.clients() and b.weight("b") == 3.0
    assert repr(b) == repr(a)
    seed = rng.random()
    before = a.tokens()
    after_a = _drive(a, random.Random(seed), 300, 10_000)
    after_b = _drive(b, random.Random(seed), 300, 10_000)
    assert after_a == after_b and sum(map(len, after_a)) > 50
    assert state(b, tokens=False) == state(a, tokens=False)
    # from the restart on, both counted the same tokens
    since = {
        c: tuple(x - y for x, y in zip(t, before.get(c, (0, 0)))) for c, t in a.tokens().items()
    }
    assert b.tokens() == since
    b._check_invariants()


def test_restore_keeps_the_lift_reference():
    """With nobody backlogged, a returning client is lifted to the counter of
    the client that last left: that reference must survive the restart."""
    a = vtc.Scheduler(M=1000)
    a.submit(1, "x", 500)
    a.schedule()
    a.finish(1)  # x left the backlog last, at 500
    b = vtc.Scheduler.from_snapshot(a.snapshot())
    b.submit(2, "newcomer", 10)
    assert b.counter("newcomer") == 500.0


@pytest.mark.parametrize("cut", [0, 1, 8, 12, 20, 24, 30, -1])
def test_truncated_snapshot_is_rejected(cut):
    data = vtc.Scheduler(M=100).snapshot()
    with pytest.raises(vtc.SnapshotError, match="cannot restore snapshot"):
        vtc.Scheduler.from_snapshot(data[:cut])


def test_corrupted_snapshot_is_rejected_at_every_byte():
    s = vtc.Scheduler(M=100)
    s.submit(1, "tenant", 10)
    s.schedule()
    data = s.snapshot()
    for i in range(len(data)):
        bad = bytearray(data)
        bad[i] ^= 0x01
        with pytest.raises(vtc.SnapshotError):
            vtc.Scheduler.from_snapshot(bytes(bad))
    with pytest.raises(ValueError, match="bad magic"):
        vtc.Scheduler.from_snapshot(b"not a snapshot at all, just bytes")
    with pytest.raises(TypeError, match="bytes"):
        vtc.Scheduler.from_snapshot(12)


def test_other_version_is_rejected_with_its_number():
    data = bytearray(vtc.Scheduler(M=100).snapshot())
    data[8:12] = (vtc.SNAPSHOT_VERSION + 1).to_bytes(4, "little")
    with pytest.raises(vtc.SnapshotError, match=f"version {vtc.SNAPSHOT_VERSION + 1}"):
        vtc.Scheduler.from_snapshot(bytes(data))
