"""The background sync's CPU budget (``SharedCounters.cpu_share``, ``VTC_SYNC_CPU_SHARE``):
after a sync that cost more CPU than its share of the period, the thread pauses longer,
so that its syncs hold the interpreter lock, and so take from the engine thread, at most
that share of the time; never so long that the others take the replica for dead."""

from __future__ import annotations

import threading
import time

import pytest

import vtc
from vtc import distributed as D
from vtc.config import DEFAULT_SYNC_CPU_SHARE


def burn(seconds: float) -> None:
    """Spend ``seconds`` of this thread's CPU time."""
    t0 = time.thread_time()
    while time.thread_time() - t0 < seconds:
        pass


class CostlyStore:
    """A store whose every sync costs ``cpu`` seconds of CPU and then fails."""

    def __init__(self, cpu: float) -> None:
        self.cpu = cpu
        self.calls = 0

    def sync(self, req: D.SyncRequest) -> D.SyncReply:
        self.calls += 1
        burn(self.cpu)
        raise ConnectionError("down")


class Pauses:
    """Stands in for the thread's stop event: records each pause, stops after ``n``."""

    def __init__(self, n: int) -> None:
        self.n, self.pauses, self.done = n, [], threading.Event()

    def wait(self, timeout: float) -> bool:
        self.pauses.append(timeout)
        if len(self.pauses) > self.n:
            self.done.set()
            return True
        return False

    def set(self) -> None:
        self.done.set()

    def clear(self) -> None:
        pass


def test_the_pause_keeps_the_syncs_cpu_within_the_share():
    sh = D.SharedCounters(D.LocalStore(), cpu_share=0.01, liveness_ms=10_000)
    assert sh._pause_after(0.05, 0.0002, 0.003) == 0.05  # cheap: the period
    assert sh.stats.stretched == 0
    # 2 ms of CPU over 5 ms of wall: 2 / 0.01 - 5 = 195 ms, so 2 ms of every 200
    assert sh._pause_after(0.05, 0.002, 0.005) == pytest.approx(0.195)
    assert sh.stats.stretched == 1
    # however costly, at most a quarter of liveness_ms (the others must not reap it)
    assert sh._pause_after(0.05, 1.0, 1.0) == pytest.approx(2.5)
    # ... and never below the period, even when that is above the cap
    slow = D.SharedCounters(D.LocalStore(), cpu_share=0.01, liveness_ms=1000)
    assert slow._pause_after(0.4, 1.0, 1.0) == 0.4
    whole = D.SharedCounters(D.LocalStore(), cpu_share=1.0)
    assert whole._pause_after(0.05, 0.03, 0.03) == 0.05  # a share of 1: never stretched
    assert D.SharedCounters(D.LocalStore()).cpu_share == DEFAULT_SYNC_CPU_SHARE == 0.005


def test_the_background_thread_pauses_longer_after_a_costly_sync():
    store = CostlyStore(cpu=0.005)  # 5 ms of CPU a sync
    sh = D.SharedCounters(store, cpu_share=0.02, retry_ms=1e-6, liveness_ms=10_000)
    stop = Pauses(4)
    sh._stop = stop
    sh.start(vtc.Scheduler(1 << 16), interval_ms=1)
    assert stop.done.wait(120), "the background thread never paused 5 times"
    sh._thread.join(120)
    assert store.calls == 4 and sh.stats.failures == 4
    assert stop.pauses[0] == 0.001  # before the first sync: the period
    # after each: at least 5 ms / 0.02 = 250 ms less the sync's wall time (a few ms
    # here; only a sync slower than 150 ms of wall would bring it under 0.1 s)
    assert all(0.1 < p <= 2.5 for p in stop.pauses[1:]), stop.pauses
    assert sh.stats.stretched == 4 and sh.stats.cpu_seconds >= 4 * 0.005


@pytest.mark.parametrize("bad", [0, 0.0, -0.1, 1.5, float("nan"), float("inf")])
def test_a_cpu_share_out_of_range_is_refused(bad):
    with pytest.raises(ValueError, match=r"cpu_share must be in \(0, 1\], got"):
        D.SharedCounters(D.LocalStore(), cpu_share=bad)


@pytest.mark.parametrize("bad", ["0.1", None, True])
def test_a_cpu_share_of_another_type_is_refused(bad):
    with pytest.raises(TypeError, match="cpu_share must be a number in"):
        D.SharedCounters(D.LocalStore(), cpu_share=bad)
