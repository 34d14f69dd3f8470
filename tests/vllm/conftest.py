"""Fixtures for the vLLM integration tests (run by ``make test-vllm`` in .venv-vllm).

The main test run ignores this directory: vLLM is not installed in .venv.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from vllm_harness import write_tiny_llama  # noqa: E402


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A folder with the tiny Llama's ``config.json`` (what the scheduler reads)."""
    return str(write_tiny_llama(tmp_path_factory.mktemp("tiny-llama-config"), weights=False))


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama with random weights, generated here (never downloaded)."""
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"), weights=True)


@pytest.fixture(autouse=True)
def _clean_vtc_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test starts without VTC_* configuration from the caller's shell."""
    for name in list(os.environ):
        if name.startswith("VTC_"):
            monkeypatch.delenv(name)
    yield


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from redis_server import RedisServer, running_redis  # noqa: E402


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A real redis-server on loopback (tests/redis_server.py), for shared counters."""
    yield from running_redis(tmp_path)


@pytest.fixture(autouse=True)
def cache_checks(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Every answer the queue and ``vtc.adapter.Requests`` give vLLM is checked
    against the core's own: ``head`` kept within a scheduling pass, and the native
    queue's ``bool``, ``len`` and provisional pop (``vtc._core.WaitingQueue``).
    Every test here (preemption, priorities, skips, locality, shared counters)
    fails on a stale one. Yields how many such answers were checked."""
    from vtc.adapter import Adapter, Requests
    from vtc.vllm import VTCRequestQueue

    checked = {"head": 0, "num_waiting": 0, "pop": 0}
    head = Requests.head
    queue_bool, queue_len = VTCRequestQueue.__bool__, VTCRequestQueue.__len__
    queue_pop = VTCRequestQueue.pop_request

    def checked_head(self: Requests) -> Any:
        cached = self.head_kept_at == self.changes
        t = head(self)
        if cached:
            rid = self.core.peek()  # (within a pass: the lookup's answers are frozen)
            assert t is (None if rid is None else self._by_rid[rid]), "stale head"
            checked["head"] += 1
        return t

    # the prefix lookup each adapter installed, by its Requests' id (kept alive here)
    lookups: dict[int, tuple[Requests, Any]] = {}
    set_prefix_lookup = Adapter.set_prefix_lookup

    def recorded_set_prefix_lookup(self: Adapter, *args: Any, **kwargs: Any) -> Any:
        lookup = set_prefix_lookup(self, *args, **kwargs)
        lookups[id(self.requests)] = (self.requests, lookup)
        return lookup

    def checked_pop(self: VTCRequestQueue) -> Any:
        request = queue_pop(self)
        # (the core's answers stand from the pop to this peek unless a lookup is
        # installed and not frozen: a pass freezes it, and vLLM's schedule() enters
        # one whenever a lookup is installed, see VTCScheduler.schedule)
        lookup = lookups.get(id(self.requests), (None, None))[1]
        if lookup is None or lookup.frozen:
            rid = self.core.peek()
            assert self._pending is not None and self._pending.rid == rid, "stale pop"
            checked["pop"] += 1
        return request

    def check_count(queue: VTCRequestQueue) -> None:
        assert queue.requests.num_waiting() == queue.core.num_waiting, "stale count"
        checked["num_waiting"] += 1

    def checked_bool(self: VTCRequestQueue) -> bool:
        answer = queue_bool(self)
        check_count(self)
        assert answer == (self.core.num_waiting > 0)
        return answer

    def checked_len(self: VTCRequestQueue) -> int:
        answer = queue_len(self)
        check_count(self)
        assert answer == self.core.num_waiting
        return answer

    monkeypatch.setattr(Requests, "head", checked_head)
    monkeypatch.setattr(VTCRequestQueue, "__bool__", checked_bool)
    monkeypatch.setattr(VTCRequestQueue, "__len__", checked_len)
    monkeypatch.setattr(VTCRequestQueue, "pop_request", checked_pop)
    monkeypatch.setattr(Adapter, "set_prefix_lookup", recorded_set_prefix_lookup)
    return checked
