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
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import pytest

# vLLM lives in .venv-vllm: run this file there (make test-vllm); make bench leaves it out.

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "vllm"))

from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm_harness import (  # noqa: E402
    make_request,
    make_scheduler,
    model_output,
    vllm_config,
    write_tiny_llama,
)

from vtc.vllm import VTCScheduler  # noqa: E402

TENANTS = 64
MAX_NUM_SEQS = 256
BACKLOG = 2_000
NUM_BLOCKS = 40_000  # 640k tokens: the batch never runs out of KV blocks
WARMUP = 300
ROUNDS = 400


class Engine:
    """vLLM's scheduler driven like the engine core does, with a seeded workload."""

    def __init__(self, scheduler: Any, seed: int = 1) -> None:
        self.s = scheduler
        self.rng = random.Random(seed)
        self.pending: list = []
        for _ in range(BACKLOG + MAX_NUM_SEQS):
            self.s.add_request(self.new_request())
        self.steps = 0
        self.min_batch = MAX_NUM_SEQS
        self.scheduler_ns: list[int] = []  # per step: the scheduler calls only

    def new_request(self) -> Any:
        rng = self.rng
        return make_request(
            f"t{rng.randrange(TENANTS)}",
            rng.randint(64, 512),
            rng.randint(32, 384),
        )

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
        finished = sum(
            1 for outs in result.values() for o in outs.outputs if o.finish_reason is not None
        )
        self.pending = [self.new_request() for _ in range(finished)]
        self.steps += 1


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


def test_interleaved_overhead(benchmark: Any, config: Any, capsys: pytest.CaptureFixture) -> None:
    """Both schedulers on the same workload, stepped alternately in one process
    (so machine noise hits both alike); one round is one step of each. The
    ratio of their scheduler-call times is VTC's overhead on vLLM's step."""
    stock = Engine(make_scheduler(Scheduler, config, num_blocks=NUM_BLOCKS))
    fair = Engine(make_scheduler(VTCScheduler, config, num_blocks=NUM_BLOCKS))
    for _ in range(WARMUP):
        stock.step()
        fair.step()
    for engine in (stock, fair):
        engine.scheduler_ns.clear()
        engine.min_batch = MAX_NUM_SEQS

    def both() -> None:
        stock.step()
        fair.step()

    benchmark.group = "vllm scheduler step, interleaved"
    benchmark.pedantic(both, rounds=2 * ROUNDS, iterations=1)
    s_med = statistics.median(stock.scheduler_ns)
    f_med = statistics.median(fair.scheduler_ns)
    s_mean = statistics.fmean(stock.scheduler_ns)
    f_mean = statistics.fmean(fair.scheduler_ns)
    # Per step, paired: the same step number of the same workload.
    paired = statistics.median(f / s for f, s in zip(fair.scheduler_ns, stock.scheduler_ns))
    benchmark.extra_info.update(
        stock_us_median=s_med / 1e3,
        vtc_us_median=f_med / 1e3,
        ratio_median=f_med / s_med,
        ratio_mean=f_mean / s_mean,
        ratio_paired_median=paired,
    )
    with capsys.disabled():
        print(
            f"\nvLLM scheduler calls per step: stock {s_med / 1e3:.0f} us, "
            f"VTC {f_med / 1e3:.0f} us "
            f"(median); VTC/stock = {f_med / s_med:.3f} (median), {f_mean / s_mean:.3f} (mean), "
            f"{paired:.3f} (median of per-step ratios)"
        )
    # Same workload, same seed: the two engines served the same number of steps
    # and kept a full batch throughout.
    assert len(stock.scheduler_ns) == len(fair.scheduler_ns)
    assert stock.min_batch == fair.min_batch == MAX_NUM_SEQS
