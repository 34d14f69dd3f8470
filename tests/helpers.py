"""Shared helpers for the test-suite."""

from __future__ import annotations


def state(s, rids=()) -> dict:
    """Everything observable about a scheduler, for before/after comparisons."""
    return {
        "counters": s.counters(),
        "services": s.services() if hasattr(s, "services") else None,
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
