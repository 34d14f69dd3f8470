"""The engine-agnostic half of the vLLM and SGLang integrations.

What both engine shells (``vtc.vllm``, ``vtc.sglang``) do the same way lives
here, importable and tested without either engine (issue 26 moves the rest of
the shared work here step by step). Today: :class:`Tenancy`, which bills each
arriving request to a tenant and keeps the core's memory following the live
tenants.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from vtc._core import Scheduler
from vtc.config import EngineConfig, first_tenant

__all__ = ["FORGET_EVERY", "Tenancy"]

FORGET_EVERY = 4096
"""Arrivals between two ``forget_idle()`` sweeps (each O(tenants))."""

_log = logging.getLogger("vtc")


class Tenancy:
    """Which tenant a new request is billed to, and how many tenants are tracked.

    The weights of ``config`` are set on ``core`` once. :meth:`arrive` names the
    tenant of each arriving request from the engine's tenant fields (in the
    engine's order; :func:`vtc.config.first_tenant`, else the default tenant).
    Memory follows the live tenants: every ``forget_every`` arrivals, and
    whenever a new tenant would exceed ``config.max_tenants``, the core forgets
    the idle tenants whose state can no longer change a decision
    (``Scheduler.forget_idle``). While ``max_tenants`` tenants are still
    active, requests of any further new tenant are billed to the default
    tenant (logged once): the cap bounds active tenants, not tenants ever seen.
    """

    def __init__(
        self,
        core: Scheduler,
        config: EngineConfig,
        *,
        forget_every: int = FORGET_EVERY,
        log: logging.Logger | None = None,
    ) -> None:
        if forget_every < 1:
            raise ValueError(f"forget_every must be >= 1, got {forget_every}")
        self.core = core
        self.config = config
        self.forget_every = forget_every
        self._log = log or _log
        for tenant, weight in config.weights.items():
            core.set_weight(tenant, weight)
        self._known: set[str] = set(config.weights)
        self._arrivals = 0
        self._warned_full = False

    def arrive(self, fields: Iterable[Any]) -> str:
        """The tenant a newly arriving request is billed to; ``fields`` are its
        tenant fields in the engine's order. Never raises for a malformed one."""
        self._arrivals += 1
        if self._arrivals % self.forget_every == 0:
            self.forget_idle()
        config = self.config
        tenant = first_tenant(fields)
        if tenant is None:
            return config.default_tenant
        if tenant not in self._known:
            if len(self._known) >= config.max_tenants:
                self.forget_idle()
            if len(self._known) >= config.max_tenants:
                if not self._warned_full:
                    self._warned_full = True
                    self._log.warning(
                        "VTC: %d tenants active (VTC_MAX_TENANTS); new ones share tenant %r",
                        config.max_tenants,
                        config.default_tenant,
                    )
                return config.default_tenant
            self._known.add(tenant)
        return tenant

    def forget_idle(self) -> int:
        """Let the core forget idle tenants now; how many it forgot."""
        n = self.core.forget_idle()
        if n:
            self._known = {str(k) for k in self.core.clients()} | set(self.config.weights)
        return n

    @property
    def num_tracked(self) -> int:
        """Tenants counted against ``max_tenants`` (named ones the core still holds)."""
        return len(self._known)

    def counters(self) -> dict[str, float]:
        """Each tenant's virtual counter (weighted service plus lifts)."""
        return {str(k): v for k, v in self.core.counters().items()}

    def services(self) -> dict[str, float]:
        """Each tenant's weighted service actually delivered (no lifts)."""
        return {str(k): v for k, v in self.core.services().items()}
