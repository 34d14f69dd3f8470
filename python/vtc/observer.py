"""The observer interface of the engine adapter (:mod:`vtc.adapter`).

What an observer of an engine's VTC (the trace, :mod:`vtc.metrics`,
:mod:`vtc.sharing`) sees, and nothing else:

* :class:`Tracked`, the record of one engine request that hook points pass;
* :class:`Observer`, the hook points, and ``_Observers``, which calls them;
* :class:`AdapterView` (with :class:`TenancyView` and :class:`RequestsView`),
  the part of :class:`vtc.adapter.Adapter` an observer may read at ``stepped``.

Invariant: this module imports none of :mod:`vtc.adapter`, :mod:`vtc.metrics`
and :mod:`vtc.sharing`, so the adapter can import its observers and they this
module, with no import circle. An observer that raises never stops the
adapter: ``_Observers`` logs it (once per observer and point) and goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, Protocol

from vtc._core import Scheduler, Tracked
from vtc.config import EngineConfig

__all__ = ["AdapterView", "Observer", "RequestsView", "TenancyView", "Tracked"]

_log = logging.getLogger("vtc")


class TenancyView(Protocol):
    """What an observer reads of the adapter's :class:`vtc.adapter.Tenancy`."""

    def counters(self) -> dict[str, float]:
        """Each tenant's virtual counter (weighted service plus lifts)."""

    def services(self) -> dict[str, float]:
        """Each tenant's weighted service actually delivered (no lifts)."""

    def weight(self, tenant: str) -> float:
        """The weight in force for ``tenant`` (1 unless configured)."""


class RequestsView(Protocol):
    """What an observer reads of the adapter's :class:`vtc.adapter.Requests`."""

    def __len__(self) -> int:
        """Requests tracked (waiting, running or set aside)."""

    def queued(self) -> dict[str, int]:
        """How many requests each tenant has waiting or running."""

    def by_tenant(self) -> tuple[dict[str, int], dict[str, int]]:
        """How many requests each tenant has waiting (or set aside) and running."""


class AdapterView(Protocol):
    """What an observer reads of the :class:`vtc.adapter.Adapter` that its
    ``stepped`` point is given."""

    @property
    def core(self) -> Scheduler:
        """The engine's core."""

    @property
    def config(self) -> EngineConfig:
        """The configuration in force (weights follow ``VTC_WEIGHTS_FILE``)."""

    @property
    def tenancy(self) -> TenancyView:
        """Which tenant a request is billed to; the tenants' counters and weights."""

    @property
    def requests(self) -> RequestsView:
        """The engine's requests in the core."""


class Observer:
    """Where shared counters and metrics plug in: the adapter calls each of its
    observers at these points, in order. Every method here does nothing;
    override the ones you need.

    Calls are synchronous, on the engine's scheduling thread, right after the
    core call they report: keep them cheap. An observer that raises is logged
    (once per observer and point) and skipped; scheduling goes on.
    """

    def arriving(self, tenant: str) -> None:
        """A request of ``tenant`` is about to be submitted to the core (the
        shared counters lift the tenant to the global floor here)."""

    def admitted(self, t: Tracked, prompt_tokens: int) -> None:
        """``t`` was admitted; ``prompt_tokens`` of its prompt were charged (its
        prefix-cache hit excluded; 0 when a preempted request comes back)."""

    def charged(self, produced: list[tuple[Tracked, int]]) -> None:
        """Generated tokens were charged, ``(request, tokens)`` (a request once)."""

    def preempted(self, t: Tracked) -> None:
        """``t`` went back to waiting; its prompt is not charged again."""

    def released(self, t: Tracked, finished: bool) -> None:
        """``t`` left: it ran to completion (``finished``) or was cancelled."""

    def forgetting(self, core: Scheduler) -> None:
        """The core is about to forget idle tenants (``forget_idle``): what it
        keeps of them (counters, token tallies) goes with them."""

    def forgot(self, tenants: list[str]) -> None:
        """The core forgot these idle tenants (``forget_idle``)."""

    def stepped(self, adapter: AdapterView) -> None:
        """The engine finished a step (its outputs are charged)."""


class _Observers(list):
    """The observers of one adapter, called safely (see :class:`Observer`).

    :meth:`wants` is answered once per point while the list is unchanged: every
    method that changes which observers it holds forgets the answers."""

    def __init__(self, observers: Iterable[Observer] = (), log: logging.Logger | None = None):
        super().__init__(observers)
        self._log = log or _log
        self._failed: set[tuple[int, str]] = set()
        self._wants: dict[str, bool] = {}

    def wants(self, point: str) -> bool:
        """Whether an observer overrides ``point``: a hot path builds the
        arguments of a point only if someone listens to it."""
        known = self._wants.get(point)
        if known is None:
            base = getattr(Observer, point)
            known = self._wants[point] = any(
                getattr(type(o), point, base) is not base for o in self
            )
        return known

    def notify(self, point: str, *args: Any) -> None:
        for o in self:
            try:
                getattr(o, point)(*args)
            except Exception:
                if (id(o), point) not in self._failed:
                    self._failed.add((id(o), point))
                    self._log.exception("VTC: observer %r failed in %s; skipped", o, point)


def _forgets_wants(name: str) -> Any:
    change = getattr(list, name)

    def changed(self: _Observers, *args: Any) -> Any:
        self._wants.clear()
        return change(self, *args)

    changed.__name__ = name
    changed.__doc__ = change.__doc__
    return changed


# every list method that can change which observers the list holds
for _name in (
    "append", "extend", "insert", "remove", "pop", "clear",
    "__setitem__", "__delitem__", "__iadd__", "__imul__",
):  # fmt: skip
    setattr(_Observers, _name, _forgets_wants(_name))
del _name
