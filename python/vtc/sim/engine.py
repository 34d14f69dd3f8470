"""The engine model: a continuous-batching server in discrete steps, driven by a scheduler.

Each step:

1. requests that have arrived are submitted (through the RPM gate, if any);
2. ``schedule()`` admits under the KV budget ``M``;
3. ``decode()`` runs one iteration: every running request generates one
   token; the ids it returns were preempted first (they keep their generated
   tokens, wait at the head of their client's queue and come back through a
   later ``schedule()``);
4. requests that reached their output length finish.

Steps 2.-4. are :class:`Engine`'s (:meth:`~Engine.admit`, then
:meth:`~Engine.run`) over a :class:`Ledger` of the requests: :func:`simulate`
drives one engine, :mod:`vtc.sim.replicas` several in lockstep.

Two options, both off by default (a run without them is what it always was):

* a prefix cache (:class:`~vtc.sim.cache.PrefixCache`): admission goes
  request by request through ``peek()`` and ``pop(cached_len=hit)``, the hit
  being what the cache holds of the request's prompt at that moment; the
  request's chains are pinned while it runs and its prompt blocks inserted
  once admitted (its prefill happens in its admission step);
* a prefill time (``prefill_time``): a step that computes ``n`` prompt tokens
  (the uncached ones, plus what a preempted request recomputes) lasts
  ``1 + prefill_time * n`` time units instead of 1, and requests arrive by
  that clock.  Steps stay decode iterations; the clock is what throughput
  per unit of time divides by.

The scheduler makes every decision; the harness only knows each request's
true output length (the scheduler never does) and records what happened.
Output lengths are capped so that ``prompt + output <= M``, which keeps every
request able to finish on its own.
"""

from __future__ import annotations

import heapq
from array import array
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from vtc.sim.cache import Chain, PrefixCache, chains
from vtc.sim.progress import Progress
from vtc.sim.workloads import Client, Request

_OWN = object()  # chain key of a request's own suffix: (_OWN, request id)


class SchedulerLike(Protocol):
    """The part of the ``vtc.Scheduler`` API the harness drives."""

    def set_weight(self, client: Client, weight: float) -> None: ...  # noqa: D102
    def submit(  # noqa: D102
        self, request_id: int, client: Client, prompt_len: int, **extra: int
    ) -> None: ...
    def schedule(self) -> list[int]: ...  # noqa: D102
    def peek(self) -> int | None: ...  # noqa: D102  (with a prefix cache)
    def pop(self, cached_len: int | None = None) -> int | None: ...  # noqa: D102  (likewise)
    def decode(self) -> list[int]: ...  # noqa: D102
    def finish(self, request_id: int) -> None: ...  # noqa: D102
    def service(self, client: Client) -> float: ...  # noqa: D102

    @property
    def num_running(self) -> int: ...  # noqa: D102

    @property
    def occupancy(self) -> int: ...  # noqa: D102


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

    Accounting extras (defaults when a harness does not fill them):
    ``generated[i]`` tokens request ``i`` generated by the end of the run
    (recomputation after a preemption not counted twice); ``recomputed[i]``
    tokens it had to recompute after preemptions (prompt + generated at
    eviction, per eviction); ``delivered[c][t]`` the weighted service the
    engine actually computed for ``c`` before step ``t``, measured by the
    harness independently of the scheduler's cost (``wp`` per computed prompt
    token, i.e. minus the prefix-cache hit, at first admission, ``wq`` per
    generated token, divided by the weight); ``occupancy_sum`` the sum over
    steps of the KV tokens held after admission.

    Prefill and the prefix cache: ``prefilled[i]`` prompt tokens request ``i``
    computed over all its admissions (what a preempted request recomputes
    included), ``reused[i]`` the tokens the prefix cache gave it over them;
    ``clock[t]`` the time at the start of step ``t`` (``t`` itself without
    ``prefill_time``); ``cache`` the run's :class:`~vtc.sim.cache.PrefixCache`
    (its counters), if any.
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
    generated: list[int] = field(default_factory=list)
    recomputed: list[int] = field(default_factory=list)
    delivered: dict[Client, array] = field(default_factory=dict)
    occupancy_sum: int = 0
    cached: list[int] = field(default_factory=list)
    prefilled: list[int] = field(default_factory=list)
    reused: list[int] = field(default_factory=list)
    clock: array = field(default_factory=lambda: array("d"))
    cache: PrefixCache | None = None

    @property
    def elapsed(self) -> float:
        """Time the run took: ``clock[steps]``, or ``steps`` without a clock."""
        return self.clock[-1] if self.clock else float(self.steps)

    @property
    def hit_rate(self) -> float:
        """Fraction of the prompt tokens admissions needed that the prefix cache gave."""
        total = sum(self.prefilled) + sum(self.reused)
        return sum(self.reused) / total if total else 0.0

    @property
    def utilization(self) -> float:
        """Mean KV occupancy after admission, as a fraction of ``M``."""
        return self.occupancy_sum / (self.steps * self.M) if self.steps else 0.0

    @property
    def max_prompt(self) -> int:
        """The largest prompt in the workload (``L_input`` of the bound)."""
        return max((r.prompt_len for r in self.requests), default=0)


class Ledger:
    """Per-request state of one run, shared by every engine that serves its requests.

    Request ``i`` (sorted by arrival, ``1 <= prompt_len < M``) runs with id
    ``i``; its output is capped at ``M - prompt_len``.  ``clients`` are the
    requests' clients plus ``extra_clients``, sorted (ints first);
    ``owner[i]`` indexes them.  An :class:`Engine` fills ``first_admit``,
    ``finish`` (-1 if it never happened), ``stint`` (the step of the current
    admission), ``generated`` (tokens generated before the current stint;
    :meth:`settle` makes it the total) and ``recomputed``; ``prefilled`` and
    ``reused`` (prompt tokens computed and taken from the prefix cache, over
    every admission).
    """

    def __init__(
        self,
        requests: Sequence[Request],
        M: int,
        extra_clients: Iterable[Client] = (),
        cached: Sequence[int] | None = None,
    ) -> None:
        n = len(requests)
        self.requests = requests
        self.M = M
        self.clients: list[Client] = sorted(
            set(extra_clients) | {r.client for r in requests},
            key=lambda c: (isinstance(c, str), c),
        )
        cid = {c: k for k, c in enumerate(self.clients)}
        self.arrival = [r.arrival for r in requests]
        self.owner = [cid[r.client] for r in requests]
        self.prompt = [r.prompt_len for r in requests]
        for i, r in enumerate(requests):
            if not 1 <= r.prompt_len < M or r.output_len < 1:
                raise ValueError(f"request {i} ({r}) cannot run with M={M}")
            if i and self.arrival[i] < self.arrival[i - 1]:
                raise ValueError("requests must be sorted by arrival")
        self.output = [min(r.output_len, M - r.prompt_len) for r in requests]
        self.hit = list(cached) if cached is not None else [0] * n
        self.generated = [0] * n
        self.stint = [0] * n
        self.first_admit = [-1] * n
        self.finish = [-1] * n
        self.recomputed = [0] * n
        self.prefilled = [0] * n
        self.reused = [0] * n

    def settle(self, steps: int, engines: Iterable[Engine]) -> None:
        """End of a ``steps``-step run: ``generated`` becomes each request's total."""
        generated, output = self.generated, self.output
        for rid, f in enumerate(self.finish):
            if f >= 0:
                generated[rid] = output[rid]
        for engine in engines:
            for rid in engine.due:
                generated[rid] += steps - self.stint[rid]


class Engine:
    """One engine of the model around its scheduler: the step (2.-4. of the module docstring).

    A step is :meth:`admit` (``schedule()``) then :meth:`run` (``decode()``
    and the finishes); the harness submits arrivals between steps and calls
    :meth:`arrive` for each.  Per client (indexed like ``ledger.clients``):
    ``waiting`` (arrived and not running), ``running`` and, with ``inv_w``
    (one over each client's weight), ``given``: the delivered service (``wp``
    per computed prompt token at first admission, ``wq`` per generated
    token, times ``inv_w``).  ``work`` counts the weighted tokens processed,
    ``preemptions`` the preemptions, ``occupancy_sum`` the KV tokens held
    after admission, summed over steps.  ``step_prefill`` is the prompt
    tokens computed by the last :meth:`admit`.  :meth:`use_cache` puts a
    prefix cache in front of admission.
    """

    def __init__(
        self,
        sched: SchedulerLike,
        ledger: Ledger,
        wp: float,
        wq: float,
        inv_w: Sequence[float] | None = None,
    ) -> None:
        self.sched = sched
        self.ledger = ledger
        self.wp = wp
        self.wq = wq
        n_clients = len(ledger.clients)
        self.waiting = [0] * n_clients
        self.running = [0] * n_clients
        self.given = [0.0] * n_clients
        self.due: dict[int, int] = {}  # running request -> step at which it finishes
        self.heap: list[tuple[int, int]] = []  # (finish step, rid); stale after a preemption
        self.work = 0.0
        self.preemptions = 0
        self.occupancy_sum = 0
        self.step_prefill = 0
        self.cache: PrefixCache | None = None
        self._chains: dict[int, list[Chain]] = {}
        # the hot loops' references in one attribute (the steps are most of a run's time)
        self._refs = (
            ledger.owner,
            ledger.prompt,
            ledger.hit,
            ledger.output,
            ledger.first_admit,
            ledger.stint,
            ledger.generated,
            ledger.recomputed,
            ledger.finish,
            self.waiting,
            self.running,
            self.given,
            inv_w,
            self.due,
            self.heap,
        )

    def use_cache(self, cache: PrefixCache) -> None:
        """Admit through ``cache`` from now on (see the module docstring)."""
        self.cache = cache

    def chains(self, rid: int) -> list[Chain]:
        """Request ``rid``'s prompt as cache chains (its shared prefix, then its own)."""
        ch = self._chains.get(rid)
        if ch is None:
            r = self.ledger.requests[rid]
            ch = self._chains[rid] = chains(r.prefix, r.prompt_len, (_OWN, rid), self.cache.block)
        return ch

    def lookup(self, rid: int) -> int:
        """The prefix-cache hit request ``rid`` would get if admitted now (tokens;
        at least its last prompt token is always computed)."""
        return min(self.cache.lookup(self.chains(rid)), self.ledger.prompt[rid] - 1)

    def prefix_of(self, rid: int) -> tuple:
        """The ids of request ``rid``'s shared prefix segments (``()`` if none):
        requests with the same ids hit the same cached blocks, but for a
        preempted request's own."""
        return tuple(key for key, _ in self.ledger.requests[rid].prefix)

    def arrive(self, rid: int) -> None:
        """Request ``rid`` arrived here (the harness submits it, or holds it at a gate)."""
        self.waiting[self.ledger.owner[rid]] += 1

    def admit(self, t: int) -> None:
        """Step ``t``, 2.: ``schedule()`` admits under the KV budget."""
        if self.cache is not None:
            self._admit_cached(t)
            return
        hit = self.ledger.hit
        computed = 0
        for rid in self.sched.schedule():
            computed += self._started(t, rid, hit[rid])
        self.occupancy_sum += self.sched.occupancy
        self.step_prefill = computed

    def _admit_cached(self, t: int) -> None:
        """:meth:`admit` through the prefix cache: ``peek()``, the KV check
        ``schedule()`` would make (no skipping), the cache's hit, ``pop(cached_len)``."""
        ledger = self.ledger
        prompt, generated = ledger.prompt, ledger.generated
        hit, first_admit = ledger.hit, ledger.first_admit
        sched, M = self.sched, ledger.M
        computed = 0
        while True:
            rid = sched.peek()
            if rid is None or sched.occupancy + prompt[rid] + generated[rid] > M:
                break
            # the hit before acquire() inserts anything: a scheduler that looks
            # hits up (LPM, locality VTC) then sees in pop() what peek() saw
            h = self.lookup(rid)
            if sched.pop(cached_len=h) != rid:
                raise RuntimeError(f"pop() did not admit request {rid}, which peek() named")
            self.cache.acquire(self.chains(rid))
            if first_admit[rid] < 0:
                hit[rid] = h  # a request's hit as charged is its first admission's
            computed += self._started(t, rid, h)
        self.occupancy_sum += sched.occupancy
        self.step_prefill = computed

    def _started(self, t: int, rid: int, h: int) -> int:
        """Request ``rid`` was admitted at step ``t`` with ``h`` prompt tokens cached:
        the bookkeeping of both admission paths; returns the tokens it computes."""
        (owner, prompt, _, output, first_admit, stint, generated, _, _,
         waiting, running, given, inv_w, due, heap) = self._refs  # fmt: skip
        k = owner[rid]
        waiting[k] -= 1
        n = prompt[rid] + generated[rid] - h
        self.ledger.prefilled[rid] += n
        self.ledger.reused[rid] += h
        if first_admit[rid] < 0:
            first_admit[rid] = t
            self.work += self.wp * prompt[rid]
            if inv_w is not None:
                given[k] += self.wp * (prompt[rid] - h) * inv_w[k]
        running[k] += 1
        stint[rid] = t
        f = t + output[rid] - generated[rid] - 1
        due[rid] = f
        heapq.heappush(heap, (f, rid))
        return n

    def run(self, t: int) -> None:
        """Step ``t``, 3. and 4.: ``decode()`` (preempted ids first), then the finishes."""
        (owner, prompt, _, _, _, stint, generated, recomputed, finish,
         waiting, running, given, inv_w, due, heap) = self._refs  # fmt: skip
        wq, sched, cache = self.wq, self.sched, self.cache
        for rid in sched.decode():
            if cache is not None:
                cache.release(self.chains(rid))
            self.preemptions += 1
            waiting[owner[rid]] += 1
            running[owner[rid]] -= 1
            generated[rid] += t - stint[rid]
            recomputed[rid] += prompt[rid] + generated[rid]
            del due[rid]
        self.work += wq * sched.num_running
        if inv_w is not None:
            for k in range(len(running)):
                if running[k]:
                    given[k] += wq * running[k] * inv_w[k]
        while heap and heap[0][0] <= t:
            f, rid = heapq.heappop(heap)
            if due.get(rid) == f:
                del due[rid]
                sched.finish(rid)
                if cache is not None:
                    cache.release(self.chains(rid))
                finish[rid] = t
                running[owner[rid]] -= 1


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
    options: dict[str, Any] | None = None,
    cached: Sequence[int] | None = None,
    predicted: Sequence[int] | None = None,
    priority: Sequence[int] | None = None,
    cache: PrefixCache | None = None,
    prefill_time: float = 0.0,
) -> SimResult:
    """Run ``requests`` (sorted by arrival) for ``steps`` steps and record the service.

    ``rpm`` puts an :class:`RpmGate` (``minute`` steps long) in front of the
    scheduler; ``weights`` are set on the scheduler before the run.  Request
    ``i`` is submitted with id ``i``.  ``options`` are extra scheduler
    keywords (``cost``, ``client_cap``, ``predictor``; with ``cost`` the
    scheduler gets no ``wp``/``wq``, which then only weigh the harness's
    ``work`` and ``delivered``).  ``cached[i]`` is request ``i``'s
    prefix-cache hit, passed as ``cached_len``; ``predicted[i]`` its
    predicted output length, passed as ``predicted_output``; ``priority[i]``
    its priority band (smaller is more urgent), passed as ``priority``.

    ``cache`` puts a prefix cache in front of admission (requests' hits come
    from it, at admission, instead of ``cached``); a scheduler with a
    ``use_prefix_lookup`` method gets the engine's :meth:`Engine.lookup` and
    :meth:`Engine.prefix_of` through it (the longest-prefix-match baseline,
    :mod:`vtc.sim.baselines`, orders its queue by them), and one with a
    ``set_prefix_lookup`` method (``vtc.Scheduler`` and ``vtc.reference.Scheduler``,
    whose locality window uses it when ``locality_quantum > 0``) gets
    :meth:`Engine.lookup`.
    ``prefill_time`` is the time one computed prompt token adds to its step
    (module docstring); requests arrive by that clock.
    """
    if cache is not None and cached is not None:
        raise ValueError("pass either cached (fixed hits) or cache (a prefix cache), not both")
    if prefill_time < 0:
        raise ValueError(f"prefill_time must be >= 0, got {prefill_time}")
    options = dict(options or {})
    if "cost" in options:
        sched = (factory or rust_scheduler)(M=M, policy=policy, **options)
    else:
        sched = (factory or rust_scheduler)(M=M, wp=wp, wq=wq, policy=policy, **options)
    weights = dict(weights or {})
    for c, w in weights.items():
        sched.set_weight(c, w)
    n = len(requests)
    ledger = Ledger(requests, M, weights, cached)
    clients = ledger.clients
    arrival, prompt, hit = ledger.arrival, ledger.prompt, ledger.hit
    gate = RpmGate(rpm, minute) if rpm is not None else None
    engine = Engine(sched, ledger, wp, wq, [1.0 / weights.get(c, 1.0) for c in clients])
    if cache is not None:
        engine.use_cache(cache)
        hook = getattr(sched, "use_prefix_lookup", None)
        if hook is not None:
            hook(engine.lookup, engine.prefix_of)
        hook = getattr(sched, "set_prefix_lookup", None)
        if hook is not None:  # locality VTC (locality_quantum=Q; unused at Q = 0)
            hook(engine.lookup)

    def submit(rid: int) -> None:
        extra = {}
        if cached is not None:
            extra["cached_len"] = hit[rid]
        if predicted is not None:
            extra["predicted_output"] = predicted[rid]
        if priority is not None:
            extra["priority"] = priority[rid]
        sched.submit(rid, requests[rid].client, prompt[rid], **extra)

    waiting, given = engine.waiting, engine.given
    service = [array("d", [0.0]) for _ in clients]
    backlog = [bytearray() for _ in clients]
    delivered = [array("d", [0.0]) for _ in clients]
    work = array("d", [0.0])
    clock = array("d", [0.0])
    now = 0.0
    svc = sched.service
    nxt = 0

    for t in range(steps):
        while nxt < n and arrival[nxt] <= now:
            engine.arrive(nxt)
            if gate is None:
                submit(nxt)
            else:
                gate.offer(nxt, requests[nxt].client)
            nxt += 1
        if gate is not None:
            for rid in gate.release(t):
                submit(rid)
        engine.admit(t)
        for k in range(len(clients)):
            backlog[k].append(waiting[k] > 0)
        engine.run(t)
        for k, c in enumerate(clients):
            service[k].append(svc(c))
            delivered[k].append(given[k])
        work.append(engine.work)
        now += 1.0 + prefill_time * engine.step_prefill
        clock.append(now)
        if progress is not None and not t & 1023:
            progress.update(t)
    if progress is not None:
        progress.close()
    ledger.settle(steps, [engine])

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
        first_admit=ledger.first_admit,
        finish=ledger.finish,
        output_len=ledger.output,
        preemptions=engine.preemptions,
        generated=ledger.generated,
        recomputed=ledger.recomputed,
        delivered={c: delivered[k] for k, c in enumerate(clients)},
        occupancy_sum=engine.occupancy_sum,
        cached=hit,
        prefilled=ledger.prefilled,
        reused=ledger.reused,
        clock=clock,
        cache=cache,
    )
