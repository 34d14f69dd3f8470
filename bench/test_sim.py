"""Simulation throughput: decode steps per second for the simulator's default setup
(M = 8192, wp = 1, wq = 2, two overloaded clients, prompts U[64, 512],
outputs U[32, 384]), the same tiny engine loop driving ``vtc.Scheduler`` and
the pure-Python ``vtc.reference.Scheduler``.

The loop per step: ``schedule()``; ``decode()`` (one token for every running
request, preempting if the batch would outgrow M); finish every request that
reached its output length and submit a replacement from the same client (each
client keeps 32 requests outstanding, so both stay overloaded).
"""

import numpy as np
import pytest

import vtc
import vtc.reference

STEPS = 2_000
OUTSTANDING = 32


class Sim:
    def __init__(self, make, seed: int = 0) -> None:
        self.s = make(8192, 1.0, 2.0)
        rng = np.random.default_rng(seed)
        n = 200_000
        self.prompt = rng.integers(64, 513, size=n).tolist()
        self.output = rng.integers(32, 385, size=n).tolist()
        self.owner: dict = {}
        self.rid = 0
        for _ in range(OUTSTANDING):
            for c in ("a", "b"):
                self.submit(c)

    def submit(self, c) -> None:
        self.s.submit(self.rid, c, self.prompt[self.rid])
        self.owner[self.rid] = c
        self.rid += 1

    def run(self, steps: int) -> None:
        s, output, owner = self.s, self.output, self.owner
        for _ in range(steps):
            s.schedule()
            s.decode()
            for rid in s.running():
                if s.generated(rid) >= output[rid]:
                    s.finish(rid)
                    self.submit(owner.pop(rid))


@pytest.mark.parametrize(
    "impl",
    [("vtc._core", vtc.Scheduler), ("vtc.reference", vtc.reference.Scheduler)],
    ids=lambda x: x[0],
)
def test_sim_throughput(benchmark, impl):
    name, make = impl
    sim = Sim(make)
    sim.run(200)  # warm up past the initial fill
    benchmark.group = f"simulation: {STEPS} decode steps (design-note setup)"
    benchmark.pedantic(sim.run, args=(STEPS,), rounds=5, iterations=1)
    benchmark.extra_info["steps_per_second"] = STEPS / benchmark.stats.stats.mean
