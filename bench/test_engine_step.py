"""Side by side on one workload: a whole engine step (decode charges for the
running batch + finishes + refills + admissions) at C = 10,000 clients,
M = 200,000 KV tokens (B ~ 500 running), 100,000 waiting.

(a) ``HeapqVTC``: pure-Python VTC, heapq with lazy deletion;
(b) ``ArtifactVTC``: the paper artifact's approach, O(C) min per admission;
(c) ``vtc.Scheduler``.

The ratios are in bench/README.md (group ``engine-step``).
"""

import pytest

import vtc
from pyvtc import ArtifactVTC, HeapqVTC
from workload import Engine

C = 10_000
WAITING = 100_000
M = 200_000
WARMUP = 300  # steps to reach a steady mix of ages in the batch

IMPLS = {
    "vtc._core": lambda m: vtc.Scheduler(m, 1.0, 2.0),
    "heapq-python": HeapqVTC,
    "artifact-O(C)": ArtifactVTC,
}
ROUNDS = {"vtc._core": 5000, "heapq-python": 1000, "artifact-O(C)": 200}


@pytest.mark.parametrize("ids", ["array", "list"])
@pytest.mark.parametrize("impl", list(IMPLS))
def test_engine_step(benchmark, impl, ids):
    """One engine step; the running ids passed to ``decode`` as a numpy view
    (``array``) or as the Python list an engine holds (``list``), both
    implementations given the same."""
    eng = Engine(IMPLS[impl](M), C, WAITING, seed=1, ids=ids)
    for _ in range(WARMUP):
        eng.step()
    benchmark.group = f"engine-step C=10k M=200k waiting=100k ids={ids}"
    benchmark.extra_info["running"] = eng.n
    benchmark.pedantic(eng.step, rounds=ROUNDS[impl], iterations=1, warmup_rounds=5)
    benchmark.extra_info["running_after"] = eng.n


def test_baselines_agree():
    """Not a benchmark (skipped under --benchmark-only): the two Python
    baselines make exactly the admissions vtc.Scheduler makes."""
    for ids in ("array", "list"):
        engines = [Engine(make(20_000), 50, 2_000, seed=7, ids=ids) for make in IMPLS.values()]
        for _ in range(400):
            for e in engines:
                e.step()
        ref = engines[0]
        for e in engines[1:]:
            assert e.admitted == ref.admitted
            assert e.s.occupancy == ref.s.occupancy
            for c in range(50):
                assert e.s.counter[c] == ref.s.counter(c)
