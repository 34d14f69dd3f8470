"""A vLLM arrival's parts by the wall clock, cold: before each call a strided touch of
32 MB (numpy: one cache line in 64 bytes, little code of its own) evicts the caches,
then one call is timed: the VTC queue's ``add_request``, the tenant rule alone, a bare
``vtc.Scheduler.submit``, and a ``deque.append`` (what vLLM's own queue does: the
floor). Medians (µs) of N calls each, the first 500 left out. Needs vLLM: run it in
.venv-vllm with the build on ``PYTHONPATH``, pinned, builds alternated::

    OMP_NUM_THREADS=1 PYTHONPATH=<build> taskset -c 1 .venv-vllm/bin/python \\
        bench/probes/arrival_cold.py
"""

import collections
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

here = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(here), str(here.parent / "tests" / "vllm")]

from vllm_harness import make_request, make_scheduler, vllm_config, write_tiny_llama  # noqa: E402

import test_vllm_overhead as B  # noqa: E402
import vtc  # noqa: E402
from vtc.vllm import VTCScheduler  # noqa: E402

N = int(os.environ.get("N", "3000"))
model = write_tiny_llama(Path(tempfile.mkdtemp()), weights=False)
config = vllm_config(
    str(model), max_num_seqs=B.MAX_NUM_SEQS, max_num_batched_tokens=8192, max_model_len=1024
)
scheduler = make_scheduler(VTCScheduler, config, num_blocks=B.NUM_BLOCKS)
queue, rule = scheduler.waiting, scheduler.vtc_tenancy.rule
core = vtc.Scheduler(M=100_000)
floor: collections.deque = collections.deque()
requests = [make_request(f"t{i % B.TENANTS}", 100, 50) for i in range(N)]
other = np.zeros(32 << 20, dtype=np.uint8)
clock = time.perf_counter_ns
times: dict[str, list[int]] = {"add_request": [], "tenant rule": [], "submit": [], "deque": []}
for k, request in enumerate(requests):
    for name, spent in times.items():
        other[::64] += 1  # (the caches evicted)
        t0 = clock()
        if name == "add_request":
            queue.add_request(request)
        elif name == "tenant rule":
            rule(request)
        elif name == "submit":
            core.submit(k, f"t{k % B.TENANTS}", 100)
        else:
            floor.append(request)
        spent.append(clock() - t0)
for name, spent in times.items():
    print(f"{name:12s} cold median {statistics.median(spent[500:]) / 1e3:6.2f} us")
