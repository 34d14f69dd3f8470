"""vtc: the Virtual Token Counter fair scheduler for LLM serving.

>>> import vtc
>>> s = vtc.Scheduler(M=8192)
>>> s.submit(1, "tenant-a", 100)
>>> s.schedule()
[1]

The scheduler itself is in Rust (``vtc._core``); ``vtc.reference`` is a
readable pure-Python twin used to test it, and ``vtc.sim`` simulates
workloads on top of it.
"""

from vtc._core import (
    CHANGE_READERS,
    MAX_BUDGET,
    MAX_TOKENS_PER_CALL,
    SNAPSHOT_VERSION,
    ContextCost,
    LinearCost,
    QuadraticCost,
    Scheduler,
    __version__,
    key_id,
)
from vtc.errors import (
    CapacityError,
    DuplicateRequestError,
    InternalError,
    InvalidArgumentError,
    RequestStateError,
    SchedulerError,
    SnapshotError,
    UnknownRequestError,
)

POLICIES = ("vtc", "lcf", "fcfs")

__all__ = [
    "MAX_BUDGET",
    "MAX_TOKENS_PER_CALL",
    "SNAPSHOT_VERSION",
    "CHANGE_READERS",
    "POLICIES",
    "CapacityError",
    "ContextCost",
    "LinearCost",
    "QuadraticCost",
    "DuplicateRequestError",
    "InternalError",
    "InvalidArgumentError",
    "RequestStateError",
    "Scheduler",
    "SchedulerError",
    "SnapshotError",
    "UnknownRequestError",
    "__version__",
    "key_id",
]
