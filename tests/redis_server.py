"""A real ``redis-server`` on 127.0.0.1 at a free port, for tests that need one
(tests/redis, and the engine suites' shared-counter tests).

``redis-server`` must be on PATH (Debian: ``apt-get install -y redis-server``; ``make
test-core`` installs it); without it these tests fail, they do not skip.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import redis  # (redis-py is a test dependency: fail loudly if absent)

START_TIMEOUT_S = 60.0  # a deadline for redis-server to answer PING after it starts
# A deadline for the process to be gone after SIGTERM or SIGKILL. Generous: on a loaded
# 2-core VM a killed process has been seen still there 10 s after SIGKILL (its exit
# waits for the kernel, e.g. for pages reclaimed meanwhile).
EXIT_TIMEOUT_S = 60.0


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """One ``redis-server`` process: ``start``, ``stop`` and ``restart`` on the same port/dir."""

    def __init__(self, binary: str, workdir: Path, *, aof: bool = False) -> None:
        self.binary = binary
        self.dir = workdir
        self.aof = aof
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2)

    def start(self) -> None:
        args = [self.binary, "--bind", "127.0.0.1", "--port", str(self.port)]
        args += ["--dir", str(self.dir), "--save", "", "--protected-mode", "yes"]
        if self.aof:
            args += ["--appendonly", "yes", "--appendfsync", "always"]
        else:
            args += ["--appendonly", "no"]
        self.proc = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, cwd=self.dir
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                if self.client().ping():
                    return
            except redis.RedisError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server did not start on port {self.port}")
            time.sleep(0.02)

    def stop(self) -> None:
        """SIGTERM (Redis flushes its AOF and exits), SIGKILL if it lingers."""
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=EXIT_TIMEOUT_S)
        self.proc = None

    def kill(self) -> None:
        """SIGKILL, no shutdown of any kind (a crash); returns once the process is gone."""
        if self.proc is None:
            return
        self.proc.kill()
        self.proc.wait(timeout=EXIT_TIMEOUT_S)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()


def redis_binary() -> str:
    path = shutil.which("redis-server")
    if path is None:
        pytest.fail(
            "redis-server not found on PATH: tests/redis need a real Redis "
            "(Debian/Ubuntu: apt-get install -y redis-server)",
            pytrace=False,
        )
    return path


def running_redis(workdir: Path, *, aof: bool = False) -> Iterator[RedisServer]:
    """A started server in ``workdir`` (for a fixture to yield), stopped afterwards."""
    server = RedisServer(redis_binary(), workdir, aof=aof)
    server.start()
    try:
        yield server
    finally:
        server.stop()
