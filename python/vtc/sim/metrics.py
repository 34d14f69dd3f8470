"""Fairness and performance metrics over a :class:`~vtc.sim.engine.SimResult`.

Steps are the unit of time.  "Service" is the weighted service the scheduler
reports (``scheduler.service(c)``: ``wp`` per prompt token plus ``wq`` per
output token, divided by the client's weight); "tokens" are the same
without the division by the weight.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from vtc.sim.engine import SimResult
from vtc.sim.workloads import Client


def bound_u(wp: float, wq: float, M: int, max_prompt: int) -> float:
    """``U = max(wp * L_input, wq * M)``: VTC keeps backlogged clients within ``2U``."""
    return max(wp * max_prompt, wq * M)


def result_u(result: SimResult) -> float:
    """``U`` for a run's parameters and workload."""
    return bound_u(result.wp, result.wq, result.M, result.max_prompt)


def service(result: SimResult, client: Client) -> np.ndarray:
    """``W_c(0, t)`` for ``t = 0..steps`` (weighted service, as the scheduler counts it)."""
    return np.frombuffer(result.service[client], dtype=np.float64)


def tokens(result: SimResult, client: Client) -> np.ndarray:
    """Like :func:`service`, in weighted tokens (``wp``/``wq`` weighting, not divided by weight)."""
    return service(result, client) * result.weights[client]


def backlogged(result: SimResult, client: Client) -> np.ndarray:
    """Per step, whether ``client`` had requests waiting (boolean array of length ``steps``)."""
    return np.frombuffer(result.backlogged[client], dtype=np.uint8).astype(bool)


def max_drift(result: SimResult, f: Client, g: Client, end: int | None = None) -> float:
    """``max |W_f(t1, t) - W_g(t1, t)|`` over every interval in which both are backlogged.

    ``t1`` is the start of a maximal run of steps during which both ``f`` and
    ``g`` had requests waiting, ``t`` any step of that run.  For two clients
    that are backlogged from the start this is
    ``max_t |W_f(0, t) - W_g(0, t)|``.  Only steps before ``end`` (default: the
    whole run) count; 0 if the two are never backlogged together.
    """
    both = (backlogged(result, f) & backlogged(result, g))[:end]
    diff = service(result, f) - service(result, g)
    edges = np.diff(np.concatenate(([0], both.view(np.int8), [0])))
    starts = np.flatnonzero(edges == 1)
    ends = np.flatnonzero(edges == -1)  # exclusive
    worst = 0.0
    for s, e in zip(starts, ends):
        worst = max(worst, float(np.max(np.abs(diff[s + 1 : e + 1] - diff[s]))))
    return worst


def max_group_drift(
    result: SimResult,
    f: Sequence[Client],
    g: Sequence[Client],
    weights: tuple[float, float] = (1.0, 1.0),
) -> float:
    """:func:`max_drift` between two groups of clients (priority bands): each
    group's service summed and divided by its weight, a group backlogged while
    any of its clients is."""

    def group(clients: Sequence[Client], w: float) -> tuple[np.ndarray, np.ndarray]:
        busy = np.logical_or.reduce([backlogged(result, c) for c in clients])
        return busy, sum(service(result, c) for c in clients) / w

    (bf, sf), (bg, sg) = group(f, weights[0]), group(g, weights[1])
    both = bf & bg
    diff = sf - sg
    edges = np.diff(np.concatenate(([0], both.view(np.int8), [0])))
    worst = 0.0
    for s, e in zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)):
        worst = max(worst, float(np.max(np.abs(diff[s + 1 : e + 1] - diff[s]))))
    return worst


def max_pair_drift(result: SimResult, clients: Sequence[Client] | None = None) -> float:
    """The largest :func:`max_drift` over all pairs of ``clients`` (default: all)."""
    clients = result.clients if clients is None else clients
    return max(
        (max_drift(result, f, g) for f, g in itertools.combinations(clients, 2)), default=0.0
    )


def throughput(result: SimResult, start: int = 0, end: int | None = None) -> float:
    """Weighted tokens processed per step over ``[start, end)``."""
    end = result.steps if end is None else end
    return (result.work[end] - result.work[start]) / (end - start)


def shares(result: SimResult, start: int = 0, end: int | None = None) -> dict[Client, float]:
    """Each client's fraction of the weighted tokens delivered over ``[start, end)``."""
    end = result.steps if end is None else end
    got = {c: float(tokens(result, c)[end] - tokens(result, c)[start]) for c in result.clients}
    total = sum(got.values())
    return {c: (v / total if total else 0.0) for c, v in got.items()}


def _demand(result: SimResult, client: Client) -> np.ndarray:
    """Cumulative weighted service requested by ``client`` by arrival, like :func:`service`."""
    per_step = np.zeros(result.steps + 1)
    w = result.weights[client]
    for r, out in zip(result.requests, result.output_len):
        if r.client == client and r.arrival < result.steps:
            per_step[r.arrival + 1] += (result.wp * r.prompt_len + result.wq * out) / w
    return np.cumsum(per_step)


def service_difference(result: SimResult, window: int, ticks: int = 100) -> np.ndarray:
    """The VTC paper's service difference, one value per window (per step units).

    Windows of ``window`` steps are centred on ``ticks`` points evenly spread
    over the run (clipped at its ends).  In each, with ``y_j`` the service
    rate client ``j`` received and ``r_j`` the rate it requested (the
    service of the requests that arrived in the window),
    ``sum_j min(max_k y_k - y_j, |r_j - y_j|)``: how far each client falls
    short of the best-served one, except where that is explained by the
    client asking for less.  Multiply by steps per second for tokens/s.
    """
    centres = np.arange(ticks) * result.steps / ticks
    lo = np.clip(np.round(centres - window / 2), 0, result.steps).astype(int)
    hi = np.clip(np.round(centres + window / 2), 0, result.steps).astype(int)
    keep = hi > lo
    lo, hi = lo[keep], hi[keep]
    length = hi - lo
    y = np.array(
        [(service(result, c)[hi] - service(result, c)[lo]) / length for c in result.clients]
    )
    r = np.array(
        [(_demand(result, c)[hi] - _demand(result, c)[lo]) / length for c in result.clients]
    )
    return np.minimum(y.max(axis=0) - y, np.abs(r - y)).sum(axis=0)


def ttft(result: SimResult, clients: Sequence[Client] | None = None) -> np.ndarray:
    """First-token latencies in steps (arrival to the end of the first decode step).

    Only requests admitted during the run count; ``clients`` restricts to theirs.
    """
    wanted = None if clients is None else set(clients)
    return np.array(
        [
            a + 1 - r.arrival
            for r, a in zip(result.requests, result.first_admit)
            if a >= 0 and (wanted is None or r.client in wanted)
        ],
        dtype=float,
    )


def percentile(values: np.ndarray, q: float) -> float:
    """The ``q``-th percentile of ``values``, NaN when there are none."""
    return float(np.percentile(values, q)) if len(values) else float("nan")
