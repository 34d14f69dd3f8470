"""Cost of sharing counters through Redis: one sync (round trips, bytes) and an engine step.

Needs ``redis-server`` on PATH (started here on 127.0.0.1 at a free port, stopped after).
Groups: ``sync`` (one SharedCounters.sync, diff mode, T tenants waiting of which a
tenth were charged since the last sync) and ``engine-step+sync`` (a step of the
bench engine with and without ``on_step`` at sync_interval 1 and 10).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time

import pytest

import redis
import vtc
from vtc import distributed as D
from workload import Engine


@pytest.fixture(scope="module")
def url():
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server not found on PATH (apt-get install -y redis-server)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as d:
        args = [binary, "--bind", "127.0.0.1", "--port", str(port), "--dir", d, "--save", ""]
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL)
        try:
            for _ in range(500):
                try:
                    redis.Redis(port=port).ping()
                    break
                except redis.ConnectionError:
                    time.sleep(0.01)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            proc.terminate()
            proc.wait(timeout=10)


@pytest.mark.parametrize("tenants", [10, 100, 1000])
def test_sync(benchmark, url, tenants):
    s = vtc.Scheduler(1 << 20)
    st = D.RedisStore.from_url(url, f"bench-{tenants}", timeout_ms=2000)
    shared = D.SharedCounters(st, replica_id="bench")
    for c in range(tenants):
        s.submit(c, c, 10)
    s.schedule()  # one running request per tenant; every tenant also counts as waiting
    waiting = list(range(tenants))
    charged = list(range(0, tenants, 10))  # a tenth of the tenants get service per step
    shared.sync(s, waiting)

    def step():
        s.decode(charged, 1)
        shared.sync(s, waiting)

    b0, i0, r0 = st.bytes_out, st.bytes_in, shared.stats.round_trips
    benchmark.group = "sync"
    benchmark.pedantic(step, rounds=300, iterations=1, warmup_rounds=5)
    n = shared.stats.round_trips - r0
    benchmark.extra_info.update(
        round_trips_per_sync=n / 305,
        bytes_out_per_sync=(st.bytes_out - b0) / n,
        bytes_in_per_sync=(st.bytes_in - i0) / n,
    )


@pytest.mark.parametrize("interval", [None, 1, 10])
def test_engine_step_with_sync(benchmark, url, interval):
    eng = Engine(vtc.Scheduler(200_000, 1.0, 2.0), 1000, 20_000, seed=1)
    shared = None
    if interval is not None:
        st = D.RedisStore.from_url(url, f"step-{interval}", timeout_ms=2000)
        shared = D.SharedCounters(st, replica_id="bench", sync_interval=interval)
    waiting = list(range(1000))  # every tenant has requests waiting in this workload

    def step():
        eng.step()
        if shared is not None:
            shared.on_step(eng.s, waiting)

    for _ in range(200):
        step()
    benchmark.group = "engine-step+sync C=1k M=200k"
    benchmark.extra_info["sync_interval"] = interval
    benchmark.pedantic(step, rounds=1000, iterations=1, warmup_rounds=5)
    if shared is not None:
        benchmark.extra_info["bytes_per_step"] = (
            shared.store.bytes_out + shared.store.bytes_in
        ) / (shared.stats.round_trips * (interval or 1))
