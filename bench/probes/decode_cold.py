"""``decode(<list of B ids>, 1)`` by the wall clock, ns per id, warm and cold (8 MB of
other memory summed before each call): B ids of B clients among 1,000 (``B``, default
256), median of 2,000 calls each. Run pinned (``taskset -c 1``), builds alternated."""

import os
import statistics
import time

import numpy as np

import vtc

B = int(os.environ.get("B", "256"))
s = vtc.Scheduler(M=10**12)
for i in range(4 * B):
    s.submit(i * 7919 + 3, f"c{i % 1000}", 100)
ids = sorted(s.pop() for _ in range(B))
other = np.ones(2**20, dtype=np.int64)  # 8 MB


def run(cold: bool) -> float:
    ts = []
    for _ in range(2000):
        if cold:
            other.sum()
        t0 = time.perf_counter_ns()
        s.decode(ids, 1)
        ts.append(time.perf_counter_ns() - t0)
    return statistics.median(ts) / B


print(f"B={B} warm {run(False):.1f} cold {run(True):.1f} ns per id")
