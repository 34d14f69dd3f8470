"""Schedulers the simulator compares against that are not the core's policies.

:class:`LpmScheduler` is longest-prefix-match, SGLang's ``lpm`` policy (and
the throughput baseline of Cao et al., "Locality-aware Fair Scheduling in
LLM Serving"): among the waiting requests, the one whose prompt has the
longest prefix in the prefix cache, the earliest on ties.  It implements the
part of the ``vtc.Scheduler`` API the harness drives
(:class:`~vtc.sim.engine.SchedulerLike`), with the same accounting as the
core's linear cost (so ``service`` and drift compare with VTC's) and the
same no-skipping admission and preemption as the core's ``fcfs``; the cache
reaches it through ``use_prefix_lookup`` (:func:`~vtc.sim.engine.simulate`
calls it when the run has a cache; without one every hit is 0 and it is FCFS).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Callable

from vtc.sim.workloads import Client


@dataclass
class _Req:
    client: Client
    prompt: int
    seq: int
    group: Hashable
    cached: int = 0
    generated: int = 0
    paid: bool = False


class LpmScheduler:
    """Longest prefix match: the waiting request with the longest cached prefix.

    Requests that share a prefix path (``prefix_of``) wait in one FIFO queue:
    they would hit the same cached blocks (but for a preempted request's own
    blocks, and a preempted request goes back to the head of its queue).
    ``peek()`` looks up the head of every queue and names the one with the
    longest hit, the earliest submitted among equals.  Unlike SGLang, which
    falls back to FCFS when more than 128 requests wait, it always matches.

    Accounting is the core's linear cost: ``wp * (prompt - cached_len)`` at
    first admission and ``wq`` per generated token, divided by the client's
    weight; ``service(c)`` is the total.
    """

    def __init__(self, M: int, wp: float = 1.0, wq: float = 2.0, policy: str = "lpm") -> None:
        if policy != "lpm":
            raise ValueError(f"LpmScheduler runs policy 'lpm', got {policy!r}")
        self.M = M
        self.wp = wp
        self.wq = wq
        self.policy = policy
        self._lookup: Callable[[int], int] | None = None
        self._prefix_of: Callable[[int], Hashable] | None = None
        self._requests: dict[int, _Req] = {}
        self._queues: dict[Hashable, deque[int]] = {}  # non-empty only
        self._running: dict[int, None] = {}  # in admission order
        self._service: dict[Client, float] = {}
        self._inv_w: dict[Client, float] = {}
        self._seq = 0
        self.occupancy = 0

    def use_prefix_lookup(
        self, lookup: Callable[[int], int], prefix_of: Callable[[int], Hashable]
    ) -> None:
        """``lookup(rid)``: tokens of request ``rid``'s prompt in the cache now;
        ``prefix_of(rid)``: its shared prefix path (equal paths, equal hits)."""
        self._lookup = lookup
        self._prefix_of = prefix_of

    @property
    def num_running(self) -> int:
        """Requests admitted and not finished or preempted."""
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        """Requests submitted or preempted and not admitted."""
        return sum(len(q) for q in self._queues.values())

    def set_weight(self, client: Client, weight: float) -> None:
        """Service to ``client`` counts ``1 / weight``."""
        self._inv_w[client] = 1.0 / weight

    def service(self, client: Client) -> float:
        """Weighted service ``client`` received (as the core's ``service``)."""
        return self._service.get(client, 0.0)

    def submit(
        self, request_id: int, client: Client, prompt_len: int, cached_len: int | None = None,
        **_: int,
    ) -> None:  # fmt: skip
        """Queue a request (other keywords, e.g. ``priority``, are ignored)."""
        if request_id in self._requests:
            raise ValueError(f"request {request_id} is already live")
        if not 1 <= prompt_len <= self.M:
            raise ValueError(f"bad prompt_len {prompt_len} for M={self.M}")
        group = None if self._prefix_of is None else self._prefix_of(request_id)
        self._seq += 1
        r = _Req(client, prompt_len, self._seq, group, cached_len or 0)
        self._requests[request_id] = r
        self._queues.setdefault(group, deque()).append(request_id)

    def peek(self) -> int | None:
        """The request ``pop()`` would admit: the queue head with the longest hit."""
        best, key = None, None
        lookup = self._lookup
        for q in self._queues.values():
            rid = q[0]
            k = (-lookup(rid) if lookup is not None else 0, self._requests[rid].seq)
            if key is None or k < key:
                best, key = rid, k
        return best

    def pop(self, cached_len: int | None = None) -> int | None:
        """Admit the request ``peek()`` names (no KV check: the engine made it)."""
        rid = self.peek()
        if rid is None:
            return None
        r = self._requests[rid]
        if cached_len is not None:
            r.cached = cached_len
        q = self._queues[r.group]
        q.popleft()
        if not q:
            del self._queues[r.group]
        self.occupancy += r.prompt + r.generated
        if not r.paid:
            r.paid = True
            self._charge(r.client, self.wp * (r.prompt - r.cached))
        self._running[rid] = None
        return rid

    def schedule(self) -> list[int]:
        """Admit in ``peek()`` order while the next request fits in ``M``."""
        out = []
        while True:
            rid = self.peek()
            if rid is None:
                break
            r = self._requests[rid]
            if self.occupancy + r.prompt + r.generated > self.M:
                break
            out.append(self.pop())
        return out

    def decode(self) -> list[int]:
        """One iteration: each running request generates a token; if the batch
        would outgrow ``M``, the latest admissions are preempted first (returned)."""
        victims = []
        if self.occupancy + len(self._running) > self.M:
            order = list(reversed(self._running))
            occ, keep = self.occupancy, len(order)
            while occ + keep > self.M:
                if keep == 1:
                    raise RuntimeError("the last running request cannot grow within M")
                r = self._requests[order[len(victims)]]
                occ -= r.prompt + r.generated
                keep -= 1
                victims.append(order[len(victims)])
            for rid in victims:
                r = self._requests[rid]
                del self._running[rid]
                self.occupancy -= r.prompt + r.generated
                self._queues.setdefault(r.group, deque()).appendleft(rid)
        per_client: dict[Client, int] = {}
        for rid in self._running:
            r = self._requests[rid]
            r.generated += 1
            per_client[r.client] = per_client.get(r.client, 0) + 1
        self.occupancy += len(self._running)
        for c, t in per_client.items():
            self._charge(c, self.wq * t)
        return victims

    def finish(self, request_id: int) -> None:
        """A running request is done."""
        del self._running[request_id]
        r = self._requests.pop(request_id)
        self.occupancy -= r.prompt + r.generated

    def _charge(self, client: Client, amount: float) -> None:
        self._service[client] = self._service.get(client, 0.0) + amount * self._inv_w.get(
            client, 1.0
        )


def lpm_scheduler(**kwargs: object) -> LpmScheduler:
    """A factory for :func:`~vtc.sim.engine.simulate`: ``factory=lpm_scheduler, policy="lpm"``."""
    return LpmScheduler(**kwargs)  # type: ignore[arg-type]
