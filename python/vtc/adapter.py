"""The engine-agnostic half of the vLLM and SGLang integrations.

What both engine shells (``vtc.vllm``, ``vtc.sglang``) do the same way lives
here, importable and tested without either engine (issue 26 moves the rest of
the shared work here step by step):

* :class:`Tenancy` bills each arriving request to a tenant and keeps the
  core's memory following the live tenants;
* :class:`Requests` maps the engine's requests onto core ids, makes every
  state change of a request in the core (submit, admit, set aside, put back,
  preempt, release), and charges a step's tokens in one core call, with the
  per-request fallback for the rare step one call cannot take;
* :class:`TenantTrace` writes what each tenant got (``VTC_TRACE_FILE``);
* :class:`PrefixLookup` answers the core's prefix lookup for the locality
  window (``VTC_LOCALITY_QUANTUM``) from the engine's prefix cache;
* :class:`Adapter` holds one engine's core with the three above, and the
  periodic log line; each shell drives one.

Its observers' interface (:class:`Observer`, the :class:`Tracked` record of a
request) lives in :mod:`vtc.observer`, which the observers (:mod:`vtc.metrics`,
:mod:`vtc.sharing`) import instead of this module; both names are importable
from here too.

``docs/architecture.md`` draws the data path through these parts.
"""

from __future__ import annotations

import json
import logging
import math
import operator
import os
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from vtc._core import Scheduler, TenantRule, key_id
from vtc.config import (
    DEFAULT_TENANT_KEY,
    MAX_TENANT_LEN,
    ConfigError,
    EngineConfig,
    first_tenant,
    load_weights_file,
    merge_weights,
)
from vtc.errors import InvalidArgumentError, RequestStateError, UnknownRequestError
from vtc.observer import AdapterView, Observer, Tracked, _Observers

__all__ = [
    "ASIDE",
    "Adapter",
    "FORGET_EVERY",
    "LOG_TENANTS",
    "LOOKUP_LOG_EVERY",
    "Observer",
    "PrefixLookup",
    "RUNNING",
    "WAITING",
    "Requests",
    "SchedulingPass",
    "Tenancy",
    "TenantTally",
    "TenantTrace",
    "Tracked",
    "engine_core",
    "format_counters",
    "vllm_tenant_fields",
]

FORGET_EVERY = 4096
"""Arrivals between two ``forget_idle()`` sweeps (each O(tenants))."""

_log = logging.getLogger("vtc")


def engine_core(config: EngineConfig, M: int) -> Scheduler:
    """The core an engine shell drives: KV budget ``M``, the configured prices,
    the ``vtc`` policy and the locality window ``config.locality_quantum``
    (``VTC_LOCALITY_QUANTUM``; 0 is plain VTC, and so is any quantum until the
    shell installs a lookup with :meth:`Adapter.set_prefix_lookup`)."""
    return Scheduler(
        M=M, wp=config.wp, wq=config.wq, policy="vtc", locality_quantum=config.locality_quantum
    )


def vllm_tenant_fields(request: Any, key: str = DEFAULT_TENANT_KEY) -> tuple[Any, Any]:
    """A vLLM request's tenant fields, in order: ``extra_args[key]``, its LoRA
    adapter's name (``vtc.vllm.tenant_fields``). Here, beside :class:`Tenancy`, as the
    Python reading of what :attr:`Tenancy.rule` reads natively; it needs no vLLM."""
    params = request.sampling_params
    extra = getattr(params, "extra_args", None) if params is not None else None
    lora = request.lora_request
    return (
        extra.get(key) if isinstance(extra, dict) else None,
        getattr(lora, "lora_name", None) if lora is not None else None,
    )


class Tenancy:
    """Which tenant a new request is billed to, and how many tenants are tracked.

    The weights of ``config`` are set on ``core`` at start, and again whenever
    ``VTC_WEIGHTS_FILE`` changes (:meth:`reload_weights`). :meth:`arrive` names the
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
        observers: _Observers | None = None,
    ) -> None:
        if forget_every < 1:
            raise ValueError(f"forget_every must be >= 1, got {forget_every}")
        self.core = core
        self.config = config
        self._log = log or _log
        self.observers = _Observers(log=self._log) if observers is None else observers
        for tenant, weight in config.weights.items():
            core.set_weight(tenant, weight)
        self._known: set[str] = set(config.weights)  # (changed in place: the rule reads it)
        #: counts arrivals (every ``forget_every``-th is due a :meth:`forget_idle`) and
        #: names an arriving vLLM request's tenant, natively when it is a known tenant
        #: named by a plain ``str`` field (``vtc._core.TenantRule``); every other case
        #: is :meth:`arrive`'s rule
        self.rule = TenantRule(
            self._known, config.tenant_key, forget_every, MAX_TENANT_LEN, self._arrive
        )
        self._warned_full = False
        self._clock = time.monotonic
        self._next_check = self._clock() + config.weights_reload
        # the weights file as last read (inode, size, mtime), or why it could not be
        self._file_seen: tuple[Any, ...] | None = self._stat()

    @property
    def forget_every(self) -> int:
        """Idle tenants are forgotten every this many arrivals (:attr:`rule` counts them)."""
        return self.rule.forget_every

    def weight(self, tenant: str) -> float:
        """The weight in force for ``tenant`` (1 unless configured)."""
        return self.config.weights.get(tenant, 1.0)

    def _stat(self) -> tuple[Any, ...] | None:
        path = self.config.weights_file
        if path is None:
            return None
        try:
            st = os.stat(path)
        except OSError as e:
            return ("error", e.errno)
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def reload_weights(self, now: float | None = None, *, force: bool = False) -> bool:
        """Re-read ``VTC_WEIGHTS_FILE`` if ``config.weights_reload`` seconds have passed
        since the last check (0: never) and the file changed (its inode, size or
        modification time); whether the weights in force changed.

        The new weights are the file's with ``VTC_WEIGHTS`` over them; they are set
        on the core at once, so the next charge of each tenant uses them, and a
        tenant no longer named goes back to weight 1. A file that cannot be read or
        is malformed keeps the weights in force, and says why in the log (once per
        version of the file). Never raises for the file.
        """
        config = self.config
        if config.weights_file is None:
            return False
        now = self._clock() if now is None else now
        if not force and (config.weights_reload <= 0 or now < self._next_check):
            return False
        self._next_check = now + config.weights_reload
        seen = self._stat()
        if seen == self._file_seen and not force:
            return False
        self._file_seen = seen
        try:
            new = merge_weights(load_weights_file(config.weights_file), config.env_weights)
        except ConfigError as e:
            self._log.warning("VTC: weights not reloaded, the ones in force stay: %s", e)
            return False
        old = config.weights
        if new == old:
            return False
        core = self.core
        for tenant in old.keys() - new.keys():
            core.set_weight(tenant, 1.0)
        for tenant, weight in new.items():
            if old.get(tenant) != weight:
                core.set_weight(tenant, weight)
        self.config = replace(config, weights=new)
        self._known |= new.keys()
        self._log.info(
            "VTC: weights reloaded from VTC_WEIGHTS_FILE %r: %s",
            config.weights_file,
            describe_weight_changes(old, new),
        )
        return True

    def arrive(self, fields: Iterable[Any]) -> str:
        """The tenant a newly arriving request is billed to; ``fields`` are its
        tenant fields in the engine's order. Never raises for a malformed one."""
        return self._arrive(self.rule.count_arrival(), fields)

    def _arrive(self, due: bool, fields: Iterable[Any]) -> str:
        """:meth:`arrive` of an arrival already counted (``due``: a :meth:`forget_idle`
        first); :attr:`rule` calls it for every case but its common one."""
        if due:
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
        before = set(self.core.clients()) if self.observers else None
        if self.observers.wants("forgetting"):
            self.observers.notify("forgetting", self.core)
        n = self.core.forget_idle()
        if n:
            clients = self.core.clients()
            known = self._known  # (in place: the rule holds it)
            known.clear()
            known.update(map(str, clients))
            known.update(self.config.weights)
            if before is not None:
                self.observers.notify("forgot", sorted(map(str, before.difference(clients))))
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


WAITING = "waiting"
"""A request's status in the core: waiting (``Scheduler.status``)."""
RUNNING = "running"
"""Admitted: running in the core."""
ASIDE = "aside"
"""Taken off its queue by ``set_aside``, not charged, until ``put_back``."""

_BAND_MIN, _BAND_MAX = -(2**63), 2**63 - 1  # the core's priority bands (i64)

_CHARGE_ERRORS = (UnknownRequestError, RequestStateError, InvalidArgumentError)


def _decode(core: Scheduler, per_rid: dict[int, int]) -> None:
    n = len(per_rid)
    core.decode(
        np.fromiter(per_rid.keys(), dtype=np.uint64, count=n),
        np.fromiter(per_rid.values(), dtype=np.uint64, count=n),
    )


class Requests:
    """The engine's requests in the core: ids, state changes and charging.

    A request's core id is ``key_id(key)`` (the hash of the engine's handle),
    so that ``charge_outputs`` can hand a step's output objects to the core
    with no lookup here (``decode_outputs(missing="hash-str")``); the rare key
    whose hash is taken by another live request gets the next free id. Such a
    key, and every key that is not a ``str`` (an int's hash is the int: an
    output of an untracked int key could name another's request), is kept in
    :attr:`overrides`, where the core looks it up. A request's state is the core's alone
    (``status(rid)``): nothing here can fall out of step with it.

    :meth:`head` is asked of the core once per change of its state within a
    scheduling pass (:class:`SchedulingPass`; :attr:`changes`, the core's
    ``state_version``); outside a pass it asks the core each time. (vLLM's queue
    asks the core natively: ``vtc._core.WaitingQueue``.)
    """

    def __init__(self, core: Scheduler, observers: _Observers | None = None) -> None:
        self.core = core
        self.observers = _Observers() if observers is None else observers
        self._by_key: dict[Hashable, Tracked] = {}
        #: the record of the request with this key (None if untracked): the dict's own
        #: ``get``, with no Python frame (engines ask it at every arrival)
        self.get: Callable[[Hashable], Tracked | None] = self._by_key.get
        self._by_rid: dict[int, Tracked] = {}
        #: key -> core id, for the keys the core cannot find by hashing: those
        #: whose id is not ``key_id(key)``, and every key that is not a str
        self.overrides: dict[Hashable, int] = {}
        self._M = core.M
        self._aside: dict[Hashable, int] = {}  # key -> order it was set aside in
        self._aside_seq = 0
        # Within a scheduling pass (set, with head_kept_at reset, at both of its edges
        # by SchedulingPass) head() may keep its answer while the core is unchanged.
        self._in_pass = False
        #: head()'s answer kept in this pass, valid while ``head_kept_at`` is
        #: :attr:`changes` (-1 outside a pass: never)
        self.head_kept: Tracked | None = None
        self.head_kept_at = -1

    @property
    def changes(self) -> int:
        """The core's ``state_version``: it advances with every change of the core's
        state, made here or not (shared counters' sync, weights reloaded). Compare,
        never order."""
        return self.core.state_version

    @property
    def uniform_steps(self) -> int:
        """The steps charged without reading ids, so far (:meth:`charge_outputs`;
        the core's ``uniform_decodes``)."""
        return self.core.uniform_decodes

    # -- lookups (and :attr:`get`) -------------------------------------------------
    def at(self, rid: int) -> Tracked:
        """The record of the request with this core id (KeyError if none)."""
        return self._by_rid[rid]

    def find(self, rid: int) -> Tracked | None:
        """The record of the request with this core id, or None."""
        return self._by_rid.get(rid)

    def head(self) -> Tracked | None:
        """The request the core admits next (None if none waits); within a
        scheduling pass, asked of the core once per change."""
        core = self.core
        version = core.state_version
        if self.head_kept_at == version:
            return self.head_kept
        rid = core.peek()
        t = None if rid is None else self._by_rid[rid]
        if self._in_pass:
            self.head_kept, self.head_kept_at = t, version
        return t

    def num_waiting(self) -> int:
        """The core's ``num_waiting``."""
        return self.core.num_waiting

    def __len__(self) -> int:
        return len(self._by_key)

    def __iter__(self):
        return iter(self._by_key.values())

    def status(self, t: Tracked) -> str | None:
        """The request's state in the core (``WAITING``, ``RUNNING``, ``ASIDE``)."""
        return self.core.status(t.rid)

    def statuses(self, tracked: list[Tracked]) -> list[str | None]:
        """:meth:`status` of each, in one core call."""
        return self.core.statuses([t.rid for t in tracked])

    def waiting(self) -> list[Tracked]:
        """The waiting requests, in arrival order (one ``statuses`` call)."""
        tracked = list(self._by_key.values())
        return [t for t, state in zip(tracked, self.statuses(tracked)) if state == WAITING]

    @property
    def num_aside(self) -> int:
        """Requests set aside and not put back yet."""
        return len(self._aside)

    def queued(self) -> dict[str, int]:
        """How many requests each tenant has waiting or running."""
        counts: dict[str, int] = {}
        for t in self._by_key.values():
            counts[t.tenant] = counts.get(t.tenant, 0) + 1
        return counts

    def by_tenant(self) -> tuple[dict[str, int], dict[str, int]]:
        """How many requests each tenant has waiting (or set aside) and running: the
        core's own per-client counts (``Scheduler.active_clients``), O(tenants)."""
        waiting: dict[str, int] = {}
        running: dict[str, int] = {}
        for c, (w, r) in self.core.active_clients().items():
            if w:
                waiting[str(c)] = w
            if r:
                running[str(c)] = r
        return waiting, running

    # -- state changes ---------------------------------------------------------------
    def submit(
        self, key: Hashable, request: Any, tenant: str, prompt_len: int, priority: int = 0
    ) -> Tracked:
        """A new request of ``tenant`` (named by :meth:`Tenancy.arrive`) arrives:
        submit it in band ``priority`` (smaller is more urgent; the core lifts a
        tenant entering a band it has nothing waiting in)."""
        if key in self._by_key:
            raise ValueError(f"request {key!r} is already tracked")
        rid = key_id(key)
        by_rid = self._by_rid
        moved = rid in by_rid
        while rid in by_rid:  # taken by a live request: the next free id
            rid = (rid + 1) % (1 << 64)
        n = prompt_len
        if type(n) is not int or not 0 < n <= self._M:  # (an int in range: as it is)
            n = min(max(int(n), 1), self._M)
        if type(priority) is not int or not _BAND_MIN <= priority <= _BAND_MAX:
            priority = min(max(int(priority), _BAND_MIN), _BAND_MAX)  # the core's 64-bit bands
        observers = self.observers
        if observers and observers.wants("arriving"):
            observers.notify("arriving", tenant)
        if priority:
            self.core.submit(rid, tenant, n, priority=priority)
        else:  # (the core's default band: no keyword to parse)
            self.core.submit(rid, tenant, n)
        t = Tracked(key, rid, request, tenant, n)
        self._by_key[key] = t
        by_rid[rid] = t
        if moved or type(key) is not str:
            self.overrides[key] = rid
        return t

    def admit(self, t: Tracked, cached_len: int) -> None:
        """``t``, the core's head, is admitted: its prompt is charged (less
        ``cached_len`` prefix-cache tokens; a preempted request's prompt never
        again), then the tokens it owes."""
        cached = cached_len
        if type(cached) is not int or not 0 <= cached <= t.prompt_len:  # (in range: as it is)
            cached = min(max(int(cached), 0), t.prompt_len)
        rid = self.core.pop(cached)  # (positional: no keyword to parse)
        if rid != t.rid:  # pragma: no cover - would be a bug in the shell
            raise RuntimeError(f"VTC core admitted {rid}, the engine admitted {t.rid}")
        t.admissions += 1
        owed, t.owed = t.owed, 0
        if owed:
            self.core.decode([rid], [owed])
        if self.observers:
            first = t.admissions == 1
            self.observers.notify("admitted", t, t.prompt_len - cached if first else 0)
            if owed:
                self.observers.notify("charged", [(t, owed)])

    def set_aside(self, t: Tracked) -> None:
        """``t``, the core's head, was skipped by the engine: off its queue, uncharged."""
        rid = self.core.set_aside()
        if rid != t.rid:  # pragma: no cover - would be a bug in the shell
            raise RuntimeError(f"VTC core set aside {rid}, the engine skipped {t.rid}")
        self._aside_seq += 1
        self._aside[t.key] = self._aside_seq

    def put_back(self, t: Tracked, state: str | None = None) -> None:
        """Back to the head of its tenant's queue: set aside (its place, nothing
        charged or lifted) or running (preempted: its prompt is not charged again);
        a waiting request stays as it is. ``state``: its :meth:`status`, if known."""
        if state is None:
            state = self.core.status(t.rid)
        if state == ASIDE:
            self.core.put_back(t.rid)
            del self._aside[t.key]
        elif state == RUNNING:
            self.core.preempt(t.rid)
            if self.observers:
                self.observers.notify("preempted", t)

    def put_back_all(self, tracked: Iterable[Tracked]) -> None:
        """:meth:`put_back` of several requests, their states read in one call.

        Each goes to the head of its tenant's queue, so the order of the calls
        decides the order they end up in: the set-aside ones first, the one set
        aside latest first (the earliest ends up at the head, where it was);
        then the running ones, the last given first (the first given ends up at
        the head, as an engine that prepends them in order expects).
        """
        tracked = list(tracked)
        states = self.statuses(tracked)
        aside = [t for t, state in zip(tracked, states) if state == ASIDE]
        aside.sort(key=lambda t: -self._aside[t.key])
        for t in aside:
            self.put_back(t, ASIDE)
        for t, state in reversed(list(zip(tracked, states))):
            if state == RUNNING:
                self.put_back(t, RUNNING)

    def sync_waiting(self, waiting: Mapping[Hashable, Any], enqueue: Callable[[Any], Any]) -> None:
        """Make the core's waiting set the engine's ``waiting`` (key -> request):
        a safety net for requests that left or entered by a path the shell does
        not see. A waiting request the engine no longer holds is released; each
        request of ``waiting`` that the core does not hold as waiting is handed
        to ``enqueue``."""
        tracked = list(self._by_key.values())
        for t, state in zip(tracked, self.statuses(tracked)):
            if state == WAITING and t.key not in waiting:
                self.release(t.key)
        if self.core.num_waiting == len(waiting):
            return
        get = self._by_key.get
        known = {key: t for key in waiting if (t := get(key)) is not None}
        state_of = dict(zip(known, self.statuses(list(known.values()))))
        for key, request in waiting.items():
            if state_of.get(key) != WAITING:
                enqueue(request)

    def release(self, key: Hashable, finished: bool = False) -> Tracked | None:
        """The request leaves: ``finish`` if it ran to completion, else ``cancel``;
        every trace of it is dropped (a no-op for an untracked key)."""
        t = self._by_key.get(key)
        if t is None:
            return None
        self._drop((t,), finished)
        return t

    def release_finished(
        self, keys: Iterable[Hashable], done: Callable[[Any], bool] | None = None
    ) -> list[Tracked]:
        """:meth:`release` ``(key, finished=True)`` of each tracked key of ``keys``
        whose engine request ``done(request)`` says finished (each tracked key, if
        ``done`` is None); untracked and repeated keys are skipped. Returns the
        records released, in order. A step's finishes in one call (vLLM: ``finished_req_ids``)."""
        get = self._by_key.get
        tracked = []
        for key in dict.fromkeys(keys):  # (a loop, not comprehensions: a frame each)
            t = get(key)
            if t is not None and (done is None or done(t.request)):
                tracked.append(t)
        if tracked:
            self._drop(tracked, True)
        return tracked

    def _drop(self, tracked: Iterable[Tracked], finished: bool) -> None:
        """Drop each of ``tracked`` (distinct and tracked): ``finish`` in the core if
        ``finished`` and it runs there, else ``cancel`` if the core holds it (a
        step's finishes come here)."""
        by_key, by_rid, core = self._by_key, self._by_rid, self.core
        observers = self.observers
        for t in tracked:
            key, rid = t.key, t.rid
            del by_key[key]
            del by_rid[rid]
            if self.overrides:
                self.overrides.pop(key, None)
            if self._aside:
                self._aside.pop(key, None)
            done = False
            if finished:
                try:
                    core.finish(rid)  # the usual case, in one core call: it ran to its end
                    done = True
                except (RequestStateError, UnknownRequestError):  # (nothing changed)
                    pass  # not running: cancelled below, if held
            if not done and core.status(rid) is not None:
                core.cancel(rid)
            if observers:
                observers.notify("released", t, done)

    # -- charging --------------------------------------------------------------------
    def charge(self, produced: Iterable[tuple[Tracked, int]]) -> list[tuple[Tracked, int]]:
        """Charge the tokens each request produced, in one core call (a request
        may repeat: its counts add up); returns the ``(request, tokens)`` of
        those not running, which are not charged (e.g. preempted with output in
        flight: :meth:`owe` charges them when it is admitted again).

        The common step (every request running) is one ``decode`` call; the
        core refuses a step with one that is not as a whole, and that step is
        then split by the requests' states (one ``statuses`` call)."""
        per_rid: dict[int, int] = {}
        for t, n in produced:
            if n > 0:
                per_rid[t.rid] = per_rid.get(t.rid, 0) + n
        if not per_rid:
            return []
        try:
            _decode(self.core, per_rid)
            idle = []
        except _CHARGE_ERRORS:
            states = self.core.statuses(list(per_rid))
            idle = [(r, n) for (r, n), state in zip(per_rid.items(), states) if state != RUNNING]
            for rid, _ in idle:
                del per_rid[rid]
            if per_rid:
                _decode(self.core, per_rid)
        by_rid = self._by_rid
        if per_rid and self.observers.wants("charged"):
            self.observers.notify("charged", [(by_rid[r], n) for r, n in per_rid.items()])
        return [(by_rid[rid], n) for rid, n in idle if rid in by_rid]

    def charge_totals(self, totals: Iterable[tuple[Hashable, int]]) -> None:
        """Charge by cumulative counts, for an engine that reports how many
        tokens each request has generated so far, ``(key, total)``: what is new
        since :attr:`Tracked.charged`, in one :meth:`charge` call (a key that
        repeats adds nothing the second time). The new tokens of a request not
        running stay uncharged: a later count finds them again. Unknown keys
        are ignored."""
        get = self._by_key.get
        produced = []
        for key, total in totals:
            t = get(key)
            if t is not None and total > t.charged:
                produced.append((t, total - t.charged))
                t.charged = total
        for t, n in self.charge(produced):
            t.charged -= n

    @staticmethod
    def owe(idle: Iterable[tuple[Tracked, int]]) -> None:
        """Tokens of requests not running are owed: :meth:`admit` charges them."""
        for t, n in idle:
            t.owed += n

    def charge_keys(self, produced: Iterable[tuple[Hashable, int]]) -> None:
        """:meth:`charge` by key, owing the tokens of requests not running;
        unknown keys are ignored."""
        get = self._by_key.get
        self.owe(self.charge((t, n) for key, n in produced if (t := get(key)) is not None))

    def charge_outputs(
        self,
        outputs: list[Any],
        id_attr: str = "request_id",
        tokens_attr: str = "new_token_ids",
        *,
        running: bool = False,
        tokens: list[Any] | None = None,
    ) -> None:
        """Charge one step's output objects: ``len(out.<tokens_attr>)`` tokens to
        the request keyed ``out.<id_attr>``.

        The common step (every output from a running request, each request
        once) is one ``decode_outputs`` call: the core reads the objects itself,
        with no Python-level loop. It charges nothing when an output is not
        from a running request or a request repeats (it is all or nothing);
        that step is then charged output by output (:meth:`charge_keys`).

        ``running``: the caller knows that every output is from a distinct
        request running in the core (the engine's structure says so; nothing
        here checks it). A step with as many outputs as there are running
        requests, each with the same number of tokens (most decode steps: one
        each), is then charged without reading an id (``decode_uniform``:
        ``decode_all`` in the core, O(running tenants)), counted in
        :attr:`uniform_steps` (by the core); any other step as above.

        ``tokens`` (with ``running``): the step's token lists, as many as
        ``outputs`` and in some order each output's ``<tokens_attr>`` list (the
        engine's structure says so; vLLM: the model runner's sampled tokens,
        :meth:`vtc.vllm._VTCMixin.update_from_output`). A uniform step is then
        told from their lengths, which are read faster than the outputs'
        attributes; any other step as above.

        An output of a request not tracked here (released with output in flight)
        is not charged: only a ``str`` key is hashed (``missing="hash-str"``),
        and a str's hash is salted per process, so it names a tracked request
        only by a 64-bit collision; any other key is found in :attr:`overrides`
        or not at all (``1`` and ``2**61`` hash alike).
        """
        if not outputs:
            return
        core = self.core
        try:
            if not running:
                uniform = False
            elif tokens is not None and len(tokens) == len(outputs):
                uniform = core.decode_uniform(tokens, tokens_attr=None)
            else:
                uniform = core.decode_uniform(outputs, tokens_attr=tokens_attr)
            if not uniform:
                core.decode_outputs(
                    outputs,
                    self.overrides,
                    missing="hash-str",
                    id_attr=id_attr,
                    tokens_attr=tokens_attr,
                )
        except _CHARGE_ERRORS:
            ids = operator.attrgetter(id_attr)
            counts = operator.attrgetter(tokens_attr)
            self.charge_keys(zip(map(ids, outputs), map(len, map(counts, outputs))))
            return
        observers = self.observers
        if observers and observers.wants("charged"):  # charged in the core: tell them, in Python
            ids = operator.attrgetter(id_attr)
            counts = operator.attrgetter(tokens_attr)
            get = self._by_key.get
            produced = [(get(ids(o)), len(counts(o))) for o in outputs]
            self.observers.notify("charged", [(t, n) for t, n in produced if n > 0 and t])


class TenantTrace(Observer):
    """What each tenant got, as JSON lines appended to a file.

    Enabled by ``VTC_TRACE_FILE``; a record every ``VTC_TRACE_INTERVAL`` seconds
    (default 0.1) after an engine step, and one at the step that leaves the
    engine idle (no step follows it: without it the last record would miss the
    last tokens). A record is ``{"t": <seconds, monotonic clock>, "time": <seconds
    since the epoch>, "tokens": {tenant: generated tokens so far}, "queued":
    {tenant: requests waiting or running}}``; ``t`` orders and spaces records
    (it never jumps), ``time`` dates them. A tenant the core forgets (idle,
    ``forget_idle``) leaves ``tokens``; if it comes back its count restarts at
    0. Written by both shells: vLLM's :class:`vtc.vllm.VTCScheduler` and
    :class:`vtc.vllm.TenantTracingScheduler` (vLLM's stock policy, so the two
    can be compared on the same workload), and the SGLang plugin.
    """

    def __init__(self, path: str, interval: float = 0.1) -> None:
        self._file = open(path, "a", buffering=1, encoding="utf-8")
        self.interval = interval
        self.tokens: dict[str, int] = {}
        self._last = -math.inf
        self._idle = True  # the last record was written with nothing queued
        self._changed = False  # tokens changed since the last record

    @classmethod
    def from_config(cls, config: EngineConfig) -> TenantTrace | None:
        """The trace ``VTC_TRACE_FILE`` asks for (every ``VTC_TRACE_INTERVAL`` s), or None."""
        if config.trace_file is None:
            return None
        return cls(config.trace_file, config.trace_interval)

    def add(self, tenant: str, tokens: int) -> None:
        """``tenant`` got ``tokens`` more generated tokens."""
        self.tokens[tenant] = self.tokens.get(tenant, 0) + tokens
        self._changed = True

    def forgot(self, tenants: list[str]) -> None:
        """As an :class:`Observer`: forgotten tenants leave the records (the
        core's tallies go with them)."""
        self._changed = True
        for tenant in tenants:
            self.tokens.pop(tenant, None)

    def stepped(self, adapter: AdapterView) -> None:
        """As an :class:`Observer`: a record if ``interval`` has passed, or if the
        engine is idle now and was not at the last record. Its tokens are the
        core's tallies (``Scheduler.tokens``), read only for a record."""
        core = adapter.core

        def tokens() -> dict[str, int]:
            return {str(k): d for k, (_, d) in core.tokens().items() if d}

        self.maybe_write(adapter.requests.queued, idle=len(adapter.requests) == 0, tokens=tokens)

    def maybe_write(
        self,
        queued: Callable[[], Mapping[str, int]],
        idle: bool = False,
        tokens: Callable[[], Mapping[str, int]] | None = None,
    ) -> bool:
        """Append a record if ``interval`` has passed since the last one, or if the
        engine is ``idle`` (nothing queued) and the last record does not say all
        there is (it was not idle, or tokens changed since); whether it wrote one.
        ``tokens``: each tenant's tokens so far (default: what :meth:`add` added)."""
        now = time.monotonic()
        if now - self._last < self.interval and not (idle and (self._changed or not self._idle)):
            return False
        self._last, self._idle, self._changed = now, idle, False
        got = self.tokens if tokens is None else tokens()
        record = {"t": now, "time": time.time(), "tokens": got, "queued": dict(queued())}
        self._file.write(json.dumps(record) + "\n")
        return True


class TenantTally:
    """The :class:`TenantTrace` of an engine that VTC does not schedule (its
    stock policy, measured before switching): each request's tenant by key,
    named as :class:`Tenancy` names them (without its cap), and the tokens it
    produced. Does nothing unless ``config`` asks for a trace."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.trace = TenantTrace.from_config(config)
        self._tenant_of: dict[Hashable, str] = {}

    def __len__(self) -> int:
        """Requests whose tenant is kept (0 once all have left)."""
        return len(self._tenant_of)

    def arrive(self, key: Hashable, fields: Iterable[Any]) -> None:
        """A request arrives; ``fields`` are its tenant fields in the engine's order."""
        if self.trace is not None:
            self._tenant_of[key] = first_tenant(fields) or self.config.default_tenant

    def produced(self, key: Hashable, tokens: int) -> None:
        """The request ``key`` produced ``tokens`` more (unknown keys are ignored)."""
        tenant = self._tenant_of.get(key)
        if tenant is not None and tokens > 0:
            self.trace.add(tenant, tokens)

    def left(self, key: Hashable) -> None:
        """The request ``key`` left the engine (a no-op for an unknown key)."""
        self._tenant_of.pop(key, None)

    def step_done(self, queued: Callable[[], Iterable[Hashable]]) -> None:
        """A step ended; ``queued()`` gives the keys of the requests the engine holds
        (read only when a record is due)."""
        if self.trace is not None:
            self.trace.maybe_write(lambda: self._count(queued()), idle=not self._tenant_of)

    def _count(self, keys: Iterable[Hashable]) -> dict[str, int]:
        counts: dict[str, int] = {}
        for key in keys:
            tenant = self._tenant_of.get(key)
            if tenant is not None:
                counts[tenant] = counts.get(tenant, 0) + 1
        return counts


LOOKUP_LOG_EVERY = 60.0
"""Seconds between two log lines of a failing prefix-cache lookup."""


class PrefixLookup:
    """The core's prefix lookup (``Scheduler.set_prefix_lookup``) for the locality
    window (``VTC_LOCALITY_QUANTUM``, docs/locality.md), over the engine's answer
    for one request.

    ``cached(request)`` is the engine shell's: how many leading tokens of that
    waiting request (the engine's own object) its prefix cache holds now. The core
    asks by core id; this maps the id back to the request and keeps the answer in
    the core's contract: an ``int`` in ``[0, prompt]`` (the prompt as submitted;
    a larger answer is cut to it), 0 for an id it does not track. It never
    raises: an answer that is not an integer, or an exception from ``cached``,
    counts as 0 (nothing cached) and is logged with its traceback, at most once
    every :data:`LOOKUP_LOG_EVERY` seconds (:attr:`failures` counts them all), so
    a broken cache lookup costs locality, never scheduling.

    Between :meth:`freeze` and :meth:`thaw` (one engine scheduling pass) each
    request is asked once and later selections get the same answer, so a ``peek``
    and the ``pop`` after it name the same request even if the engine's cache
    changes in between (an admission may evict).
    """

    def __init__(
        self,
        requests: Requests,
        cached: Callable[[Any], int],
        log: logging.Logger | None = None,
    ) -> None:
        self.requests = requests
        self.cached = cached
        self._log = log or _log
        self._memo: dict[int, int] | None = None
        self._clock = time.monotonic
        self._next_log = -math.inf
        #: times ``cached`` was asked, and how many of those failed
        self.calls = 0
        self.failures = 0

    def __call__(self, rid: int) -> int:
        memo = self._memo
        if memo is not None:
            hit = memo.get(rid)
            if hit is not None:
                return hit
        t = self.requests.find(rid)
        hit = 0 if t is None else self._ask(t)
        if memo is not None:
            memo[rid] = hit
        return hit

    def _ask(self, t: Tracked) -> int:
        self.calls += 1
        try:
            answer = self.cached(t.request)
            if isinstance(answer, bool) or not isinstance(answer, (int, np.integer)):
                raise TypeError(f"the prefix-cache lookup returned {answer!r}, not an int")
            hit = int(answer)
        except Exception:
            self.failures += 1
            now = self._clock()
            if now >= self._next_log:
                self._next_log = now + LOOKUP_LOG_EVERY
                self._log.exception(
                    "VTC: the engine's prefix-cache lookup failed (%d failures so far); the "
                    "request counts as uncached",
                    self.failures,
                )
            return 0
        return min(max(hit, 0), t.prompt_len)

    def freeze(self) -> bool:
        """One scheduling pass starts: each request's answer is asked once and kept
        until :meth:`thaw`. Whether this call froze the answers (False when they
        already were: :meth:`thaw` is then the outer pass's to call)."""
        if self._memo is not None:
            return False
        self._memo = {}
        return True

    def thaw(self) -> None:
        """The pass :meth:`freeze` started ends: answers are asked anew."""
        self._memo = None

    @property
    def frozen(self) -> bool:
        """Whether a pass is on (between :meth:`freeze` and :meth:`thaw`): each
        request's answer is then kept."""
        return self._memo is not None


LOG_TENANTS = 20
"""Tenants named in one log line (the most served); the others are counted."""


def describe_weight_changes(old: Mapping[str, float], new: Mapping[str, float]) -> str:
    """``gold 1 -> 2, free 0.5 -> 1 (removed)``: what changed from ``old`` to ``new``,
    names quoted as in the log line; at most :data:`LOG_TENANTS` changes, then a count."""
    changed = sorted(t for t in old.keys() | new.keys() if old.get(t) != new.get(t))
    parts = []
    for t in changed[:LOG_TENANTS]:
        before = f"{old[t]:g}" if t in old else "1"
        after = f"{new[t]:g}" if t in new else "1 (removed)"
        parts.append(f"{_name(t)} {before} -> {after}")
    if len(changed) > LOG_TENANTS:
        parts.append(f"(+{len(changed) - LOG_TENANTS} more)")
    return ", ".join(parts)


def _name(tenant: str) -> str:
    """A tenant name safe in a log line: as is if plain, else JSON-quoted."""
    if tenant.isprintable() and not any(c in tenant for c in " ,=()/\"'"):
        return tenant
    return json.dumps(tenant)


def format_counters(
    counters: Mapping[str, float],
    services: Mapping[str, float],
    waiting: Mapping[str, int],
    running: Mapping[str, int],
    most: int = LOG_TENANTS,
) -> str:
    """``tenant=counter (service) waiting/running, ...`` for the ``most`` tenants
    with the largest counters, names quoted when they are not plain (a name
    cannot break the line or fake an entry), then how many were left out."""
    shown = sorted(counters, key=lambda t: (-counters[t], t))[:most]
    parts = [
        f"{_name(t)}={counters[t]:.0f} ({services.get(t, 0.0):.0f}) "
        f"{waiting.get(t, 0)}/{running.get(t, 0)}"
        for t in sorted(shown)
    ]
    if len(counters) > len(shown):
        parts.append(f"(+{len(counters) - len(shown)} more tenants)")
    return ", ".join(parts)


class SchedulingPass:
    """:meth:`Adapter.selecting`'s context manager: :attr:`Adapter.selection_lock`
    held throughout; the shared counters' pass edge (if any) at both ends;
    :class:`Requests` in a pass (its head kept while the core's ``state_version``
    stands); the prefix lookup (if any) frozen. Each undone on the way out, in
    reverse, whatever raised. A class, not a ``contextlib`` generator: an engine
    enters one every step, and the generator's machinery was ~4.5 µs of vLLM's
    step (bench/README.md, optimisation 25); for the same reason the way out is
    ``__exit__`` itself, and the requests' pass flag is two stores at each edge,
    not a call (optimisation 28).

    One object can serve pass after pass (an engine keeps one: no object and no
    frame made each step), one at a time: entering it while it is in a pass raises
    ``RuntimeError`` (nested passes each take their own :meth:`Adapter.selecting`)."""

    __slots__ = ("_adapter", "_sharing", "_lookup", "_entered")

    def __init__(self, adapter: Adapter) -> None:
        self._adapter = adapter
        self._sharing: Any = None
        self._lookup: PrefixLookup | None = None  # the lookup this pass froze
        self._entered = False

    def __enter__(self) -> None:
        if self._entered:
            raise RuntimeError(
                "this scheduling pass is already entered; Adapter.selecting() makes another"
            )
        adapter = self._adapter
        lock = adapter.selection_lock
        lock.acquire()
        self._entered = True
        try:
            sharing = adapter.sharing
            if sharing is not None:
                sharing.pass_edge()
        except BaseException:
            self._entered = False
            lock.release()
            raise
        self._sharing = sharing
        try:
            requests = adapter.requests
            requests._in_pass, requests.head_kept_at = True, -1  # (in a pass: head kept)
            lookup = adapter.prefix_lookup
            if lookup is not None and lookup.freeze():
                self._lookup = lookup
        except BaseException:
            self.__exit__()
            raise

    def __exit__(self, *exc: object) -> None:
        adapter = self._adapter
        try:
            lookup, self._lookup = self._lookup, None
            if lookup is not None:
                lookup.thaw()
        finally:
            try:
                requests = adapter.requests
                requests._in_pass, requests.head_kept_at = False, -1  # (out: head asked)
                sharing, self._sharing = self._sharing, None
                if sharing is not None:
                    sharing.pass_edge()
            finally:
                self._entered = False
                adapter.selection_lock.release()


class Adapter:
    """One engine's VTC: its core, :class:`Tenancy`, :class:`Requests`, the
    :class:`TenantTrace` ``config`` asks for, and the log line every
    ``config.log_interval`` seconds. Each engine shell drives one."""

    def __init__(
        self,
        core: Scheduler,
        config: EngineConfig,
        *,
        forget_every: int = FORGET_EVERY,
        log: logging.Logger | None = None,
        observers: Iterable[Observer] = (),
    ) -> None:
        self.core = core
        self._log = log or _log
        self.trace = TenantTrace.from_config(config)
        trace = () if self.trace is None else (self.trace,)
        #: called at every hook point (:class:`Observer`); the trace is the first
        self.observers = _Observers([*trace, *observers], log=self._log)
        self.tenancy = Tenancy(
            core, config, forget_every=forget_every, log=self._log, observers=self.observers
        )
        self.requests = Requests(core, self.observers)
        self._last_log = time.monotonic()
        self._due = -math.inf  # when step_done next does its periodic work (_periodic)
        self._warned_aside = False
        self.metrics: Any = None  # the TenantMetrics observer, once enabled
        if config.metrics == "on":
            self._import_metrics()  # VTC_METRICS=on without prometheus_client: fail now
        self.metrics_decided = False  # enable_metrics was called: a second call returns it
        #: the shared counters (:class:`vtc.sharing.SharedCounterSync`) once started
        self.sharing: Any = None
        self.sharing_decided = False
        #: the locality window's lookup (:meth:`set_prefix_lookup`), or None
        self.prefix_lookup: PrefixLookup | None = None
        self._lookup_source = ""
        #: held through each scheduling pass (:meth:`selecting`); the shared counters'
        #: background sync raises counters only while it is free (else the pass applies
        #: them at its edges), so no pass sees its order change between a peek and the
        #: pop that follows
        self.selection_lock = threading.RLock()

    @property
    def config(self) -> EngineConfig:
        """The configuration in force: :class:`Tenancy`'s, which a weights reload
        replaces (one copy, so nothing can read stale weights)."""
        return self.tenancy.config

    def set_prefix_lookup(
        self,
        cached: Callable[[Any], int] | None,
        source: str = "the engine's prefix cache",
        *,
        unused: str | None = None,
    ) -> PrefixLookup | None:
        """Feed the locality window (``VTC_LOCALITY_QUANTUM``): ``cached(request)``
        says how many leading tokens of a waiting request (the engine's object) the
        engine holds cached now (:class:`PrefixLookup` keeps it within the core's
        contract and never lets it raise). Installed on the core only with a
        quantum above 0 (at 0 the core never asks, and nothing is installed);
        ``None`` removes it (plain VTC). ``source`` names it in :meth:`describe`.
        ``unused``: why the engine cannot answer (its prefix cache is off, say):
        nothing is installed, and with a quantum above 0 a warning names the
        variable as unused for that reason, so each engine shell keeps only its own
        check. Returns the installed lookup, or None."""
        q = self.config.locality_quantum
        if cached is None or unused is not None or q <= 0.0:
            if unused is not None and q > 0.0:
                self._log.warning(
                    "VTC: VTC_LOCALITY_QUANTUM=%g is unused: %s; VTC orders by counter alone",
                    q,
                    unused,
                )
            self.core.set_prefix_lookup(None)
            self.prefix_lookup = None
            return None
        lookup = PrefixLookup(self.requests, cached, self._log)
        self.core.set_prefix_lookup(lookup)
        self.prefix_lookup, self._lookup_source = lookup, source
        return lookup

    @property
    def pass_guards_order(self) -> bool:
        """Whether a scheduling pass (:meth:`selecting`) keeps the queue's answers
        from changing under the engine: with shared counters (their background
        sync held off from a peek to its pop) or a prefix lookup (frozen: one
        answer per request a pass). Without either the core's answers are the same
        with or without a pass, so an engine that asks the core directly (vLLM's
        queue; not the table's kept head, which SGLang's shell reads, and which
        only a pass keeps) may skip it: its lock, ``with`` and writes were ~10 µs
        of vLLM's step (bench/README.md, 46)."""
        return self.sharing is not None or self.prefix_lookup is not None

    def selecting(self) -> SchedulingPass:
        """An engine scheduling pass (its peeks and pops), as a context manager. Within
        it the order of the queue changes only by the engine's own calls: a shared
        counters' background sync that finds :attr:`selection_lock` held does not
        wait; it leaves its counter raises to the pass, which applies them at its
        start or end (vLLM peeks a request, works on it, then pops, and must pop the
        one it peeked). The prefix lookup, if any, answers each request once
        (:meth:`PrefixLookup.freeze`)."""
        return SchedulingPass(self)

    def set_priority_order(self, order: int | None) -> None:
        """How the engine orders request priorities: 1 (smaller values first), -1
        (larger first), None (priorities ignored: every request in band 0). The
        core's band of a request is ``order * priority``, so under
        ``VTC_PRIORITY_WEIGHTS`` the core weighs band ``order * p`` as the
        configured priority ``p``. Cheap when nothing changed."""
        weights = self.config.priority_weights
        wanted = (
            None if weights is None or order is None else {order * p: w for p, w in weights.items()}
        )
        if wanted != self.core.band_weights():
            self.core.set_band_weights(wanted)

    def describe_priorities(self, order: int | None) -> str:
        """How request priorities are treated, for the start-up log line."""
        weights = self.config.priority_weights
        if order is None:
            if weights is not None:
                return "the engine ignores request priorities, so VTC_PRIORITY_WEIGHTS is unused"
            return ""
        if weights is None:
            return "request priorities are strict bands, fair shares inside each"
        shown = ", ".join(f"{p}={w:g}" for p, w in sorted(weights.items()))
        return f"request priorities are weighted bands ({shown}; others 1), fair shares inside each"

    def start_sharing(self, *, ranks: int = 1, suffix: str = "") -> Any:
        """Share the counters through Redis if ``config.shared`` says so (``VTC_REDIS_URL``):
        the engine calls this once, in the process that schedules, before anything is
        charged. Returns the :class:`vtc.sharing.SharedCounterSync`, or None.

        ``ranks``: scheduler processes that mirror one another's decisions (SGLang's
        tensor/pipeline-parallel ranks). Counters pulled at different moments would make
        them decide differently, so with more than one nothing is shared (logged).
        ``suffix`` is appended to ``VTC_REPLICA_ID`` (vLLM's data-parallel ranks share one
        environment, and each is a replica of its own).
        """
        if self.sharing_decided:
            return self.sharing
        self.sharing_decided = True
        settings = self.config.shared
        if settings is None:
            return None
        if ranks > 1:
            self._log.error(
                "VTC: shared counters (VTC_REDIS_URL) need one scheduler per replica; this "
                "one runs on %d mirrored ranks, so counters stay local",
                ranks,
            )
            return None
        from vtc import distributed
        from vtc.sharing import SharedCounterSync

        replica = f"{settings.replica_id}{suffix}" if settings.replica_id else None
        shared = distributed.from_settings(settings, replica_id=replica)
        sync = SharedCounterSync(
            self.core,
            shared,
            background=shared.mode == "background",
            interval_ms=shared.sync_ms,
            log=self._log,
            guard=self.selection_lock,
        )
        self.observers.append(sync)
        self.sharing = sync
        self._log.info("VTC: %s", sync.describe())
        for note in settings.ignored:
            self._log.warning("VTC: %s", note)
        return sync

    def close(self) -> None:
        """The engine shuts down: a last sync of the shared counters (if any)."""
        if self.sharing is not None:
            self.sharing.close()

    def arrive(
        self,
        key: Hashable,
        request: Any,
        fields: Iterable[Any],
        prompt_len: int,
        priority: int = 0,
    ) -> Tracked:
        """A new request: bill it to the tenant its ``fields`` name, and submit it
        in band ``priority`` (smaller is more urgent)."""
        tenant = self.tenancy.arrive(fields)
        return self.requests.submit(key, request, tenant, prompt_len, priority)

    def enqueue(
        self,
        key: Hashable,
        request: Any,
        fields: Iterable[Any],
        prompt_len: int,
        *,
        charged: int = 0,
        priority: int = 0,
    ) -> Tracked:
        """The engine put a request in its waiting queue. One the core holds as
        running or set aside is put back (:meth:`Requests.put_back`: it keeps its
        band); one already waiting stays; any other arrives (:meth:`arrive`) in band
        ``priority``, with ``charged`` generated tokens it is not charged for (its
        output from before)."""
        requests = self.requests
        t = requests.get(key)
        if t is not None:
            state = requests.status(t)
            if state in (WAITING, RUNNING, ASIDE):
                requests.put_back(t, state)
                return t
            requests.release(key)
        t = self.arrive(key, request, fields, prompt_len, priority)
        t.charged = charged
        return t

    def enable_metrics(
        self, *, served: bool, budget: int | None, hint: str = "", registry: Any = None
    ) -> Any:
        """Add the per-tenant Prometheus series (:class:`vtc.metrics.TenantMetrics`)
        as an observer if ``config.metrics`` asks for them: ``on``, or ``auto`` when
        the engine ``served`` this process's metrics. Returns the observer, or None
        (decided once: a later call returns the first answer).

        ``budget`` is the KV budget of the fairness bound; ``hint`` says how to
        serve them, logged when they are on but not ``served``. ``on`` without
        prometheus_client raises :class:`vtc.config.ConfigError`.
        """
        if self.metrics_decided:
            return self.metrics
        self.metrics_decided = True
        mode = self.config.metrics
        if mode == "off" or (mode == "auto" and not served):
            return None
        try:
            TenantMetrics = self._import_metrics()
        except ConfigError:
            self._log.info("VTC: no per-tenant metrics: prometheus_client is not installed")
            return None
        metrics = TenantMetrics(
            registry,
            max_tenants=self.config.metrics_max_tenants,
            interval=self.config.metrics_interval,
            relabel_interval=self.config.metrics_relabel_interval,
            budget=budget,
        )
        if not served:
            self._log.warning("VTC_METRICS=on, but the engine does not serve them: %s", hint)
        self.observers.append(metrics)
        self.metrics = metrics
        return metrics

    @staticmethod
    def _import_metrics() -> Any:
        try:
            from vtc.metrics import TenantMetrics
        except ImportError as e:
            raise ConfigError(
                f"VTC_METRICS needs prometheus_client ({e}): pip install 'vtc[metrics]'"
            ) from None
        return TenantMetrics

    def describe(self, budget: int | None = None) -> str:
        """The settings in one line, for the engine's start-up log; ``budget``: the
        engine's KV budget when the core's ``M`` is not it (SGLang keeps its own)."""
        c = self.config
        line = (
            f"M={self.core.M if budget is None else budget} tokens, wp={c.wp:g}, wq={c.wq:g}, "
            f"tenant key {c.tenant_key!r}, weights {dict(c.weights) or 'all 1'}"
        )
        if c.locality_quantum > 0.0:
            line += f"; locality window Q={c.locality_quantum:g} weighted tokens " + (
                f"over {self._lookup_source}"
                if self.prefix_lookup is not None
                else "unused (no prefix-cache lookup: plain VTC)"
            )
        if self.sharing is not None:
            line += "; " + self.sharing.describe()
        return line

    def step_done(self) -> None:
        """The engine finished a step: the periodic work when it is due (the weights
        file's check, the log line: :meth:`_periodic`), then the observers (the trace
        writes a record if its interval has passed), then a warning, once, if a
        request the engine skipped was not put back.

        (Every step: one clock read against one deadline, the observers' list and
        the requests set aside; no frame for ``config``, ``maybe_log`` or
        ``num_aside``. The whole call is at most ~4 µs of vLLM's step, and what the
        deadline saved measured inside the noise: bench/README.md 46.)"""
        if time.monotonic() >= self._due:
            self._periodic()
        if self.observers:
            self.observers.notify("stepped", self)
        if self.requests._aside and not self._warned_aside:
            # An engine puts back every request it skips within the step.
            self._warned_aside = True
            self._log.warning(
                "VTC: %d skipped request(s) not put back in the waiting queue",
                self.requests.num_aside,
            )

    def _periodic(self) -> None:
        """:meth:`step_done`'s periodic work: the weights file checked
        (:meth:`Tenancy.reload_weights`, every ``weights_reload`` seconds) and the
        log line written (:meth:`maybe_log`, every ``log_interval`` seconds), each
        when its time has come; then the next time either may (``_due``; never for
        neither). Never later than either's own next time: each only moves its own
        later, and each is asked again here."""
        tenancy = self.tenancy
        config = tenancy.config
        due = math.inf
        if config.weights_file is not None:
            tenancy.reload_weights()
            if config.weights_reload > 0:
                due = tenancy._next_check
        interval = config.log_interval
        if interval > 0:
            self.maybe_log()
            due = min(due, self._last_log + interval)
        self._due = due

    def maybe_log(self) -> bool:
        """Log the tenant counters if ``config.log_interval`` seconds have passed
        (never with an interval of 0); whether it logged."""
        interval = self.config.log_interval
        now = time.monotonic()
        if interval <= 0 or now - self._last_log < interval:
            return False
        self._last_log = now
        counters = self.tenancy.counters()
        if not counters:
            return False
        waiting, running = self.requests.by_tenant()
        line = format_counters(counters, self.tenancy.services(), waiting, running)
        self._log.info("VTC tenant counter (service) waiting/running: %s", line)
        return True
