"""The exceptions vtc raises (defined in the Rust core, re-exported here).

``SchedulerError`` is the base of all of them; each subclass also derives from
the matching built-in, so ``except ValueError`` / ``except KeyError`` work as
usual. Every one of them means the scheduler was left exactly as it was.
"""

from vtc._core import (
    CapacityError,
    DuplicateRequestError,
    InternalError,
    InvalidArgumentError,
    RequestStateError,
    SchedulerError,
    SnapshotError,
    UnknownRequestError,
)

__all__ = [
    "CapacityError",
    "DuplicateRequestError",
    "InternalError",
    "InvalidArgumentError",
    "RequestStateError",
    "SchedulerError",
    "SnapshotError",
    "UnknownRequestError",
]
