"""Per-tenant series from several scheduler processes in one prometheus_client
multiprocess directory, as vLLM's data-parallel ranks write them (each rank an
engine-core process with its own VTC; the API server collects the directory).

Two real processes each run an adapter with metrics and hold requests; the
directory is then collected the way vLLM's API server does
(``MultiProcessCollector``). The real DP server: tests/vllm/test_vllm_dp.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

RANK = """
import sys
import vtc
from vtc.adapter import Adapter
from vtc.config import EngineConfig
from vtc.metrics import TenantMetrics

waiting = dict(pair.split("=") for pair in sys.argv[1].split(",") if pair)
running = dict(pair.split("=") for pair in sys.argv[2].split(",") if pair)
metrics = TenantMetrics(interval=0.0, budget=1000)
adapter = Adapter(vtc.Scheduler(M=1000), EngineConfig(), observers=[metrics])
n = 0
for tenant, count in running.items():
    for _ in range(int(count)):
        n += 1
        t = adapter.arrive(n, None, [tenant], 10)
        adapter.requests.admit(t, 0)
for tenant, count in waiting.items():
    for _ in range(int(count)):
        n += 1
        adapter.arrive(n, None, [tenant], 10)
adapter.step_done()
print("ok")
"""


def run_rank(directory: Path, waiting: str, running: str) -> None:
    env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=str(directory))
    r = subprocess.run(
        [sys.executable, "-c", RANK, waiting, running],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


@pytest.fixture
def collected(tmp_path: Path):
    directory = tmp_path / "prom"
    directory.mkdir()
    # rank 0: A has 2 waiting and 1 running, B 1 running; rank 1: A has 3 waiting
    run_rank(directory, "A=2", "A=1,B=1")
    run_rank(directory, "A=3", "")
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(directory))

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    return value


def test_requests_add_up_over_the_ranks(collected):
    assert collected("vtc_tenant_requests", tenant="A", state="waiting") == 5
    assert collected("vtc_tenant_requests", tenant="A", state="running") == 1
    assert collected("vtc_tenant_requests", tenant="B", state="running") == 1
    assert collected("vtc_tenant_requests", tenant="B", state="waiting") == 0


def test_active_tenants_are_the_most_on_one_rank_and_tokens_add_up(collected):
    # A is active on both ranks: a sum would say 3; rank 0 has 2 (A and B)
    assert collected("vtc_tenants_active") == 2
    # prompt tokens charged at admission: A's one and B's one, on rank 0
    assert collected("vtc_tenant_service_tokens_total", tenant="A", kind="prompt") == 10
    assert collected("vtc_tenant_service_tokens_total", tenant="B", kind="prompt") == 10
