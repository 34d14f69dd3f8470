"""The engine model: a continuous-batching server in discrete steps, driven by a scheduler.

Each step:

1. requests that have arrived are submitted (through the RPM gate, if any);
2. ``schedule()`` admits under the KV budget ``M``;
3. ``decode()`` runs one iteration: every running request generates one
   token; the ids it returns were preempted first (they keep their generated
   tokens, wait at the head of their client's queue and come back through a
   later ``schedule()``);
4. requests that reached their output length finish.

The scheduler makes every decision; the harness only knows each request's
true output length (the scheduler never does) and records what happened.
Output lengths are capped so that ``prompt + output <= M``, which keeps every
request able to finish on its own.
"""

from __future__ import annotations

import heapq
from array import array
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Callable, Protocol

from vtc.sim.progress import Progress
from vtc.sim.workloads import Client, Request


class SchedulerLike(Protocol):
    """The part of the ``vtc.Scheduler`` API the harness drives."""

    def set_weight(self, client: Client, weight: float) -> None: ...  # noqa: D102
    def submit(self, request_id: int, client: Client, prompt_len: int) -> None: ...  # noqa: D102
    def schedule(self) -> list[int]: ...  # noqa: D102
    def decode(self) -> list[int]: ...  # noqa: D102
    def finish(self, request_id: int) -> None: ...  # noqa: D102
    def service(self, client: Client) -> float: ...  # noqa: D102

    @property
    def num_running(self) -> int: ...  # noqa: D102


SchedulerFactory = Callable[..., SchedulerLike]
"""Called as ``factory(M=..., wp=..., wq=..., policy=...)``; ``vtc.Scheduler`` by default."""


def rust_scheduler(**kwargs: object) -> SchedulerLike:
    """The default factory: the compiled ``vtc.Scheduler``."""
    from vtc import Scheduler

    return Scheduler(**kwargs)


def reference_scheduler(**kwargs: object) -> SchedulerLike:
    """The pure-Python twin ``vtc.reference.Scheduler`` (slow; for cross-checks)."""
    from vtc.reference import Scheduler

    return Scheduler(**kwargs)


class RpmGate:
    """A per-client requests-per-minute quota in front of the scheduler.

    A request is released to the scheduler only while its client has had
    fewer than ``rpm`` requests released in the last ``minute`` steps (a
    sliding window); the rest wait at the gate in arrival order and are
    never dropped.
    """

    def __init__(self, rpm: int, minute: int) -> None:
        if rpm < 1 or minute < 1:
            raise ValueError(f"rpm and minute must be >= 1, got {rpm}, {minute}")
        self.rpm = rpm
        self.minute = minute
        self._held: dict[Client, deque[int]] = {}
        self._released: dict[Client, deque[int]] = {}

    def offer(self, rid: int, client: Client) -> None:
        """A request arrives at the gate."""
        self._held.setdefault(client, deque()).append(rid)

    def release(self, step: int) -> list[int]:
        """Requests the quota lets through at ``step``, in arrival (id) order."""
        out: list[int] = []
        horizon = step - self.minute
        for client in [c for c, q in self._held.items() if q]:
            held = self._held[client]
            recent = self._released.setdefault(client, deque())
            while recent and recent[0] <= horizon:
                recent.popleft()
            while held and len(recent) < self.rpm:
                out.append(held.popleft())
                recent.append(step)
        out.sort()
        return out


@dataclass
class SimResult:
    """What one run recorded.

    ``service[c][t]`` is ``scheduler.service(c)`` (weighted service) before
    step ``t`` (so index 0 is 0 and index ``steps`` is the end of the run);
    ``work[t]`` likewise counts weighted tokens processed (``wp`` per prompt
    token at first admission, ``wq`` per decoded token), independent of
    client weights.  ``backlogged[c][t]`` is 1 when client ``c`` had arrived
    requests not running at the end of step ``t``'s admission (waiting in the
    scheduler or at the RPM gate).  Per request (indexed like ``requests``):
    ``first_admit`` and ``finish`` steps, -1 if it never happened, and the
    output length the run used (capped at ``M - prompt_len``).
    """

    requests: Sequence[Request]
    steps: int
    M: int
    wp: float
    wq: float
    policy: str
    rpm: int | None
    clients: list[Client]
    weights: dict[Client, float]
    service: dict[Client, array]
    backlogged: dict[Client, bytearray]
    work: array
    first_admit: list[int]
    finish: list[int]
    output_len: list[int]
    preemptions: int

    @property
    def max_prompt(self) -> int:
        """The largest prompt in the workload (``L_input`` of the bound)."""
        return max((r.prompt_len for r in self.requests), default=0)


def simulate(
    requests: Sequence[Request],
    steps: int,
    *,
    M: int,
    wp: float = 1.0,
    wq: float = 2.0,
    policy: str = "vtc",
    weights: dict[Client, float] | None = None,
    rpm: int | None = None,
    minute: int = 2000,
    factory: SchedulerFactory | None = None,
    progress: Progress | None = None,
) -> SimResult:
    """Run ``requests`` (sorted by arrival) for ``steps`` steps and record the service.

    ``rpm`` puts an :class:`RpmGate` (``minute`` steps long) in front of the
    scheduler; ``weights`` are set on the scheduler before the run.  Request
    ``i`` is submitted with id ``i``.
    """
    sched = (factory or rust_scheduler)(M=M, wp=wp, wq=wq, policy=policy)
    weights = dict(weights or {})
    for c, w in weights.items():
        sched.set_weight(c, w)
    n = len(requests)
    clients: list[Client] = sorted(
        set(weights) | {r.client for r in requests}, key=lambda c: (isinstance(c, str), c)
    )
    cid = {c: k for k, c in enumerate(clients)}
    arrival = [r.arrival for r in requests]
    owner = [cid[r.client] for r in requests]
    prompt = [r.prompt_len for r in requests]
    for i, r in enumerate(requests):
        if not 1 <= r.prompt_len < M or r.output_len < 1:
            raise ValueError(f"request {i} ({r}) cannot run with M={M}")
        if i and arrival[i] < arrival[i - 1]:
            raise ValueError("requests must be sorted by arrival")
    output = [min(r.output_len, M - r.prompt_len) for r in requests]
    gate = RpmGate(rpm, minute) if rpm is not None else None

    generated = [0] * n  # tokens generated before the current stint
    stint = [0] * n  # step of the current admission
    first_admit = [-1] * n
    finish = [-1] * n
    due: dict[int, int] = {}  # running request -> step at which it finishes
    heap: list[tuple[int, int]] = []  # (finish step, rid); stale after a preemption
    waiting = [0] * len(clients)  # arrived and not running, per client
    service = [array("d", [0.0]) for _ in clients]
    backlog = [bytearray() for _ in clients]
    work = array("d", [0.0])
    done = 0.0
    preemptions = 0
    svc = sched.service
    nxt = 0

    for t in range(steps):
        while nxt < n and arrival[nxt] <= t:
            waiting[owner[nxt]] += 1
            if gate is None:
                sched.submit(nxt, requests[nxt].client, prompt[nxt])
            else:
                gate.offer(nxt, requests[nxt].client)
            nxt += 1
        if gate is not None:
            for rid in gate.release(t):
                sched.submit(rid, requests[rid].client, prompt[rid])
        for rid in sched.schedule():
            waiting[owner[rid]] -= 1
            if first_admit[rid] < 0:
                first_admit[rid] = t
                done += wp * prompt[rid]
            stint[rid] = t
            f = t + output[rid] - generated[rid] - 1
            due[rid] = f
            heapq.heappush(heap, (f, rid))
        for k in range(len(clients)):
            backlog[k].append(waiting[k] > 0)
        for rid in sched.decode():
            preemptions += 1
            waiting[owner[rid]] += 1
            generated[rid] += t - stint[rid]
            del due[rid]
        done += wq * sched.num_running
        while heap and heap[0][0] <= t:
            f, rid = heapq.heappop(heap)
            if due.get(rid) == f:
                del due[rid]
                sched.finish(rid)
                finish[rid] = t
        for k, c in enumerate(clients):
            service[k].append(svc(c))
        work.append(done)
        if progress is not None and not t & 1023:
            progress.update(t)
    if progress is not None:
        progress.close()

    return SimResult(
        requests=requests,
        steps=steps,
        M=M,
        wp=wp,
        wq=wq,
        policy=policy,
        rpm=rpm,
        clients=clients,
        weights={c: weights.get(c, 1.0) for c in clients},
        service={c: service[k] for k, c in enumerate(clients)},
        backlogged={c: backlog[k] for k, c in enumerate(clients)},
        work=work,
        first_admit=first_admit,
        finish=finish,
        output_len=output,
        preemptions=preemptions,
    )
