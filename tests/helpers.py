"""Shared helpers for the test-suite."""

from __future__ import annotations

import shutil
import time
from collections import deque
from pathlib import Path

DEADLINE_S = 60.0  # generous: the 2-core machine may be busy with other work


class Clock:
    """A clock that moves only when a test sets ``now``."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Out:
    """An engine output object: the request's key and the tokens it produced."""

    def __init__(self, request_id, n):
        self.request_id, self.new_token_ids = request_id, [0] * n


def raised(call, *args) -> tuple[type, str] | None:
    """What ``call(*args)`` raised (its type and message), or None: two paths that
    must behave alike are compared by it, errors included."""
    try:
        call(*args)
    except Exception as e:  # noqa: BLE001 - compared by the caller
        return type(e), str(e)
    return None


def wait_for(cond, what: str, timeout: float = DEADLINE_S, every: float = 0.01) -> None:
    """Poll ``cond()`` until it holds; fail naming ``what`` after ``timeout`` seconds.
    ``every`` only spaces the polls: this is a wait for a condition."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f} s waiting for {what}"
        time.sleep(every)


def remove_tree(directory: Path) -> None:
    """Remove ``directory`` as a tmp cleaner would, while a writer (vtc's file worker)
    may still be adding files to it: removed again until it is gone."""

    def removed() -> bool:
        shutil.rmtree(directory, ignore_errors=True)
        return not directory.exists()

    wait_for(removed, f"{directory} removed")


def state(s, rids=(), tokens: bool = True) -> dict:
    """Everything observable about a scheduler, for before/after comparisons
    (``tokens=False``: without the token tallies, which a snapshot does not keep)."""
    return {
        "counters": s.counters(),
        "services": s.services() if hasattr(s, "services") else None,
        "tokens": s.tokens() if tokens and hasattr(s, "tokens") else None,
        "active": s.active_clients() if hasattr(s, "active_clients") else None,
        "weights": {c: s.weight(c) for c in s.clients()},
        "occupancy": s.occupancy,
        "num_waiting": s.num_waiting,
        "num_running": s.num_running,
        "running": s.running(),
        "peek": s.peek(),
        "status": {r: s.status(r) for r in rids},
    }


def run_engine(s, steps: int, outputs: dict[int, int]) -> list[int]:
    """Drive ``s`` like an engine for ``steps`` iterations.

    ``outputs`` maps request id -> output length; finished ids are returned.
    """
    finished = []
    for _ in range(steps):
        s.schedule()
        s.decode()
        for rid in s.running():
            if s.generated(rid) >= outputs[rid]:
                s.finish(rid)
                finished.append(rid)
    return finished


def drive_random(
    s,
    rng,
    steps: int,
    clients,
    *,
    arrivals: int,
    prompt: int,
    output: int,
    first_rid: int = 0,
) -> list[list[int]]:
    """Drive ``s`` like an engine with random arrivals for ``steps`` steps: each
    step submits 0..``arrivals`` requests (client from ``clients``, prompt
    1..``prompt``, output length 1..``output``), schedules, decodes and finishes
    what is done. Returns each step's admissions (same ``rng`` seed, same run)."""
    rid = first_rid
    admitted = []
    outputs: dict[int, int] = {}
    for _ in range(steps):
        for _ in range(rng.randint(0, arrivals)):
            rid += 1
            s.submit(rid, rng.choice(clients), rng.randint(1, prompt))
            outputs[rid] = rng.randint(1, output)
        admitted.append(s.schedule())
        s.decode()
        for r in s.running():
            if s.generated(r) >= outputs[r]:
                s.finish(r)
    return admitted


class FairnessReference:
    """The fairness window as ``TenantMetrics.refresh`` computed it in Python
    before ``vtc._core.FairnessWindow`` (the reference of its tests): snapshots of
    every tenant's service and of the backlogged set, by name."""

    def __init__(self, window: float) -> None:
        self.window = window
        self.history: deque = deque()
        self.before: dict = {}  # the last refresh's start: {tenant: service}

    def refresh(self, core, now: float) -> tuple[float | None, float, int]:
        from vtc.metrics import jain_index

        services = {str(k): v for k, v in core.services().items()}
        counters = {str(k): v for k, v in core.counters().items()}
        backlogged = {str(k) for k, (w, _) in core.active_clients().items() if w}
        history = self.history
        while len(history) > 1 and now - history[1][0] >= self.window:
            history.popleft()
        start, before, was_backlogged = history[0] if history else (now, {}, frozenset())
        self.before = before
        if not history or now - history[-1][0] >= self.window / 32:
            history.append((now, dict(services), frozenset(backlogged)))
        spread = [counters[t] for t in backlogged]
        jain = None
        if now > start:
            both = was_backlogged.intersection(backlogged)
            jain = jain_index([services[t] - before[t] for t in both])
        return jain, max(spread) - min(spread) if len(spread) > 1 else 0.0, len(backlogged)

    def gains(self, core) -> dict:
        """Every tenant's gain over the last refresh's window, as the labels used it."""
        return {str(k): v - self.before.get(str(k), 0.0) for k, v in core.services().items()}
