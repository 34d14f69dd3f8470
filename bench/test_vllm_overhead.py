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
costs.
"""

from __future__ import annotations

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

    def __init__(self, scheduler: Any, seed: int = 1) -> None:
        self.s = scheduler
        self.rng = random.Random(seed)
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
        request = make_request(
            f"t{rng.randrange(TENANTS)}",
            rng.randint(64, 512),
            rng.randint(32, 384),
        )
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
        self.pending = [self.new_request() for _ in range(finished)]
        self.steps += 1


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


class TimedVTCQueue(VTCRequestQueue):
    """VTC's waiting queue with a clock on every entry point vLLM or the
    scheduler mixin calls (outermost calls only): ``ns`` is the time spent in
    VTC's code. The mixin's own lines around ``super()`` calls are not timed
    (a comparison and an attribute read or two per step)."""

    ns = 0
    _depth = 0


def _timed(name: str) -> Any:
    method = getattr(VTCRequestQueue, name)

    def timed(self: TimedVTCQueue, *args: Any, **kwargs: Any) -> Any:
        if self._depth:
            return method(self, *args, **kwargs)
        self._depth = 1
        t0 = time.perf_counter_ns()
        try:
            return method(self, *args, **kwargs)
        finally:
            self.ns += time.perf_counter_ns() - t0
            self._depth = 0

    timed.__name__ = name
    return timed


for _name in (
    "add_request", "peek_request", "pop_request", "prepend_request", "prepend_requests",
    "remove_request", "remove_requests", "settle", "record_outputs", "forget", "charge",
    "__bool__", "__len__", "__iter__", "__contains__",
):  # fmt: skip
    setattr(TimedVTCQueue, _name, _timed(_name))


def vtc_engine(config: Any, timed: bool = False) -> Engine:
    """A VTCScheduler engine; ``timed``: its queue clocks VTC's code (TimedVTCQueue)."""
    scheduler = make_scheduler(VTCScheduler, config, num_blocks=NUM_BLOCKS)
    if timed:
        scheduler.waiting.__class__ = TimedVTCQueue
    return Engine(scheduler)


def replay_engine(config: Any) -> Engine:
    """Stock vLLM's scheduler with a :class:`ReplayQueue` (plan it before each step)."""
    scheduler = make_scheduler(Scheduler, config, num_blocks=NUM_BLOCKS)
    scheduler.waiting = ReplayQueue()
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


class Trio:
    """Stock vLLM, VTC (its code clocked) and stock vLLM replaying VTC's
    admissions, built fresh, stepped alternately (machine noise hits all three)."""

    def __init__(self, config: Any) -> None:
        self.stock = Engine(make_scheduler(Scheduler, config, num_blocks=NUM_BLOCKS))
        self.fair = vtc_engine(config, timed=True)
        self.replay = replay_engine(config)
        self.vtc_code_ns: list[int] = []  # per step: time in VTC's code

    def round(self) -> None:
        queue = self.fair.s.waiting
        before = queue.ns
        self.fair.step()
        self.vtc_code_ns.append(queue.ns - before)
        self.replay.s.waiting.plan(self.fair.admissions[-1])
        self.replay.step()
        self.stock.step()

    def reset(self) -> None:
        for engine in (self.stock, self.fair, self.replay):
            engine.scheduler_ns.clear()
            engine.min_batch = MAX_NUM_SEQS
        self.vtc_code_ns.clear()

    def ratios(self) -> dict[str, float]:
        med = statistics.median
        stock, fair, replay = (med(e.scheduler_ns) for e in (self.stock, self.fair, self.replay))
        return {
            "stock_us": stock / 1e3,
            "vtc_us": fair / 1e3,
            "replay_us": replay / 1e3,
            "vtc_code_us": med(self.vtc_code_ns) / 1e3,
            "vtc_over_stock": fair / stock,
            "vtc_over_replay": fair / replay,
            "replay_over_stock": replay / stock,
            "vtc_code_share": med(self.vtc_code_ns) / stock,
        }

    def check(self) -> None:
        # Same workload, same seed: every engine served the same number of
        # steps with a full batch, and the replay admitted what VTC admitted.
        engines = (self.stock, self.fair, self.replay)
        assert len({len(e.scheduler_ns) for e in engines}) == 1
        assert all(e.min_batch == MAX_NUM_SEQS for e in engines)
        assert self.replay.admissions == self.fair.admissions
        assert self.fair.admissions != self.stock.admissions  # VTC did reorder
        assert all(ns > 0 for ns in self.vtc_code_ns)  # the clock saw VTC's code


def test_interleaved_overhead(benchmark: Any, config: Any, capsys: pytest.CaptureFixture) -> None:
    """What VTC adds to vLLM's step, three ways, over TRIALS fresh trios:

    * VTC's code: the time spent inside it per step (a clock on its queue's
      entry points), over stock vLLM's step;
    * VTC/replay: VTC against stock vLLM doing the same work in the same order;
    * VTC/stock: against stock vLLM's own (first-come) order, which is what a
      user of this workload sees; replay/stock is the part the order explains.

    Each engine's time depends on where its requests happen to sit in memory
    (a few percent either way per process), so the trials are independent
    engines and the summary is their geometric mean."""
    trials: list[dict[str, float]] = []
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
                f"replay/stock {r['replay_over_stock']:.3f}"
            )
