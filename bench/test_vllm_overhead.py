"""What VTC adds to vLLM's scheduler step: ``schedule()`` + ``update_from_output()``
of vLLM's real V1 ``Scheduler`` vs ``vtc.vllm.VTCScheduler``, on identical requests.

Needs vLLM, so it runs in .venv-vllm (``make test-vllm`` builds it)::

    .venv-vllm/bin/python -m pytest bench/test_vllm_overhead.py --benchmark-only

(In .venv, where vLLM is not installed, the module is skipped.)

Workload (seeded, the same for both): TENANTS tenants, MAX_NUM_SEQS batch
slots, a waiting backlog kept at BACKLOG requests (each finished request is
replaced by a new one from a random tenant), prompts U[64, 512], outputs
U[32, 384], KV cache large enough that nothing is preempted. One benchmark
round is one engine step: the new arrivals (``add_request``), ``schedule()``,
a fake model output (one token per request past its prompt) and
``update_from_output()``. The fake model output and the construction of new
requests are the same work in both, so the difference of the two is VTC's cost
per step; the scheduler calls alone (``add_request`` + ``schedule`` +
``update_from_output``) are also timed, per step, into ``extra_info``
(``scheduler_us``: median and mean), which is the ratio the README reports.

``test_interleaved_overhead`` separates two costs that the plain comparison
mixes. VTC admits requests in another order than stock vLLM (first come,
first served), and the order alone changes vLLM's own work per step (its
per-request loops touch other requests, allocated elsewhere). A third engine,
stock vLLM's code with a waiting queue that replays VTC's admissions
(:class:`ReplayQueue`), does exactly VTC's work in VTC's order without VTC's
code: VTC/replay is the time VTC's code adds, replay/stock what the order
costs. A fourth engine, the same replay behind an O(1) queue and a mixin that
only calls vLLM's methods, both clocked as VTC's code is (:func:`floor_engine`),
is the clocks' floor: what they read for code that costs what the queue VTC
replaces costs; VTC's code is also reported net of it.

``test_metrics_overhead`` measures what the per-tenant metrics (docs/metrics.md) add
to the step: VTCScheduler with them off, in a fresh multiprocess directory and in the
default registry, interleaved, at the file's tenant count and at 1,000, the periodic
refresh at its real rate; it also checks the series against vLLM's own record.
Figures: bench/README.md.
"""

from __future__ import annotations

import math
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import pytest

# vLLM lives in .venv-vllm: run this file there (make test-vllm); make bench leaves it out.

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "vllm"))

from vllm.v1.core.sched.request_queue import RequestQueue  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm_harness import (  # noqa: E402
    make_request,
    make_scheduler,
    model_output,
    vllm_config,
    write_tiny_llama,
)

from vtc.vllm import VTCRequestQueue, VTCScheduler  # noqa: E402

TENANTS = 64
MAX_NUM_SEQS = 256
BACKLOG = 2_000
NUM_BLOCKS = 40_000  # 640k tokens: the batch never runs out of KV blocks
# Steps before measuring, measured steps, and independent engine trios in
# test_interleaved_overhead; the environment may override them (e.g.
# VTC_BENCH_WARMUP=2000 replaces the whole initial backlog first).
WARMUP = int(os.environ.get("VTC_BENCH_WARMUP", 300))
ROUNDS = int(os.environ.get("VTC_BENCH_ROUNDS", 400))
TRIALS = int(os.environ.get("VTC_BENCH_TRIALS", 3))


class Engine:
    """vLLM's scheduler driven like the engine core does, with a seeded workload."""

    def __init__(self, scheduler: Any, seed: int = 1, tenants: int = TENANTS) -> None:
        self.s = scheduler
        self.rng = random.Random(seed)
        self.tenants = tenants
        self.tenant_of: dict[str, str] = {}  # request id -> tenant
        # per tenant, the tokens vLLM computed for it, while set (see tally_charges)
        self.tally: dict[str, dict[str, int]] | None = None
        self.created: list = []  # every request, in creation order
        self.index_of: dict[str, int] = {}  # request id -> creation index
        self.admissions: list[list[int]] = []  # per step: creation indices admitted
        self.pending: list = []
        for _ in range(BACKLOG + MAX_NUM_SEQS):
            self.s.add_request(self.new_request())
        self.steps = 0
        self.min_batch = MAX_NUM_SEQS
        self.scheduler_ns: list[int] = []  # per step: the scheduler calls only

    def new_request(self) -> Any:
        rng = self.rng
        tenant = f"t{rng.randrange(self.tenants)}"
        request = make_request(tenant, rng.randint(64, 512), rng.randint(32, 384))
        self.tenant_of[request.request_id] = tenant
        self.index_of[request.request_id] = len(self.created)
        self.created.append(request)
        return request

    def step(self) -> None:
        clock = time.perf_counter_ns
        t0 = clock()
        for request in self.pending:
            self.s.add_request(request)
        output = self.s.schedule()
        t1 = clock()
        runner_output = model_output(self.s, output)
        t2 = clock()
        result = self.s.update_from_output(output, runner_output)
        self.scheduler_ns.append(t1 - t0 + clock() - t2)
        self.min_batch = min(self.min_batch, len(output.num_scheduled_tokens))
        self.admissions.append([self.index_of[r.req_id] for r in output.scheduled_new_reqs])
        finished = sum(
            1 for outs in result.values() for o in outs.outputs if o.finish_reason is not None
        )
        if self.tally is not None:
            self.tally_charges(output, result)
        self.pending = [self.new_request() for _ in range(finished)]
        self.steps += 1

    def tally_charges(self, output: Any, result: dict) -> None:
        """Add this step's work per tenant to :attr:`tally`, as vLLM saw it: the
        whole prompt of each request admitted (no prefix caching, no preemption in
        this workload) and every token the step generated."""
        tally = self.tally
        assert tally is not None
        for new in output.scheduled_new_reqs:
            prompt = self.created[self.index_of[new.req_id]].num_prompt_tokens
            counts = tally.setdefault(self.tenant_of[new.req_id], {"prompt": 0, "decode": 0})
            counts["prompt"] += prompt
        for outs in result.values():
            for o in outs.outputs:
                counts = tally.setdefault(self.tenant_of[o.request_id], {"prompt": 0, "decode": 0})
                counts["decode"] += len(o.new_token_ids)


class ReplayQueue(RequestQueue):
    """A waiting queue that admits what another engine admitted, in its order.

    Requests are named by creation index (the engines create the same
    requests in the same order, and add each in that order: the n-th request
    added is the n-th created). Before each step, :meth:`plan` gives the
    indices to admit; the queue then looks empty to ``schedule()`` once they
    are popped (``__len__`` still counts every waiting request). Each
    operation is O(1), like vLLM's own FIFO queue. It serves only a
    benchmark: vLLM must not skip or preempt (this workload does neither).
    """

    def __init__(self) -> None:
        self.added = 0
        self.waiting: dict[int, Any] = {}
        self.plan_: list[int] = []
        self.pos = 0

    def plan(self, indices: list[int]) -> None:
        self.plan_, self.pos = indices, 0

    def add_request(self, request: Any) -> None:
        self.waiting[self.added] = request
        self.added += 1

    def peek_request(self) -> Any:
        if self.pos == len(self.plan_):
            raise IndexError("nothing more to admit this step")
        return self.waiting[self.plan_[self.pos]]

    def pop_request(self) -> Any:
        request = self.peek_request()
        del self.waiting[self.plan_[self.pos]]
        self.pos += 1
        return request

    def _unsupported(self, *args: Any) -> None:
        raise AssertionError("the replay benchmark expects no skips, preemptions or aborts")

    prepend_request = prepend_requests = remove_request = remove_requests = _unsupported

    def __bool__(self) -> bool:
        return self.pos < len(self.plan_)

    def __len__(self) -> int:
        return len(self.waiting)

    def __iter__(self) -> Any:
        return iter(list(self.waiting.values()))


class _QueueClock:
    """The clock state of a timed queue (:class:`TimedVTCQueue`, :class:`TimedFloorQueue`):
    ``ns`` is the time spent in the queue's entry points (outermost calls only) and
    the mixin's own code around vLLM's; ``by_name`` the same time split by entry
    point, with the number of calls."""

    __slots__ = ()  # (a queue's class is swapped for a timed one: its layout must not change)
    ns = 0
    vllm_ns = 0  # vLLM's own time inside the mixin's calls (_vllm_clocked)
    _depth = 0
    by_name: dict[str, list[int]] | None = None  # name -> [ns, calls]

    def mixin(self, dt: int, inside: int, vllm: int) -> None:
        """Add the mixin's own time in a call that took ``dt`` ns: less vLLM's and
        the queue's, which were ``vllm_ns`` and ``ns`` at ``vllm`` and ``inside``
        before it (:func:`_mixin_clocked`)."""
        own = dt - (self.vllm_ns - vllm) - (self.ns - inside)
        self.ns += own
        if self.by_name is None:
            self.by_name = {}
        entry = self.by_name.setdefault("(scheduler)", [0, 0])
        entry[0] += own
        entry[1] += 1


class TimedVTCQueue(VTCRequestQueue, _QueueClock):
    """VTC's waiting queue with a clock on every entry point vLLM or the
    scheduler mixin calls (outermost calls only): ``ns`` is the time spent in
    VTC's code, with the mixin's own code around vLLM's (:class:`TimedVTCScheduler`
    adds it)."""


def _timed(cls: type, name: str) -> Any:
    """``cls.<name>``, clocked into the queue's ``ns`` and ``by_name`` as an
    outermost call."""
    method = getattr(cls, name)

    def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self._depth:
            return method(self, *args, **kwargs)
        self._depth = 1
        t0 = time.perf_counter_ns()
        try:
            return method(self, *args, **kwargs)
        finally:
            dt = time.perf_counter_ns() - t0
            self.ns += dt
            self._depth = 0
            if self.by_name is None:
                self.by_name = {}
            entry = self.by_name.setdefault(name, [0, 0])
            entry[0] += dt
            entry[1] += 1

    timed.__name__ = name
    return timed


#: the VTC queue's entry points vLLM or the mixin calls (also ``vllm_callgrind.py``'s).
#: Not the methods the native queue calls by name within them (``settle``,
#: ``record_outputs``, ``release_finished``, so that a subclass may wrap them): a
#: clock there is a Python frame in every call that no engine runs, and which the
#: floor's queue, with no such calls, never pays. Their time is their callers'
#: (``record_step`` holds the step's charge; a pop is settled in the next question;
#: the mixin's rare direct ``settle`` is its own code's).
TIMED_ENTRY_POINTS = (
    "add_request", "peek_request", "pop_request", "prepend_request", "prepend_requests",
    "remove_request", "remove_requests", "record_step", "forget", "charge",
    "__bool__", "__len__", "__iter__", "__contains__",
)  # fmt: skip

for _name in TIMED_ENTRY_POINTS:
    setattr(TimedVTCQueue, _name, _timed(VTCRequestQueue, _name))


def _vllm_clocked(method: Any) -> Any:
    """Stock vLLM's ``method`` (``schedule``/``update_from_output``) as the VTC mixin's
    ``super()`` calls it, clocked less VTC's queue calls inside: into ``vllm_ns``."""

    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        queue, clock = self.waiting, time.perf_counter_ns
        t0, inside = clock(), queue.ns
        result = method(self, *args, **kwargs)
        queue.vllm_ns += clock() - t0 - (queue.ns - inside)
        return result

    call.__name__ = method.__name__
    return call


def _mixin_clocked(method: Any) -> Any:
    """The VTC mixin's ``method``, clocked: its own part (less vLLM's and the queue's
    time inside) into the queue's ``ns``, by :meth:`_QueueClock.mixin`."""

    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        queue, clock = self.waiting, time.perf_counter_ns
        t0, inside, vllm = clock(), queue.ns, queue.vllm_ns
        result = method(self, *args, **kwargs)
        queue.mixin(clock() - t0, inside, vllm)
        return result

    call.__name__ = method.__name__
    return call


class _VLLMClock(Scheduler):
    """Stock vLLM's ``schedule()`` and ``update_from_output()`` as the VTC mixin's
    ``super()`` calls them, clocked (less VTC's queue calls inside them): the part of
    the mixin's time that is vLLM's, in the queue's ``vllm_ns``."""


class TimedVTCScheduler(VTCScheduler, _VLLMClock):
    """VTCScheduler whose own code around vLLM's (the mixin's ``schedule()`` and
    ``update_from_output()``: the scheduling pass's edges, settling, charging, the
    step's observers) is clocked into its queue's ``ns`` too: VTC's code is the
    queue's and the mixin's. ``by_name["(scheduler)"]`` is the mixin's own part
    (the two clocks' reads included: four a call, ~0.1 µs)."""


for _name in ("schedule", "update_from_output"):
    setattr(_VLLMClock, _name, _vllm_clocked(getattr(Scheduler, _name)))
    setattr(TimedVTCScheduler, _name, _mixin_clocked(getattr(VTCScheduler, _name)))


# -- the clocks' floor: what they read around an O(1) queue and a pass-through mixin ----
class TimedFloorQueue(ReplayQueue, _QueueClock):
    """A :class:`ReplayQueue` (O(1) Python, like vLLM's own FIFO queue) with its entry
    points clocked as :class:`TimedVTCQueue`'s are (its ``pop_request`` calls its
    ``peek_request``: one clock frame more than VTC's)."""


for _name in ("add_request", "peek_request", "pop_request", "__bool__", "__len__"):
    setattr(TimedFloorQueue, _name, _timed(ReplayQueue, _name))


class _PassThrough(Scheduler):
    """A scheduler mixin that adds nothing: its ``schedule()`` and
    ``update_from_output()`` only call vLLM's."""

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        return super().schedule(*args, **kwargs)

    def update_from_output(self, *args: Any, **kwargs: Any) -> Any:
        return super().update_from_output(*args, **kwargs)


class TimedFloorScheduler(_PassThrough, _VLLMClock):
    """:class:`_PassThrough` clocked as :class:`TimedVTCScheduler` is."""


for _name in ("schedule", "update_from_output"):
    setattr(TimedFloorScheduler, _name, _mixin_clocked(getattr(_PassThrough, _name)))


def vtc_engine(config: Any, timed: bool = False) -> Engine:
    """A VTCScheduler engine; ``timed``: its queue and scheduler clock VTC's code
    (:class:`TimedVTCQueue`, :class:`TimedVTCScheduler`)."""
    scheduler = make_scheduler(VTCScheduler, config, num_blocks=NUM_BLOCKS)
    if timed:
        scheduler.__class__ = TimedVTCScheduler
        scheduler.waiting.__class__ = TimedVTCQueue
    return Engine(scheduler)


def replay_engine(config: Any) -> Engine:
    """Stock vLLM's scheduler with a :class:`ReplayQueue` (plan it before each step)."""
    scheduler = make_scheduler(Scheduler, config, num_blocks=NUM_BLOCKS)
    scheduler.waiting = ReplayQueue()
    return Engine(scheduler)


def floor_engine(config: Any) -> Engine:
    """The clocks' floor: a replaying engine (plan it before each step) whose queue
    and pass-through mixin are clocked as VTC's are (:class:`TimedFloorQueue`,
    :class:`TimedFloorScheduler`). Its clocks read their own frames and what an O(1)
    Python queue (vLLM's own is one) and a scheduler subclass that only calls
    vLLM's methods cost, with caches as cold as VTC's: what the clocks would read
    for a VTC whose work cost no more than the queue it replaces."""
    scheduler = make_scheduler(TimedFloorScheduler, config, num_blocks=NUM_BLOCKS)
    scheduler.waiting = TimedFloorQueue()
    return Engine(scheduler)


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Any:
    model = write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"), weights=False)
    return vllm_config(
        str(model),
        max_num_seqs=MAX_NUM_SEQS,
        max_num_batched_tokens=8192,
        max_model_len=1024,
    )


@pytest.mark.parametrize("scheduler", ["vllm", "vtc"])
def test_scheduler_step(benchmark: Any, config: Any, scheduler: str) -> None:
    cls = VTCScheduler if scheduler == "vtc" else Scheduler
    engine = Engine(make_scheduler(cls, config, num_blocks=NUM_BLOCKS))
    for _ in range(WARMUP):
        engine.step()
    engine.min_batch = MAX_NUM_SEQS
    engine.scheduler_ns.clear()
    benchmark.group = f"vllm scheduler step: {MAX_NUM_SEQS} seqs, {TENANTS} tenants"
    benchmark.extra_info["running"] = len(engine.s.running)
    benchmark.extra_info["waiting"] = len(engine.s.waiting)
    benchmark.pedantic(engine.step, rounds=ROUNDS, iterations=1, warmup_rounds=5)
    assert engine.min_batch == MAX_NUM_SEQS  # a full batch every measured step
    us = [ns / 1e3 for ns in engine.scheduler_ns]
    benchmark.extra_info["scheduler_us"] = {
        "median": statistics.median(us),
        "mean": statistics.fmean(us),
        "steps": len(us),
    }
    if scheduler == "vtc":
        engine.s.vtc._check_invariants()
        assert len(engine.s.tenant_counters()) == TENANTS


ARRIVAL_TENANTS = 1_000
ARRIVAL_ROUNDS = int(os.environ.get("VTC_BENCH_ARRIVALS", 20_000))


def test_arrival(benchmark: Any, config: Any) -> None:
    """One arrival through VTC's queue (``VTCScheduler.add_request``: the tenant
    rule, the core id, ``Requests.submit``), 1,000 tenants with two requests
    waiting each. Each round submits a fresh vLLM ``Request`` of a random tenant;
    the round's setup (not timed) removes the previous one, so the queue is the
    same at every arrival. ``extra_info["process_ns"]``: the same arrivals on
    the process clock (median, mean), which another process's load does not
    inflate."""
    s = make_scheduler(VTCScheduler, config, num_blocks=NUM_BLOCKS)
    rng = random.Random(7)
    for i in range(2 * ARRIVAL_TENANTS):
        s.add_request(make_request(f"t{i % ARRIVAL_TENANTS}", rng.randint(64, 512), 32))
    arrivals = [
        make_request(f"t{rng.randrange(ARRIVAL_TENANTS)}", rng.randint(64, 512), 32)
        for _ in range(ARRIVAL_ROUNDS + 10)
    ]
    pending = iter(arrivals)
    last: list[Any] = []
    process_ns: list[int] = []
    clock = time.process_time_ns
    add = s.add_request

    def setup() -> Any:
        if last:
            s.waiting.remove_request(last.pop())
        last.append(next(pending))
        return (last[0],), {}

    def arrive(request: Any) -> None:
        t0 = clock()
        add(request)
        process_ns.append(clock() - t0)

    benchmark.group = f"vllm arrival: {ARRIVAL_TENANTS} tenants"
    benchmark.pedantic(arrive, setup=setup, rounds=ARRIVAL_ROUNDS, iterations=1, warmup_rounds=10)
    benchmark.extra_info["process_ns"] = {
        "median": statistics.median(process_ns),
        "mean": statistics.fmean(process_ns),
    }
    assert len(s.waiting) == 2 * ARRIVAL_TENANTS + 1
    assert len(s.tenant_counters()) == ARRIVAL_TENANTS
    s.vtc._check_invariants()


class Trio:
    """Stock vLLM, VTC (its code clocked) and stock vLLM replaying VTC's
    admissions, built fresh, stepped alternately (machine noise hits all three);
    beside them the clocks' floor (:func:`floor_engine`), replaying too: an O(1)
    queue and a pass-through mixin, clocked as VTC's code is."""

    def __init__(self, config: Any) -> None:
        self.stock = Engine(make_scheduler(Scheduler, config, num_blocks=NUM_BLOCKS))
        self.fair = vtc_engine(config, timed=True)
        self.replay = replay_engine(config)
        self.floor = floor_engine(config)
        self.vtc_code_ns: list[int] = []  # per step: time in VTC's code
        self.floor_ns: list[int] = []  # per step: what the floor's clocks read
        self.by_name: list[dict[str, list[int]]] = []  # per step: TimedVTCQueue.by_name
        self.floor_by_name: list[dict[str, list[int]]] = []  # per step: the floor's

    def round(self) -> None:
        queue = self.fair.s.waiting
        before = queue.ns
        queue.by_name = {}
        self.fair.step()
        self.vtc_code_ns.append(queue.ns - before)
        self.by_name.append(queue.by_name)
        self.replay.s.waiting.plan(self.fair.admissions[-1])
        self.replay.step()
        self.stock.step()
        floor = self.floor.s.waiting
        before = floor.ns
        floor.by_name = {}
        floor.plan(self.fair.admissions[-1])
        self.floor.step()
        self.floor_ns.append(floor.ns - before)
        self.floor_by_name.append(floor.by_name)

    def reset(self) -> None:
        for engine in (self.stock, self.fair, self.replay, self.floor):
            engine.scheduler_ns.clear()
            engine.min_batch = MAX_NUM_SEQS
        self.vtc_code_ns.clear()
        self.floor_ns.clear()
        self.by_name.clear()
        self.floor_by_name.clear()

    def ratios(self) -> dict[str, float]:
        med = statistics.median
        stock, fair, replay = (med(e.scheduler_ns) for e in (self.stock, self.fair, self.replay))
        code, floor = med(self.vtc_code_ns), med(self.floor_ns)
        return {
            "stock_us": stock / 1e3,
            "vtc_us": fair / 1e3,
            "replay_us": replay / 1e3,
            "vtc_code_us": code / 1e3,
            "vtc_over_stock": fair / stock,
            "vtc_over_replay": fair / replay,
            "replay_over_stock": replay / stock,
            "vtc_code_share": code / stock,
            "floor_us": floor / 1e3,
            # (the difference of medians: VTC's code beyond what a free one reads)
            "vtc_code_net_share": (code - floor) / stock,
        }

    def entry_points(self, floor: bool = False) -> dict[str, tuple[float, float, float]]:
        """Per entry point of VTC's queue (``floor``: of the floor's), per step: the
        median and mean time (µs) and the mean number of calls (a step without a
        call counts 0 µs)."""
        steps = self.floor_by_name if floor else self.by_name
        names = sorted({k for step in steps for k in step})
        result = {}
        for name in names:
            ns = [step.get(name, (0, 0))[0] for step in steps]
            calls = [step.get(name, (0, 0))[1] for step in steps]
            result[name] = (
                statistics.median(ns) / 1e3,
                statistics.fmean(ns) / 1e3,
                statistics.fmean(calls),
            )
        return result

    def check(self) -> None:
        # Same workload, same seed: every engine served the same number of
        # steps with a full batch, and the replay admitted what VTC admitted.
        engines = (self.stock, self.fair, self.replay, self.floor)
        assert len({len(e.scheduler_ns) for e in engines}) == 1
        assert all(e.min_batch == MAX_NUM_SEQS for e in engines)
        assert self.replay.admissions == self.fair.admissions
        assert self.floor.admissions == self.fair.admissions
        assert all(ns > 0 for ns in self.floor_ns)  # the floor's clocks ran
        assert self.fair.admissions != self.stock.admissions  # VTC did reorder
        assert all(ns > 0 for ns in self.vtc_code_ns)  # the clock saw VTC's code


def test_interleaved_overhead(benchmark: Any, config: Any, capsys: pytest.CaptureFixture) -> None:
    """What VTC adds to vLLM's step, three ways, over TRIALS fresh trios:

    * VTC's code: the time spent inside it per step (a clock on its queue's
      entry points), over stock vLLM's step;
    * VTC/replay: VTC against stock vLLM doing the same work in the same order;
    * VTC/stock: against stock vLLM's own (first-come) order, which is what a
      user of this workload sees; replay/stock is the part the order explains.

    The clocks have a floor: around an O(1) Python queue like vLLM's own and a
    mixin that only calls vLLM's methods (a fourth engine, :func:`floor_engine`)
    they read their own frames and the calls any queue costs. It is printed beside
    VTC's code, with VTC's code net of it: what VTC adds beyond the queue it
    replaces.

    Each engine's time depends on where its requests happen to sit in memory
    (a few percent either way per process), so the trials are independent
    engines and the summary is their geometric mean."""
    trials: list[dict[str, float]] = []
    entry_points: list[dict[str, tuple[float, float, float]]] = []
    floor_points: list[dict[str, tuple[float, float, float]]] = []
    for t in range(TRIALS):
        trio = Trio(config)
        for _ in range(WARMUP):
            trio.round()
        trio.reset()
        if t == 0:
            benchmark.group = "vllm scheduler step, interleaved"
            benchmark.pedantic(trio.round, rounds=ROUNDS, iterations=1)
        else:
            for _ in range(ROUNDS):
                trio.round()
        trio.check()
        trials.append(trio.ratios())
        entry_points.append(trio.entry_points())
        floor_points.append(trio.entry_points(floor=True))
        del trio

    def gmean(key: str) -> float:
        return statistics.geometric_mean(r[key] for r in trials)

    summary = {k: gmean(k) for k in trials[0]}
    benchmark.extra_info.update(trials=trials, summary=summary)
    with capsys.disabled():
        print(f"\nvLLM scheduler calls per step, medians, {len(trials)} fresh engine trios:")
        for r in [*trials, summary]:
            label = "geo-mean" if r is summary else "trial"
            print(
                f"  {label:8s} stock {r['stock_us']:5.0f} us | VTC's code "
                f"{r['vtc_code_us']:5.1f} us = {100 * r['vtc_code_share']:.2f}% of stock | "
                f"VTC/replay {r['vtc_over_replay']:.3f} | VTC/stock {r['vtc_over_stock']:.3f} | "
                f"replay/stock {r['replay_over_stock']:.3f} | clocks' floor "
                f"{r['floor_us']:4.1f} us, VTC's code net of it "
                f"{100 * r['vtc_code_net_share']:.2f}%"
            )
        for title, points in (
            ("VTC's code", entry_points),
            ("The clocks' floor (an O(1) queue, a pass-through mixin)", floor_points),
        ):
            print(f"  {title} by entry point, per step: median / mean us (calls), per trial:")
            for name in sorted({k for e in points for k in e}):
                cells = [e.get(name, (0.0, 0.0, 0.0)) for e in points]
                row = [f"{med:5.1f} / {mean:5.1f} us ({n:4.2f})" for med, mean, n in cells]
                print(f"    {name:15s} " + " | ".join(row))


# -- what the per-tenant metrics add to the step (issue 16, item 6) -------------------

METRICS_TENANTS = (TENANTS, 1_000)
METRICS_VARIANTS = ("off", "directory", "registry")
# Measured rounds per trial (each round steps the three engines once): enough for
# several refreshes a trial at VTC_METRICS_INTERVAL's default of one a second.
METRICS_ROUNDS = int(os.environ.get("VTC_BENCH_METRICS_ROUNDS", 1_000))
CHECK_ROUNDS = 10  # untimed steps between the two refreshes the series are checked over
SMOKE_ROUNDS = 10  # warm-up and measured rounds under --benchmark-disable (make test-vllm)


def metrics_engine(
    config: Any, variant: str, tenants: int, directory: Path, monkeypatch: pytest.MonkeyPatch
) -> Engine:
    """A VTCScheduler engine with the per-tenant metrics set as a vLLM deployment
    sets them (docs/metrics.md): ``off``: ``VTC_METRICS=off``; ``directory``:
    ``PROMETHEUS_MULTIPROC_DIR`` names an empty directory, so ``VTC_METRICS=auto``
    turns them on (vLLM's API server serves that directory); ``registry``:
    ``VTC_METRICS=on`` without a directory (the series stay in the engine
    process's default registry). ``VTC_METRICS_INTERVAL`` is left as it is
    (default: a refresh a second)."""
    with monkeypatch.context() as env:
        env.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
        env.delenv("prometheus_multiproc_dir", raising=False)
        env.setenv("VTC_METRICS", {"off": "off", "directory": "auto", "registry": "on"}[variant])
        if variant == "directory":
            env.setenv("PROMETHEUS_MULTIPROC_DIR", str(directory))
        scheduler = make_scheduler(VTCScheduler, config, num_blocks=NUM_BLOCKS)
    assert (scheduler.vtc_adapter.metrics is None) == (variant == "off")
    return Engine(scheduler, tenants=tenants)


class MetricsClock:
    """A clock on one engine's TenantMetrics: per step, the time in its ``stepped``
    point (the periodic refresh included), and each refresh's time. The wrappers
    add two clock reads to a step (~0.5 us on the benchmark machine)."""

    def __init__(self, metrics: Any) -> None:
        self.metrics = metrics
        self.refresh = metrics.refresh  # unclocked, for the checks
        self.stepped_ns: list[int] = []
        self.refresh_ns: list[int] = []
        stepped, refresh, clock = metrics.stepped, metrics.refresh, time.perf_counter_ns

        def clocked_stepped(adapter: Any) -> None:
            t0 = clock()
            stepped(adapter)
            self.stepped_ns.append(clock() - t0)

        def clocked_refresh(*args: Any, **kwargs: Any) -> None:
            t0 = clock()
            refresh(*args, **kwargs)
            self.refresh_ns.append(clock() - t0)

        metrics.stepped = clocked_stepped  # the adapter calls the instance's attribute
        metrics.refresh = clocked_refresh


class MetricsSet:
    """VTCScheduler with metrics off, into a fresh multiprocess directory, and into
    the default registry: built fresh on the same seeded workload and stepped
    alternately, the order rotating every round, so machine load hits all three
    alike. Built in METRICS_VARIANTS order: the registry variant's families are
    the default registry's when the checks read it (a later TenantMetrics on
    another directory takes the registry's names over; the directory variant
    keeps writing its files)."""

    def __init__(
        self, config: Any, tenants: int, directory: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        self.tenants = tenants
        self.directory = directory
        self.engines = {
            v: metrics_engine(config, v, tenants, directory, monkeypatch) for v in METRICS_VARIANTS
        }
        self.clocks = {
            v: MetricsClock(e.s.vtc_adapter.metrics) for v, e in self.engines.items() if v != "off"
        }
        self.rounds = 0
        self.start = time.perf_counter_ns()

    def round(self) -> None:
        k = self.rounds % len(METRICS_VARIANTS)
        for variant in METRICS_VARIANTS[k:] + METRICS_VARIANTS[:k]:
            self.engines[variant].step()
        self.rounds += 1

    def run(self, rounds: int) -> None:
        for _ in range(rounds):
            self.round()

    def reset(self) -> None:
        for engine in self.engines.values():
            engine.scheduler_ns.clear()
            engine.min_batch = MAX_NUM_SEQS
        for clock in self.clocks.values():
            clock.stepped_ns.clear()
            clock.refresh_ns.clear()
        self.start = time.perf_counter_ns()

    def figures(self) -> dict[str, Any]:
        """Per variant, the scheduler calls per step (median, mean), and for the two
        with metrics: the difference and ratio to ``off``, and their own code."""
        seconds = (time.perf_counter_ns() - self.start) / 1e9
        med, mean = statistics.median, statistics.fmean
        off = self.engines["off"].scheduler_ns
        steps = len(off)
        result: dict[str, Any] = {
            "steps": steps,
            "steps_per_s": steps / seconds,  # of one engine (three interleaved)
            "off": {"median_us": med(off) / 1e3, "mean_us": mean(off) / 1e3},
        }
        for variant, clock in self.clocks.items():
            ns = self.engines[variant].scheduler_ns
            refresh = clock.refresh_ns
            result[variant] = {
                "median_us": med(ns) / 1e3,
                "mean_us": mean(ns) / 1e3,
                "median_diff_us": (med(ns) - med(off)) / 1e3,
                "mean_diff_us": (mean(ns) - mean(off)) / 1e3,
                "median_ratio": med(ns) / med(off),
                "mean_ratio": mean(ns) / mean(off),
                "metrics_code_median_us": med(clock.stepped_ns) / 1e3,
                "metrics_code_mean_us": mean(clock.stepped_ns) / 1e3,
                "refreshes": len(refresh),
                "refresh_median_ms": med(refresh) / 1e6 if refresh else math.nan,
                "refresh_mean_ms": mean(refresh) / 1e6 if refresh else math.nan,
                "refresh_ns": list(refresh),
                "stepped_ns_total": sum(clock.stepped_ns),
            }
        return result

    def check(self) -> None:
        """What the timing cannot show: metrics change no decision, and the series
        say what vLLM computed (:func:`check_series`)."""
        off = self.engines["off"]
        for variant, engine in self.engines.items():
            assert len(engine.scheduler_ns) == len(off.scheduler_ns)
            assert engine.min_batch == MAX_NUM_SEQS  # a full batch every measured step
            assert engine.admissions == off.admissions, variant  # the same decisions
        for clock in self.clocks.values():
            assert len(clock.stepped_ns) == len(off.scheduler_ns)  # stepped, never raised
        check_series(self)


def scrape(variant: str, directory: Path) -> dict[str, dict[tuple[str, ...], float]]:
    """The vtc samples a scrape reads, by name, then by label values: from the
    multiprocess directory through prometheus_client's collector (what vLLM's API
    server serves), or from the process's default registry."""
    from prometheus_client import REGISTRY, CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    if variant == "directory":
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=str(directory))
    else:
        registry = REGISTRY
    samples: dict[str, dict[tuple[str, ...], float]] = {}
    for family in registry.collect():
        for s in family.samples:
            if s.name.startswith("vtc_"):
                key = tuple(s.labels[k] for k in ("tenant", "kind", "state") if k in s.labels)
                samples.setdefault(s.name, {})[key] = s.value
    return samples


def check_series(mset: MetricsSet) -> None:
    """For each variant with metrics, over CHECK_ROUNDS more steps between two
    refreshes (none in between: ``interval`` set to infinity for them), what a
    scrape reads after the second one:

    * tokens: each labelled tenant's ``prompt`` and ``decode`` series grew by
      what vLLM computed for it (admitted prompts, generated tokens), counted by
      the bench from vLLM's outputs; ``_other`` by the other tenants' (a series
      made again, its tenant labelled again or back after the core forgot it,
      goes on from the total its last one ended with, 0 if it had none; none of
      those totals is dropped during the check);
    * requests: each labelled tenant's waiting and running requests are vLLM's,
      ``_other`` has the rest; active tenants, counters as the core has them;
    * cardinality: min(tenants, VTC_METRICS_MAX_TENANTS) labelled; no preemption.
    """
    import vtc.metrics
    from vtc.metrics import OTHER

    listening: dict[str, dict[str, dict[tuple[str, ...], float]]] = {}  # the first scrape
    ended: dict[str, dict[tuple[str, str], float]] = {}  # the ended series' totals kept
    for variant, clock in mset.clocks.items():
        engine, metrics = mset.engines[variant], clock.metrics
        metrics.interval = math.inf
        engine.tally = {}
        clock.refresh(engine.s.vtc_adapter)
        listening[variant] = scrape(variant, mset.directory)
        service = id(metrics.service)
        ended[variant] = {
            (key[1], key[2]): total for key, total in metrics._ended.items() if key[0] == service
        }
    kept = vtc.metrics.ENDED_KEPT_PER_LABEL
    vtc.metrics.ENDED_KEPT_PER_LABEL = 10**6  # none dropped during the check
    try:
        mset.run(CHECK_ROUNDS)
    finally:
        vtc.metrics.ENDED_KEPT_PER_LABEL = kept
    for variant, before in listening.items():
        engine, metrics = mset.engines[variant], mset.clocks[variant].metrics
        assert engine.tally  # the window charged something
        metrics.refresh(engine.s.vtc_adapter)
        after = scrape(variant, mset.directory)
        if variant == "directory":
            files = sorted(p.name for p in mset.directory.glob("*.db"))
            assert files and all(name.endswith("-vtc.db") for name in files), files
        tokens, requests = after["vtc_tenant_service_tokens_total"], after["vtc_tenant_requests"]
        counters = after["vtc_tenant_counter"]
        labelled = {key[0] for name in after.values() for key in name if key} - {OTHER}
        core_counters = engine.s.tenant_counters()
        assert len(labelled) == min(len(core_counters), metrics.max_tenants), variant
        assert (OTHER in {key[0] for key in requests}) == (len(core_counters) > len(labelled))

        was = before.get("vtc_tenant_service_tokens_total", {})

        def start_of(key: tuple[str, str]) -> float:
            """What ``key``'s series showed at the first scrape, else what the last
            one ended with (a series made again goes on from it)."""
            return was[key] if key in was else ended[variant].get(key, 0.0)  # noqa: B023

        for kind in ("prompt", "decode"):
            other = 0
            for tenant, counts in engine.tally.items():
                if tenant in labelled:
                    start = start_of((tenant, kind))
                    got = tokens.get((tenant, kind), 0.0) - start
                    assert got == counts[kind], (variant, tenant, kind, got, counts[kind])
                else:
                    other += counts[kind]
            got = tokens.get((OTHER, kind), 0.0) - was.get((OTHER, kind), 0.0)
            assert got == other, (variant, kind, got, other)
            for (tenant, k), value in tokens.items():  # tenants vLLM computed nothing for
                if k == kind and tenant not in engine.tally and tenant != OTHER:
                    assert value == start_of((tenant, k))

        running = {r.request_id for r in engine.s.running}
        want: dict[tuple[str, str], int] = {}
        for request_id in engine.s.requests:
            key = (engine.tenant_of[request_id], "running" if request_id in running else "waiting")
            want[key] = want.get(key, 0) + 1
        for state in ("waiting", "running"):
            for tenant in labelled:  # every labelled tenant has both series, idle or not
                got = requests[(tenant, state)]
                assert got == want.get((tenant, state), 0), (variant, tenant, state)
            rest = sum(n for (t, s), n in want.items() if s == state and t not in labelled)
            assert requests.get((OTHER, state), 0.0) == rest, (variant, state)
        assert after["vtc_tenants_active"][()] == len({t for t, _ in want})
        assert {t: counters[(t,)] for t in labelled} == {t: core_counters[t] for t in labelled}
        assert not any(after.get("vtc_tenant_preemptions_total", {}).values())


@pytest.mark.parametrize("tenants", METRICS_TENANTS)
def test_metrics_overhead(
    benchmark: Any,
    config: Any,
    tenants: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    """What the per-tenant metrics (docs/metrics.md) add to vLLM's step, at the
    file's tenant count and at 1,000 (issue 16's target: under 10 us a step):
    VTCScheduler without metrics, with them in a fresh multiprocess directory
    (how vLLM's API server shows them) and with them in the default registry
    (``VTC_METRICS=on`` without the directory), interleaved (MetricsSet), over
    TRIALS fresh sets. The periodic refresh runs at its real rate
    (``VTC_METRICS_INTERVAL``, wall clock), so the means include it, at this
    benchmark's step rate (``steps_per_s``); medians are steps without one.
    Under --benchmark-disable: one short set, and the checks of MetricsSet.check."""
    smoke = benchmark.disabled
    warmup = SMOKE_ROUNDS if smoke else WARMUP
    rounds = SMOKE_ROUNDS if smoke else METRICS_ROUNDS
    trials: list[dict[str, Any]] = []
    for t in range(1 if smoke else TRIALS):
        directory = tmp_path / f"prometheus-{t}"  # fresh for each start, as docs/metrics.md says
        directory.mkdir()
        mset = MetricsSet(config, tenants, directory, monkeypatch)
        mset.run(warmup)
        mset.reset()
        if t == 0:
            benchmark.group = f"vllm scheduler step, metrics off/on interleaved, {tenants} tenants"
            benchmark.pedantic(mset.round, rounds=rounds, iterations=1)
            if smoke:  # pedantic ran one round
                mset.run(rounds - 1)
        else:
            mset.run(rounds)
        trials.append(mset.figures())
        mset.check()
        del mset

    summary: dict[str, Any] = {
        "tenants": tenants,
        "trials": len(trials),
        "steps_per_s": statistics.fmean(r["steps_per_s"] for r in trials),
        "interval_s": float(os.environ.get("VTC_METRICS_INTERVAL", 1.0)),
    }
    for variant in METRICS_VARIANTS[1:]:
        rows = [r[variant] for r in trials]
        refresh = [ns for r in rows for ns in r["refresh_ns"]]
        steps = sum(r["steps"] for r in trials)
        summary[variant] = {
            "median_diff_us": [r["median_diff_us"] for r in rows],
            "mean_diff_us": [r["mean_diff_us"] for r in rows],
            "median_ratio": statistics.geometric_mean(r["median_ratio"] for r in rows),
            "mean_ratio": statistics.geometric_mean(r["mean_ratio"] for r in rows),
            # the metrics' own code per step, every step of every trial (refreshes included)
            "metrics_code_us": sum(r["stepped_ns_total"] for r in rows) / steps / 1e3,
            "refreshes": len(refresh),
            "refresh_ms": {
                "median": statistics.median(refresh) / 1e6 if refresh else math.nan,
                "mean": statistics.fmean(refresh) / 1e6 if refresh else math.nan,
                "max": max(refresh) / 1e6 if refresh else math.nan,
            },
        }
    for r in trials:
        for variant in METRICS_VARIANTS[1:]:
            del r[variant]["refresh_ns"]
    benchmark.extra_info.update(trials=trials, summary=summary)
    with capsys.disabled():
        print(
            f"\nmetrics, {tenants} tenants, {len(trials)} set(s) of three interleaved engines, "
            f"{summary['steps_per_s']:.0f} steps/s each; scheduler calls per step:"
        )
        for i, r in enumerate(trials):
            off = r["off"]
            line = f"  set {i}: off {off['median_us']:6.0f} / {off['mean_us']:6.0f} us"
            for variant in METRICS_VARIANTS[1:]:
                v = r[variant]
                line += (
                    f" | {variant} {v['median_diff_us']:+6.1f} / {v['mean_diff_us']:+6.1f} us "
                    f"({v['median_ratio']:.3f} / {v['mean_ratio']:.3f}), own code "
                    f"{v['metrics_code_mean_us']:5.1f} us, {v['refreshes']} refreshes "
                    f"{v['refresh_median_ms']:.2f} ms"
                )
            print(line + "  (median / mean)")
        for variant in METRICS_VARIANTS[1:]:
            v = summary[variant]
            print(
                f"  {variant}: ratio {v['median_ratio']:.3f} / {v['mean_ratio']:.3f} (geo-mean), "
                f"own code {v['metrics_code_us']:.1f} us per step, refresh "
                f"{v['refresh_ms']['median']:.2f} ms median, {v['refresh_ms']['max']:.2f} max"
            )
