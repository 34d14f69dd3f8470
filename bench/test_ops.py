"""Per-operation latency of vtc.Scheduler from Python, as C (clients) and B
(running batch) grow.

Every scheduler here has C clients, all backlogged, and a steady running
batch; prompts are 256 tokens so that the budget admits a known batch.

* ``submit``: a new request for a random client (the backlog grows by the
  number of rounds, a negligible fraction of it).
* ``schedule``: admits exactly one request (set-up finishes the oldest
  running request first, freeing one prompt's worth of budget).
* ``finish``: the oldest running request (set-up admits one first).
* ``decode``: ``decode(ids, 1)`` for a batch of B running requests given as
  a numpy int64 array; the B requests belong to min(B, C) distinct clients.
* ``decode_lists``: ``decode(ids, tokens)`` with the ids as the Python list an
  engine holds, and tokens either ``1`` or a list of ones (C = 1,000), in the
  same group as ``decode`` (numpy) and ``decode_all``.
* ``decode_all``: ``decode_all(1)``, the same charges with no ids (the uniform
  step), in the same group as ``decode`` so the two are side by side.
"""

import threading
from collections import deque

import numpy as np
import pytest

import vtc

P = 256  # every prompt
CS = [10, 1_000, 100_000]
BS = [64, 256, 1024]
K = 256  # running requests in the submit/schedule/finish scheduler
# (clients, waiting requests per client): the default backlog (4K requests, at
# least 2 per client), and 100,000 clients with 1,000,000 waiting.
BIG = (100_000, 10)
CASES = [(c, None) for c in CS] + [BIG]
CASE_IDS = [str(c) for c in CS] + ["100000-1Mwaiting"]


class State:
    """A scheduler with C backlogged clients (``per_client`` waiting each)
    and ``running`` admitted requests."""

    def __init__(self, C: int, running: int, per_client: int) -> None:
        self.s = vtc.Scheduler(running * P, 1.0, 2.0)
        self.C = C
        self.rid = 0
        self.rng = np.random.default_rng(C)
        for _ in range(per_client):
            for c in range(C):
                self.submit(c)
        self.running = deque(self.s.schedule())
        assert len(self.running) == running

    def submit(self, c: int) -> None:
        self.s.submit(self.rid, c, P)
        self.rid += 1


_cache: dict = {}


def state(C: int, per_client: int | None = None) -> State:
    per_client = per_client or max(2, -(-4 * K // C))
    if (C, per_client) not in _cache:
        _cache.clear()  # one large scheduler alive at a time
        _cache[C, per_client] = State(C, K, per_client=per_client)
    return _cache[C, per_client]


@pytest.mark.parametrize(("C", "per_client"), CASES, ids=CASE_IDS)
def test_submit(benchmark, C, per_client):
    st = state(C, per_client)
    clients = iter(st.rng.integers(0, C, size=1_000_000).tolist())

    def setup():
        st.rid += 1
        return (st.rid - 1, next(clients), P), {}

    benchmark.group = "submit"
    benchmark.extra_info["waiting"] = st.s.num_waiting
    benchmark.pedantic(st.s.submit, setup=setup, rounds=20_000, iterations=1)


@pytest.mark.parametrize(("C", "per_client"), CASES, ids=CASE_IDS)
def test_schedule_one(benchmark, C, per_client):
    st = state(C, per_client)
    s = st.s

    def setup():
        s.finish(st.running.popleft())
        st.submit(int(st.rng.integers(0, C)))

    def run():
        st.running.extend(s.schedule())

    benchmark.group = "schedule (admits 1)"
    benchmark.extra_info["waiting"] = st.s.num_waiting
    benchmark.pedantic(run, setup=setup, rounds=20_000, iterations=1)
    assert len(st.running) == K


@pytest.mark.parametrize(("C", "per_client"), CASES, ids=CASE_IDS)
def test_finish(benchmark, C, per_client):
    st = state(C, per_client)
    s = st.s

    def setup():
        st.submit(int(st.rng.integers(0, C)))
        st.running.extend(s.schedule())
        return (st.running.popleft(),), {}

    benchmark.group = f"finish (oldest of B={K})"
    benchmark.extra_info["waiting"] = st.s.num_waiting
    benchmark.pedantic(s.finish, setup=setup, rounds=20_000, iterations=1)


@pytest.mark.parametrize("B", BS)
@pytest.mark.parametrize("C", CS)
def test_decode(benchmark, C, B):
    _cache.clear()
    st = State(C, B, per_client=max(2, -(-2 * B // C)))
    ids = np.array(sorted(st.running), dtype=np.int64)
    s = st.s
    benchmark.group = f"decode B={B}"
    benchmark.extra_info["distinct_clients"] = min(B, C)
    benchmark.pedantic(s.decode, args=(ids, 1), rounds=3_000, iterations=1, warmup_rounds=10)


@pytest.mark.parametrize("tokens", ["int", "list"])
@pytest.mark.parametrize("B", BS)
def test_decode_lists(benchmark, B, tokens):
    C = 1_000
    _cache.clear()
    st = State(C, B, per_client=max(2, -(-2 * B // C)))
    ids = sorted(st.running)
    toks = 1 if tokens == "int" else [1] * B
    s = st.s
    benchmark.group = f"decode B={B}"
    benchmark.extra_info["distinct_clients"] = min(B, C)
    benchmark.pedantic(s.decode, args=(ids, toks), rounds=3_000, iterations=1, warmup_rounds=10)


@pytest.mark.parametrize("B", BS)
@pytest.mark.parametrize("C", CS)
def test_decode_all(benchmark, C, B):
    _cache.clear()
    st = State(C, B, per_client=max(2, -(-2 * B // C)))
    s = st.s
    benchmark.group = f"decode B={B}"
    benchmark.extra_info["distinct_clients"] = min(B, C)
    benchmark.pedantic(s.decode_all, args=(1,), rounds=3_000, iterations=1, warmup_rounds=10)


@pytest.mark.parametrize("neighbour", ["idle", "busy thread"])
def test_decode_beside_a_thread(benchmark, neighbour):
    """``decode`` of 256 ids while another Python thread runs (vLLM's engine
    process has such threads). A call that released the GIL would have to win
    it back from that thread, waiting up to its switch interval (5 ms): the
    mean and max show it. Batches this size keep the GIL (DETACH_MIN)."""
    st = State(64, 256, per_client=8)
    ids = np.array(sorted(st.running), dtype=np.int64)
    stop = threading.Event()

    def spin() -> None:
        x = 0
        while not stop.is_set():
            x += 1

    thread = threading.Thread(target=spin, daemon=True)
    if neighbour == "busy thread":
        thread.start()
    try:
        benchmark.group = "decode B=256 beside another thread"
        benchmark.pedantic(st.s.decode, args=(ids, 1), rounds=2_000, iterations=1, warmup_rounds=10)
    finally:
        stop.set()
        if thread.is_alive():
            thread.join()
