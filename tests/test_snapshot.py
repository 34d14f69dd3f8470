"""Snapshots: fairness state survives an engine restart."""

from __future__ import annotations

import pathlib
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


# -- format versions ------------------------------------------------------------------------

V1_FILE = pathlib.Path(__file__).parent / "data" / "snapshot_v1.bin"


def test_a_version_1_snapshot_loads_to_the_state_it_held():
    """``data/snapshot_v1.bin`` was written by the format-1 code (main at d516f15):

    s = vtc.Scheduler(1000, 1.5, 3.0, "vtc"); s.set_weight("alice", 2.5)
    submit 1: 7 (100), 2: "alice" (200), 3: "\\ud800x" (50), 4: -3 (30); schedule;
    decode twice; finish 4, 1, 3, 2; submit 5: "gone" (1) and cancel it;
    forget_idle() (forgets -3, whose id "gone" took); snapshot.
    """
    data = V1_FILE.read_bytes()
    assert data[8:12] == (1).to_bytes(4, "little")
    s = vtc.Scheduler.from_snapshot(data)
    assert s.clients() == ["alice", 7, "\ud800x", "gone"]
    assert s.counters() == {"alice": 122.4, 7: 156.0, "\ud800x": 81.0, "gone": 51.0}
    assert s.services() == {"alice": 122.4, 7: 156.0, "\ud800x": 81.0, "gone": 0.0}
    assert {c: s.weight(c) for c in s.clients()} == {
        "alice": 2.5,
        7: 1.0,
        "\ud800x": 1.0,
        "gone": 1.0,
    }
    # version 1 kept M, wp, wq and the policy; the rest is the default
    assert repr(s) == "Scheduler(M=1000, wp=1.5, wq=3.0, policy='vtc')"
    assert (s.client_cap, s.predictor, s.band_weights(), s.locality_quantum) == (
        None,
        "none",
        None,
        0.0,
    )
    assert all(s.credit(c) == 0.0 for c in s.clients())
    s._check_invariants()
    # written again, it is version 2 and restores to the same scheduler
    again = vtc.Scheduler.from_snapshot(s.snapshot())
    assert again.snapshot()[8:12] == vtc.SNAPSHOT_VERSION.to_bytes(4, "little") == b"\x02\0\0\0"
    assert state(again, tokens=False) == state(s, tokens=False) and repr(again) == repr(s)
    s.submit(9, "newcomer", 10)  # the lift reference (the last to leave) survived
    assert s.counter("newcomer") == 51.0
    # arguments apply to a version 1 snapshot as they always did
    t = vtc.Scheduler.from_snapshot(
        data,
        cost="context",
        client_cap=0.5,
        predictor="mean",
        band_weights={0: 2.0},
        locality_quantum=5.0,
    )
    assert (t.cost, t.client_cap, t.predictor) == (vtc.ContextCost(), 500, "mean")
    assert (t.band_weights(), t.locality_quantum) == ({0: 2.0}, 5.0)
    assert t.counters() == vtc.Scheduler.from_snapshot(data).counters()


def test_a_version_1_snapshot_is_rejected_when_any_byte_is_flipped_or_cut():
    data = V1_FILE.read_bytes()
    for i in range(len(data)):
        bad = bytearray(data)
        bad[i] ^= 0x01
        with pytest.raises(vtc.SnapshotError, match="cannot restore snapshot"):
            vtc.Scheduler.from_snapshot(bytes(bad))
    for n in range(len(data)):
        with pytest.raises(vtc.SnapshotError, match="cannot restore snapshot"):
            vtc.Scheduler.from_snapshot(data[:n])


def _configured() -> vtc.Scheduler:
    """A scheduler using every option, with credits and moving averages."""
    s = vtc.Scheduler(
        2000,
        policy="vtc",
        cost=vtc.QuadraticCost(2.0, 1.0, 0.5, 0.25, 3.0),
        client_cap=0.5,
        predictor="mean",
        band_weights={0: 3.0, 5: 0.5},
        locality_quantum=12.5,
    )
    s.set_weight("b", 2.0)
    for rid, (client, prompt, out) in enumerate([("a", 40, 5), ("b", 30, 9), (3, 20, 2)]):
        s.submit(rid, client, prompt, priority=5 * (rid % 2))
        s.schedule()
        for _ in range(out):
            s.decode()
        s.finish(rid)
    # a second round predicts from the averages and refunds the over-prediction
    for rid, (client, prompt) in enumerate([("a", 10), ("b", 10)], start=10):
        s.submit(rid, client, prompt)
    s.schedule()
    s.decode()
    for rid in (10, 11):
        s.finish(rid)
    assert s.credit("a") > 0 and s.credit("b") > 0
    return s


def test_a_version_2_snapshot_restores_the_whole_configuration_without_arguments():
    a = _configured()
    data = a.snapshot()
    assert data[8:12] == (2).to_bytes(4, "little")
    b = vtc.Scheduler.from_snapshot(data)
    assert repr(b) == repr(a)
    assert (b.cost, b.client_cap, b.predictor) == (a.cost, 1000, "mean")
    assert (b.band_weights(), b.locality_quantum, b.policy, b.M) == (
        {0: 3.0, 5: 0.5},
        12.5,
        "vtc",
        2000,
    )
    assert state(b, tokens=False) == state(a, tokens=False)
    assert {c: b.credit(c) for c in a.clients()} == {c: a.credit(c) for c in a.clients()}
    assert b.snapshot() == data
    # the moving averages came along: the same requests get the same predictions
    for s in (a, b):
        for rid, client in enumerate(["a", "b", 3], start=20):
            s.submit(rid, client, 10)
        s.schedule()
        s.decode()
    assert state(b, tokens=False) == state(a, tokens=False)
    b._check_invariants()


def test_arguments_given_replace_the_stored_configuration_and_omitted_ones_keep_it():
    a = _configured()
    data = a.snapshot()
    b = vtc.Scheduler.from_snapshot(data, cost="linear", client_cap=7, band_weights={1: 2.0})
    assert (b.cost, b.client_cap, b.band_weights()) == (vtc.LinearCost(1.0, 2.0), 7, {1: 2.0})
    assert (b.predictor, b.locality_quantum) == ("mean", 12.5)  # kept
    c = vtc.Scheduler.from_snapshot(data, predictor="none", locality_quantum=0.0, band_weights=None)
    assert (c.predictor, c.locality_quantum) == ("none", 0.0)
    assert c.band_weights() == {0: 3.0, 5: 0.5}  # None is "not given"
    assert c.counters() == a.counters()
    # a bad argument raises naming it, whatever the snapshot holds
    with pytest.raises(vtc.InvalidArgumentError, match="-1"):
        vtc.Scheduler.from_snapshot(data, locality_quantum=-1.0)
    fcfs = vtc.Scheduler(100, policy="fcfs").snapshot()
    with pytest.raises(vtc.InvalidArgumentError, match="locality"):
        vtc.Scheduler.from_snapshot(fcfs, locality_quantum=1.0)


def test_a_version_2_snapshot_is_rejected_when_any_byte_is_flipped_or_cut():
    data = _configured().snapshot()
    for i in range(len(data)):
        for bit in (0x01, 0x80):
            bad = bytearray(data)
            bad[i] ^= bit
            with pytest.raises(vtc.SnapshotError, match="cannot restore snapshot"):
                vtc.Scheduler.from_snapshot(bytes(bad))
    for n in range(len(data)):
        with pytest.raises(vtc.SnapshotError, match="cannot restore snapshot"):
            vtc.Scheduler.from_snapshot(data[:n])
    with pytest.raises(vtc.SnapshotError, match="padded"):
        vtc.Scheduler.from_snapshot(data + b"\0")
