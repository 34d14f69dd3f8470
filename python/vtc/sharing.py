"""Shared counters in the engines: :class:`vtc.distributed.SharedCounters` as an adapter observer.

With ``VTC_REDIS_URL`` set, :class:`vtc.adapter.Adapter` adds a
:class:`SharedCounterSync` to its observers, for vLLM and SGLang alike. It

* attaches the synchronizer to the core before anything is charged (a
  scheduler restored from a snapshot counts nothing twice);
* lifts a tenant to the last global floor seen when one of its requests
  arrives (no I/O; the store lifts a tenant new to the global backlog the same
  way at the next sync);
* reads what the core charged before it forgets idle tenants, and drops the
  forgotten ones afterwards (service is never lost or counted twice);
* syncs from a background thread every ``VTC_SYNC_MS`` (default 50 ms), off
  the engine's critical path: the waiting tenants come from the core's change
  feed (``Scheduler.changes``: only the tenants changed since the last sync),
  which is thread-safe. With
  ``VTC_SYNC_MODE=step`` it syncs on the engine thread instead, every
  ``VTC_SYNC_INTERVAL`` steps.

Redis unreachable: the engine schedules as a local VTC, logged once; nothing
is blocked or dropped, and the next successful sync reconciles
(``docs/distributed.md``).
"""

from __future__ import annotations

import logging
from typing import Any

from vtc._core import Scheduler
from vtc.config import DEFAULT_SYNC_MS
from vtc.distributed import Client, SharedCounters
from vtc.observer import AdapterView, Observer

__all__ = ["SharedCounterSync"]

_log = logging.getLogger("vtc")


class SharedCounterSync(Observer):
    """Keeps an adapter's core in step with the global counters (see the module doc)."""

    def __init__(
        self,
        core: Scheduler,
        shared: SharedCounters,
        *,
        background: bool = True,
        interval_ms: float | None = None,
        log: logging.Logger | None = None,
        guard: Any = None,
    ) -> None:
        self.core = core
        self.shared = shared
        self.background = background
        self.interval_ms = interval_ms
        self._log = log or _log
        shared.attach(core)
        if background:
            # the engine's scheduling passes (Adapter.selecting) hold it: a sync raises
            # counters between passes, never between a peek and its pop
            shared.guard = guard
            shared.start(core, interval_ms=interval_ms, waiting=self._waiting)

    def waiting(self) -> list[Client]:
        """The tenants with requests waiting in the core (set-aside ones included)."""
        return [c for c, (w, _) in self.core.active_clients().items() if w]

    def _waiting(self) -> Any:
        """What each sync takes for the waiting set: the core's change feed
        (``CORE_WAITING``: only the tenants changed since the last sync), unless
        :meth:`waiting` was replaced on this object or the synchronizer has no feed
        (an older one): then what :meth:`waiting` returns, read at each sync."""
        feed = getattr(self.shared, "CORE_WAITING", None)
        if feed is None or "waiting" in self.__dict__:
            return self.waiting()
        return feed

    def arriving(self, tenant: str) -> None:
        floor = self.shared.floor
        if floor is not None:
            self.core.raise_counter(tenant, floor)

    def forgetting(self, core: Scheduler) -> None:
        self.shared.before_forget(core)

    def forgot(self, tenants: list[str]) -> None:
        self.shared.forgot(tenants)

    def pass_edge(self) -> None:
        """At the start and the end of a scheduling pass (the guard held): the
        counters a background sync pulled meanwhile."""
        self.shared.apply_deferred(self.core)

    def stepped(self, adapter: AdapterView) -> None:
        if not self.background:
            self.shared.on_step(self.core, self._waiting)  # read only when a sync is due

    def close(self) -> None:
        """Stop syncing; a last sync pushes what is left and takes this replica's
        tenants out of the global backlog."""
        self.shared.stop()
        self.shared.sync(self.core, [])

    def describe(self) -> str:
        """One line for the start-up log."""
        s = self.shared
        if self.background:
            period = self.interval_ms or s.sync_ms or DEFAULT_SYNC_MS
            how = f"every {period:g} ms in the background (their CPU at most {s.cpu_share:.1%})"
        else:
            how = f"every {s.sync_interval} steps"
        store: Any = s.store
        where = getattr(store, "namespace", "?")
        return f"shared counters on Redis (namespace {where!r}, replica {s.replica_id!r}), {how}"
