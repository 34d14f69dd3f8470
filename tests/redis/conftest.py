"""Fixtures for tests/redis: a real ``redis-server`` (tests/redis_server.py)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from redis_server import RedisServer, running_redis  # noqa: E402


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A fresh Redis without persistence (``--save ""``, no AOF), stopped after the test."""
    yield from running_redis(tmp_path)


@pytest.fixture
def redis_aof(tmp_path: Path) -> Iterator[RedisServer]:
    """A fresh Redis with an AOF (fsync always) in a tmp dir: restarts keep its data."""
    yield from running_redis(tmp_path, aof=True)
