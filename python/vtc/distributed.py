"""VTC across engine replicas: counters shared through Redis.

Every replica keeps its own :class:`vtc.Scheduler` and makes every decision
locally; a :class:`SharedCounters` object next to it keeps each tenant's
counter *global*: the sum of the weighted service every replica charged the
tenant, plus the lifts.  Every ``sync_interval`` engine steps (or ``sync_ms``
milliseconds) the replica makes **one round trip** to the store (a Lua script
on Redis) that

1. pushes the service the replica charged since its last acknowledged sync,
   per tenant, numbered (the store keeps what it applied since then, so a
   request whose reply was lost, or one that is duplicated, is counted
   exactly once);
2. updates which tenants have requests waiting on this replica; a tenant that
   becomes backlogged on its first replica is lifted, in the store, to the
   *global floor*: the least counter of the globally backlogged tenants (a
   sorted set), or the counter of the tenant that last left the backlog;
3. reaps replicas that have not synced for ``liveness_ms`` (their waiting
   tenants stop holding the floor down; what they charged stays counted), and
   forgets the counters of tenants no replica has had waiting or charged for
   ``forget_ms`` whose counter is at most the global floor (their return would
   lift them to the floor anyway), so the store follows the live tenants, not
   every tenant ever seen;
4. pulls the global floor, the global counters of the tenants that arrived
   here or that it just charged, and those of the tenants waiting here that
   were written since the counter version of the last reply it received (a
   delta; plus a small scrub batch of its waiting set).  A full sync (the
   first, and after any fault) pulls every waiting tenant's.

The replica then lifts each pulled tenant's local counter to
``global + local charges since the snapshot`` with ``raise_counter`` (which
never lowers), so between syncs it schedules on ``global + unsynced local``.

Faults: any store error puts the synchronizer in *degraded* mode: the
scheduler simply keeps running as a local VTC (nothing is blocked or
dropped; the only time spent is one socket timeout per ``retry_ms``).  When
the store answers again the next sync reconciles: it pushes what was charged
meanwhile and sends the whole waiting set, in which a tenant that waited here
all along keeps its counter (only tenants new here are lifted), so a deficit
survives an outage of any length.  A Redis that lost its data gets a new
*epoch*; every live replica then re-sends its state, and a tenant without a
counter is restored from the replica's own.  A replica that dies loses at
most what it charged since its last sync.  Stored values that are not
counters are repaired, never used (``docs/distributed.md``).

Wiring an engine (this is all an integration needs)::

    shared = vtc.distributed.from_env()          # None unless VTC_REDIS_URL is set
    ...
    if shared: shared.submit(sched, rid, tenant, prompt_len)   # lift + submit + track
    else:      sched.submit(rid, tenant, prompt_len)
    ...                                          # once per engine step:
    if shared: shared.on_step(sched)
    ...                                          # instead of sched.forget_idle():
    if shared: shared.forget_idle(sched)

or ``shared.start(sched)`` to sync from a background thread instead of
``on_step``.  Without ``VTC_REDIS_URL`` nothing here is imported by the
single-replica path and nothing changes.

:class:`LocalStore` is an in-process twin of the Redis script (same
semantics, as :mod:`vtc.reference` is to the core); the simulator uses it for
speed and ``tests/redis`` checks that both give identical runs.  The
multi-replica engine model that does is :mod:`vtc.sim.replicas`; this module
keeps the sync and the bound it guarantees (:func:`staleness_bound`,
:func:`drift_bound`), :mod:`vtc.store` the store's protocol and
:class:`LocalStore`, :mod:`vtc.redis_store` the script and :class:`RedisStore`
(all re-exported here); none of them imports anything of :mod:`vtc.sim`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import chain
from typing import TYPE_CHECKING, Any, Callable, Protocol, TypeVar, Union

from vtc._core import MAX_COUNTER, Scheduler, SyncLedger
from vtc.config import DEFAULT_SYNC_CPU_SHARE, DEFAULT_SYNC_MS, SYNC_CHANGES_READER
from vtc.redis_store import SYNC_LUA, RedisStore, check_namespace, glob_escape
from vtc.store import (
    FORGET_BATCH,
    KEEP_MS,
    Client,
    LocalStore,
    Store,
    SyncReply,
    SyncRequest,
    _decode_all,
    _encode_all,
    decode,
    encode,
    stored_number,
)

if TYPE_CHECKING:
    from vtc.config import SharedCounterSettings

__all__ = [
    "CORE_WAITING",
    "FORGET_BATCH",
    "KEEP_MS",
    "SYNC_LUA",
    "Client",
    "LocalStore",
    "RedisStore",
    "SchedulerLike",
    "SharedCounters",
    "Store",
    "SyncReply",
    "SyncRequest",
    "SyncStats",
    "check_namespace",
    "decode",
    "drift_bound",
    "encode",
    "from_env",
    "from_settings",
    "glob_escape",
    "staleness_bound",
    "stored_number",
]

log = logging.getLogger("vtc.distributed")

_T = TypeVar("_T")

ENV_URL = "VTC_REDIS_URL"
ENV_NAMESPACE = "VTC_REDIS_NAMESPACE"
ENV_SYNC_INTERVAL = "VTC_SYNC_INTERVAL"
ENV_SYNC_MS = "VTC_SYNC_MS"
ENV_REPLICA = "VTC_REPLICA_ID"
ENV_TIMEOUT_MS = "VTC_REDIS_TIMEOUT_MS"


class SchedulerLike(Protocol):
    """The part of :class:`vtc.Scheduler` the synchronizer uses (all thread-safe in the core)."""

    def services(self) -> dict[Client, float]: ...  # noqa: D102
    def service(self, client: Client) -> float: ...  # noqa: D102
    def counter(self, client: Client) -> float: ...  # noqa: D102
    def raise_counter(self, client: Client, value: float) -> None: ...  # noqa: D102
    def raise_counters(self, counters: dict[Client, float]) -> int: ...  # noqa: D102
    def forget_idle(self) -> int: ...  # noqa: D102
    def status(self, request_id: int) -> str | None: ...  # noqa: D102
    def submit(  # noqa: D102
        self, request_id: int, client: Client, prompt_len: int, cached_len: int | None = None
    ) -> None: ...


# --------------------------------------------------------------------------- the synchronizer
@dataclass
class SyncStats:
    """What a :class:`SharedCounters` did: syncs, round trips, failures, degraded state.

    ``skipped``: pulled values that were no counter (left unused). ``renamed``:
    times the store refused this replica's id as another live process's, so
    that it went on under an id of its own. ``feed_reads``, ``feed_full_reads``,
    ``feed_rows``: reads of the core's change feed, how many of them were full, and
    the tenants they returned (changed and gone): what the syncs read of the core.
    ``cpu_seconds``: the CPU time (``time.thread_time``) of the threads that ran
    :meth:`SharedCounters.sync`, spent in it; in the background it bounds what the
    syncs took from the engine thread (the interpreter lock is held for at most it).
    ``stretched``: pauses of the background thread made longer than its period, so
    that its syncs' CPU stays within ``cpu_share`` of the time.
    """

    syncs: int = 0
    round_trips: int = 0
    failures: int = 0
    resyncs: int = 0
    full_syncs: int = 0
    pushed_tenants: int = 0
    pulled_tenants: int = 0
    skipped: int = 0
    renamed: int = 0
    feed_reads: int = 0
    feed_full_reads: int = 0
    feed_rows: int = 0
    cpu_seconds: float = 0.0
    stretched: int = 0
    last_error: str | None = None


def _unreachable(err: BaseException) -> bool:
    """Whether ``err`` says the store could not be reached (not that it answered wrongly)."""
    try:
        from redis.exceptions import ConnectionError as Refused
        from redis.exceptions import TimeoutError as TimedOut
    except ImportError:  # a store of another kind
        return isinstance(err, OSError)
    return isinstance(err, (OSError, Refused, TimedOut))


class _CoreWaiting:
    """The type of :data:`CORE_WAITING`."""

    def __repr__(self) -> str:
        return "CORE_WAITING"


#: ``waiting=CORE_WAITING`` (``sync``, ``on_step``, ``start``): the tenants with requests
#: waiting in the core (set-aside ones included), followed through its change feed: per
#: sync only the tenants whose counts changed (without the feed: ``active_clients()``)
CORE_WAITING = _CoreWaiting()

Waiting = Union[Iterable[Client], _CoreWaiting, None]


class SharedCounters:
    """Keeps one replica's :class:`vtc.Scheduler` counters global, through a :class:`Store`.

    ``sync_interval``: engine steps between syncs (``on_step``); ``sync_ms``,
    when set, also syncs once that many milliseconds passed (whichever comes
    first).  ``liveness_ms``: a replica that has not synced for that long is
    considered dead and its waiting tenants leave the global backlog.
    ``retry_ms``: after a failure the store is not tried again for that long
    (the scheduler runs as a local VTC meanwhile). ``forget_ms``: the store
    forgets the counter of a tenant no replica has had waiting or charged for
    that long once it is at most the global floor (it would return to the
    floor anyway): the store's memory follows the live tenants.  ``cpu_share``: the
    background thread (:meth:`start`) pauses long enough after each sync that its
    syncs' CPU is at most this share of the time.  ``replica_id`` names this
    replica; it must be unique among live replicas (the default is
    host-pid-random). A restarted replica may keep its id: the store tells
    incarnations apart. Two live ones with one id are told apart too: the
    older is refused at its next sync and renames itself (logged as an error;
    ``stats.renamed``).

    One object serves one scheduler, attached at the first call that passes
    it (or :meth:`attach`): the service that scheduler already holds then (a
    scheduler restored from a snapshot) counts as already in the store, so
    a restart never counts it twice. Service charged since then is pushed as
    it accrues, exactly once, also across :meth:`forget_idle`.
    """

    CORE_WAITING = CORE_WAITING

    def __init__(
        self,
        store: Store,
        *,
        replica_id: str | None = None,
        sync_interval: int = 10,
        sync_ms: float | None = None,
        liveness_ms: int = 10_000,
        retry_ms: float = 1000.0,
        forget_ms: int = 60_000,
        cpu_share: float = DEFAULT_SYNC_CPU_SHARE,
        clock: Callable[[], float] | None = None,
        delta: bool = True,
        feed: bool = True,
    ) -> None:
        if isinstance(sync_interval, bool) or not isinstance(sync_interval, int):
            raise TypeError(f"sync_interval must be an int, got {sync_interval!r}")
        if sync_interval < 1:
            raise ValueError(f"sync_interval must be >= 1, got {sync_interval}")
        self.store = store
        default_id = f"{os.uname().nodename}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.replica_id = replica_id or default_id
        self.sync_interval = sync_interval
        self.sync_ms = sync_ms
        if isinstance(forget_ms, bool) or not isinstance(forget_ms, int) or forget_ms < 0:
            raise ValueError(f"forget_ms must be an int >= 0, got {forget_ms!r}")
        if isinstance(cpu_share, bool) or not isinstance(cpu_share, (int, float)):
            raise TypeError(f"cpu_share must be a number in (0, 1], got {cpu_share!r}")
        if not 0.0 < cpu_share <= 1.0:  # False for nan
            raise ValueError(f"cpu_share must be in (0, 1], got {cpu_share!r}")
        self.cpu_share = float(cpu_share)
        self.liveness_ms = liveness_ms
        self.retry_ms = retry_ms
        self.forget_ms = forget_ms
        self.clock = clock or (lambda: time.monotonic() * 1000)
        self.stats = SyncStats()
        #: pull only the counters written since the last acknowledged sync (False: every
        #: waiting tenant's, as before versions; for replicas sharing a store with an
        #: older vtc nothing needs setting, the store detects them)
        self.delta = delta
        #: read the services (and, with ``waiting=CORE_WAITING``, the waiting set) from
        #: the core's change feed (``Scheduler.changes``, slot
        #: :data:`vtc.config.SYNC_CHANGES_READER`): per sync only the tenants changed
        #: since the last read (False, or a scheduler without ``changes``: every
        #: tenant's service, one ``services()`` call, as before; also for anything not a
        #: ``vtc.Scheduler`` itself, e.g. a wrapper)
        self.feed = feed
        self._feeding = False  # the scheduler has a feed and it is read
        self._fwait: set[Client] = set()  # waiting in the core, per the feed
        self._fdirty: set[Client] = set()  # may be in _fwait xor _acked_wait
        self._fleft: set[Client] = set()  # left the waiting set at a look since the ack
        self._wmode_feed = False  # the last sync took its waiting set from the feed
        self.degraded = False
        self.floor: float | None = None
        self._incarnation = uuid.uuid4().hex
        self._epoch: str | bytes = ""
        self._full = True
        self._seq = 0
        self._acked_seq = 0
        self._scheduler: SchedulerLike | None = None
        #: with the change feed: the core's ledger of the service folded since the last
        #: acknowledged sync, by tenant, and of the tenants waiting at the last read
        #: (``vtc._core.SyncLedger``, on the feed's slot); without: the two dicts below
        self._ledger: SyncLedger | None = None
        self._seen: dict[Client, float] = {}  # the scheduler's service() when last folded
        #: service folded since the last acknowledged sync, by tenant (encoded at the push)
        self._unacked: dict[Client, float] = {}
        self._acked_wait: set[Client] = set()
        self._continuous: set[Client] = set()  # waiting here in every look since that sync
        self._since = 0  # the counter version of the last acknowledged reply (0: none)
        self._cursor = "0"  # where the store's scrub of this replica's waiting set goes on
        self._retry_at: float | None = None
        self._steps = 0
        self._last_sync = self.clock()
        self._queues: dict[Client, deque[int]] = {}
        self._lock = threading.Lock()  # tracking (submit thread) vs sync (engine/background)
        self._sync_lock = threading.RLock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._loop_error_logged = False
        #: an engine's scheduling-pass lock (:meth:`vtc.adapter.Adapter.selecting`), or
        #: None: a sync raises counters only while it can take the lock at once, else
        #: it leaves them to :meth:`apply_deferred`, which the engine calls with the lock
        #: held, so counters pulled in the background never reorder the queue between
        #: the engine's peek and its pop, and a sync never waits for a pass (nor a
        #: pass for a sync's I/O: the lock is never held by a sync during I/O)
        self.guard: Any = None
        self._deferred: dict[Client, float] = {}
        self._defer_lock = threading.Lock()  # no I/O and no other lock taken under it
        #: how an engine integration syncs (``VTC_SYNC_MODE``): "background" or "step"
        self.mode = "background"
        #: seconds each sync attempt took (its round trips), newest last; the metrics
        #: (``vtc_sync_seconds``) take them from the left
        self.durations: deque[float] = deque(maxlen=4096)

    # -- the scheduler it serves ------------------------------------------------------------
    def attach(self, scheduler: SchedulerLike) -> None:
        """Serve ``scheduler``: what it was charged so far counts as already in the store.

        Called by the first method that is passed a scheduler; idempotent.
        Raises ``ValueError`` for a second, different scheduler.
        """
        if self._scheduler is scheduler:
            return
        with self._sync_lock:
            if self._scheduler is None:
                # only a core itself: a wrapper may change what services() says
                self._feeding = self.feed and isinstance(scheduler, Scheduler)
                if self._feeding:
                    # the slot starts again: the first read is full (and its services
                    # are compared with these, so what was charged before counts as in)
                    self._ledger = SyncLedger(SYNC_CHANGES_READER)
                    self._ledger.reset(scheduler)  # type: ignore[arg-type]
                else:
                    self._seen = dict(scheduler.services())
                self._scheduler = scheduler
            elif self._scheduler is not scheduler:
                raise ValueError(
                    "this SharedCounters already serves another scheduler; "
                    "use one SharedCounters per scheduler"
                )

    def _fold(self, scheduler: SchedulerLike) -> Mapping[Client, float]:
        """Move the service charged since the last fold into the unacknowledged amounts.

        With the change feed (:attr:`feed`): the core's ledger reads only the
        tenants changed since the last read (:meth:`_read_feed`); otherwise every
        tenant's service (one core call) compared with the last reading (~65 ns a
        tenant).  The rest of the per-tenant work is only for the tenants whose
        service changed (:meth:`fold_changed`).  Returns every tenant's service at
        the fold (with the feed: nothing, the ledger keeps it).
        """
        if self._feeding:
            self._read_feed(scheduler)
            return {}
        snap = scheduler.services()
        seen = self._seen
        self.fold_changed([(c, v) for c, v in snap.items() if seen.get(c) != v])
        self._seen = snap
        return snap

    def fold_changed(self, changed: Iterable[tuple[Client, float]]) -> None:
        """Fold ``(tenant, service now)`` for the tenants whose service changed.

        The seam for a core call returning the services changed since the last
        read (then :meth:`_fold` need not read every tenant's). A tenant's
        ``service()`` only grows, except when the scheduler forgot it: a
        smaller value then is all new (:meth:`forget_idle` folds first, so no
        service is lost even when the new value has grown past the old one).
        Updates what was seen only for these tenants.
        """
        with self._sync_lock:
            seen, unacked = self._seen, self._unacked
            for c, v in changed:
                d = v - seen.get(c, 0.0)
                seen[c] = v
                if d < 0:
                    d = v
                if d > 0:
                    unacked[c] = unacked.get(c, 0.0) + d

    def _read_feed(self, scheduler: SchedulerLike) -> None:
        """One read of the change feed: fold the services changed, follow the waiting set.

        The core's ledger (``vtc._core.SyncLedger``) folds the service of the tenants
        changed since the last read into their unacknowledged amounts (the rule of
        :meth:`fold_changed`; a tenant forgotten by ``forget_idle`` and back counts
        its new service in full) and returns only the tenants whose waiting state
        changed, so this Python is per change of the waiting set, not per tenant
        charged.  A full read (the first, or after a reset) returns every waiting
        tenant.
        """
        with self._sync_lock:
            ledger = self._ledger
            assert ledger is not None
            full, entered, left, idle, gone, rows = ledger.read(
                scheduler,  # type: ignore[arg-type]
                bool(self._queues),
            )
            fwait, fdirty, fleft = self._fwait, self._fdirty, self._fleft
            self.stats.feed_reads += 1
            self.stats.feed_full_reads += full
            self.stats.feed_rows += rows
            if full:
                now = set(entered)
                fdirty |= now ^ self._acked_wait
                fleft |= self._acked_wait - now
                self._fwait = now
            else:
                for c in left:  # forgotten ones first, as the ledger listed them
                    if c in fwait:
                        fwait.discard(c)
                        fdirty.add(c)
                        fleft.add(c)
                for c in entered:
                    if c not in fwait:
                        fwait.add(c)
                        fdirty.add(c)
            if self._queues:  # tracked requests of tenants with nothing waiting: done
                with self._lock:
                    for c in chain(gone, idle):
                        self._queues.pop(c, None)

    def unsynced(self, scheduler: SchedulerLike, client: Client) -> float:
        """Service of ``client`` charged here that the store has not acknowledged."""
        with self._sync_lock:
            self.attach(scheduler)
            ledger = self._ledger
            if ledger is not None:
                local = scheduler.service(client) - (ledger.seen(client) or 0.0)
                return ledger.unacked_of(client) + max(local, 0.0)
            local = scheduler.service(client) - self._seen.get(client, 0.0)
            return self._unacked.get(client, 0.0) + max(local, 0.0)

    def forget_idle(self, scheduler: SchedulerLike) -> int:
        """``scheduler.forget_idle()`` without losing service the store has not seen yet.

        Integrations call this instead of the scheduler's own: it folds the
        service charged so far first (:meth:`before_forget`), so a tenant
        forgotten and served again is counted in full.
        """
        with self._sync_lock:
            self.before_forget(scheduler)
            n = scheduler.forget_idle()
            if n and self._feeding:
                self._read_feed(scheduler)  # the forgotten come back as gone
            elif n:
                live = scheduler.services()
                self.forgot([c for c in self._seen if c not in live])
            return n

    def before_forget(self, scheduler: SchedulerLike) -> None:
        """The scheduler is about to forget idle tenants: read what it charged them."""
        with self._sync_lock:
            self.attach(scheduler)
            self._fold(scheduler)

    def forgot(self, clients: Iterable[Client]) -> None:
        """The scheduler forgot ``clients``: their service starts again from 0."""
        clients = list(clients)
        with self._sync_lock:
            if self._ledger is not None:
                self._ledger.forget(clients)
            for c in clients:
                self._seen.pop(c, None)
        with self._defer_lock:  # a raise left for the next pass is not for them now
            for c in clients:
                self._deferred.pop(c, None)

    # -- request tracking and the pre-submit lift ---------------------------------------------
    def track(self, request_id: int, client: Client) -> None:
        """Remember that ``request_id`` of ``client`` was submitted (for the waiting set)."""
        with self._lock:
            self._queues.setdefault(client, deque()).append(request_id)

    def lift(self, scheduler: SchedulerLike, client: Client) -> None:
        """Lift ``client`` to the last global floor seen if it has nothing waiting here.

        This is the global form of VTC's lift, applied before the local one
        (which only sees this replica's backlog).  It costs no I/O.
        """
        self.attach(scheduler)
        if self.floor is None:
            return
        with self._lock:
            q = self._queues.get(client)
            idle = not q
        if idle:
            scheduler.raise_counter(client, self.floor)

    def submit(
        self,
        scheduler: SchedulerLike,
        request_id: int,
        client: Client,
        prompt_len: int,
        cached_len: int | None = None,
    ) -> None:
        """``lift`` + ``scheduler.submit`` + ``track``: the one call an integration makes."""
        self.lift(scheduler, client)
        scheduler.submit(request_id, client, prompt_len, cached_len)
        self.track(request_id, client)

    def waiting(self, scheduler: SchedulerLike) -> set[Client]:
        """Tenants with tracked requests still waiting in ``scheduler``.

        Each tenant's tracked ids are dropped from the front while they are no
        longer waiting (admission is FIFO per tenant), so the cost is the
        number of tenants plus the requests admitted since the last call.
        """
        out: set[Client] = set()
        with self._lock:
            for client in list(self._queues):
                q = self._queues[client]
                while q and scheduler.status(q[0]) != "waiting":
                    q.popleft()
                if q:
                    out.add(client)
                else:
                    del self._queues[client]
        return out

    # -- syncing ------------------------------------------------------------------------------
    def on_step(
        self,
        scheduler: SchedulerLike,
        waiting: Waiting | Callable[[], Iterable[Client]] = None,
    ) -> bool:
        """Call once per engine step; syncs when ``sync_interval`` steps (or ``sync_ms``) passed.

        ``waiting`` as for :meth:`sync`, or a function returning it, called only
        when a sync is due (the steps in between then cost no per-tenant work).
        Returns whether a sync succeeded in this call.  Never raises a store error.
        """
        self._steps += 1
        due = self._steps >= self.sync_interval
        if not due and self.sync_ms is not None:
            due = self.clock() - self._last_sync >= self.sync_ms
        if not due:
            return False
        self._steps = 0
        self._last_sync = self.clock()
        if callable(waiting):
            waiting = waiting()
        return self.sync(scheduler, waiting)

    def sync(self, scheduler: SchedulerLike, waiting: Waiting = None) -> bool:
        """One push + pull round trip now (two if the store asks for a full resync).

        ``waiting`` overrides the tracked waiting set (an engine that knows its
        queues can pass the tenants it has waiting).  On a store error, or a
        reply that is not what the store sends, the scheduler is left as it is
        (a local VTC) and ``False`` is returned: this never raises for
        anything the store holds or answers.

        The per-tenant Python work follows the changes, not the waiting
        tenants: arrivals and departures (set differences, in C), the tenants
        whose service changed (:meth:`_fold`) and the counters the store
        returns (those written since the version acknowledged last, plus a
        small scrub batch).  A sync after any fault, or the first, is full.
        With the change feed and ``waiting=CORE_WAITING`` none of it reads
        every tenant: the services and waiting counts come from the tenants
        changed since the last read (:meth:`_read_feed`).
        """
        with self._sync_lock:
            cpu = time.thread_time()
            try:
                return self._sync_locked(scheduler, waiting)
            finally:
                self.stats.cpu_seconds += time.thread_time() - cpu

    def _sync_locked(self, scheduler: SchedulerLike, waiting: Waiting) -> bool:
        """:meth:`sync`, with ``_sync_lock`` held."""
        self.attach(scheduler)
        now = self.clock()
        feed_wait = isinstance(waiting, _CoreWaiting)
        if feed_wait and not self._feeding:
            waiting = [c for c, (w, _) in scheduler.active_clients().items() if w]  # type: ignore[attr-defined]
            feed_wait = False
        if self._feeding:
            snap = self._fold(scheduler)  # every look reads the feed (the waiting set)
        if feed_wait != self._wmode_feed:  # the waiting set's source changed
            if feed_wait:
                self._fdirty = self._fwait ^ self._acked_wait
                self._fleft = self._acked_wait - self._continuous
            else:
                self._continuous = self._acked_wait - self._fleft
            self._wmode_feed = feed_wait
        if feed_wait:
            wait = self._fwait  # kept by the feed reads; not changed until the next
        else:
            wait = set(waiting) if waiting is not None else self.waiting(scheduler)  # type: ignore[arg-type]
            self._continuous &= wait
        if self._retry_at is not None and now < self._retry_at:
            return False
        if not self._feeding:
            snap = self._fold(scheduler)
        began = time.perf_counter()
        try:
            reply, pull = self._round_trip(scheduler, wait, feed_wait)
            for _ in range(2):  # at most: refused as a duplicate, then a resync
                if reply.status == "duplicate":
                    self._rename()
                elif reply.status == "resync":
                    self.stats.resyncs += 1
                    self._full = True
                else:
                    break
                reply, pull = self._round_trip(scheduler, wait, feed_wait)
            if reply.status != "ok":
                raise RuntimeError(f"store answered {reply.status!r} to a full sync")
            if len(reply.counters) != len(pull):
                raise RuntimeError(
                    f"store answered {len(reply.counters)} counters for {len(pull)} pulled"
                )
            if self.delta and (
                isinstance(reply.version, bool)
                or not isinstance(reply.version, int)
                or reply.version < 0
            ):
                raise RuntimeError(f"store answered version {reply.version!r}")
            pulled = 0
            if self._ledger is not None:  # this reply's counters, or none (read here:
                # one that cannot be read is a store fault, before anything is acked)
                pulled = self._ledger.take_changed(*(reply.changed_raw or (b"{}", b"")))[0]
        except Exception as e:  # noqa: BLE001 - any store fault means: schedule locally
            self.durations.append(time.perf_counter() - began)
            self._fail(now, e)
            return False
        self.durations.append(time.perf_counter() - began)
        if self.degraded:
            log.warning("vtc: shared counters reachable again; state reconciled")
        self.degraded = False
        self._retry_at = None
        self._epoch = reply.epoch
        self._full = False
        self._acked_seq = self._seq
        if self._ledger is not None:
            self._ledger.acknowledge()
        self._unacked = {}
        if feed_wait:  # the acknowledged set follows the changes only
            acked, fwait = self._acked_wait, self._fwait
            for c in self._fdirty:
                if c in fwait:
                    acked.add(c)
                else:
                    acked.discard(c)
            self._fdirty.clear()
            self._fleft.clear()
        else:
            self._acked_wait = wait
            self._continuous = set(wait)
        self._since = reply.version or 0
        self._cursor = reply.cursor
        self.floor = reply.floor
        self.stats.syncs += 1
        got = dict(reply.changed)
        for key, g in zip(pull, reply.counters):
            if g is not None:
                got[key] = g
        self.stats.pulled_tenants += len(got) + pulled
        self._raise(scheduler, snap, got)
        return True

    def _raise(
        self, scheduler: SchedulerLike, snap: Mapping[Client, float], got: dict[str, float]
    ) -> None:
        """Lift each of ``got`` (key -> global counter) to ``global + local since the fold``.

        With the change feed: one more read of the feed (only the tenants charged
        during the round trip), which folds what was charged since the fold into the
        ledger's (just acknowledged) amounts: that is the local part, and no
        O(tenants) ``services()`` is needed. Without the feed, few tenants: one
        ``service()`` each; many: one ``services()`` call (the fold read every
        tenant's already)."""
        ledger = self._ledger
        if ledger is not None:
            if not got and not ledger.num_pulled:
                return
            # the ledger's amounts were just acknowledged: this read folds what was
            # charged during the round trip, the local part; the ledger raises each
            # pulled counter (the reply's, read in the core, and `got`) to the global
            # counter plus it, in one call
            self._read_feed(scheduler)
            extra = dict(zip(_decode_all(got), got.values())) if got else None
            done = self._between_passes(lambda: ledger.raise_pulled(scheduler, extra))  # type: ignore[arg-type]
            if done is None:  # a scheduling pass holds the guard: left for apply_deferred
                values, skipped = ledger.pulled_values(extra)
                self._defer(values)
            else:
                skipped = done[1]
            self.stats.skipped += skipped
            return
        if not got:
            return
        clients = _decode_all(got)
        raise_to: dict[Client, float] = {}
        if len(clients) <= 64:  # few: one call each, not one dict of every tenant
            service = scheduler.service
            now_svc = {c: service(c) for c in clients}
        else:
            now_svc = scheduler.services()
        for c, g in zip(clients, got.values()):
            value = g + (now_svc.get(c, 0.0) - snap.get(c, 0.0))
            if not value <= MAX_COUNTER:
                self.stats.skipped += 1
                continue
            raise_to[c] = value
        self._apply_raise(scheduler, raise_to)

    def _apply_raise(self, scheduler: SchedulerLike, raise_to: dict[Client, float]) -> None:
        """One call into the core; with a :attr:`guard` held by an engine's scheduling
        pass, left for :meth:`apply_deferred` instead (a counter only rises, so a raise
        applied a pass later is still right)."""
        if self._between_passes(lambda: scheduler.raise_counters(raise_to)) is None:
            self._defer(raise_to)

    def _between_passes(self, apply: Callable[[], _T]) -> _T | None:
        """``apply()`` (a raise into the core) with the :attr:`guard` held, if no
        scheduling pass holds it (or without one, when there is no guard); ``None``
        without calling it when a pass holds it (the caller defers the raise)."""
        guard = self.guard
        if guard is None:
            return apply()
        if not guard.acquire(blocking=False):
            return None
        try:
            return apply()
        finally:
            guard.release()

    def _defer(self, raise_to: Mapping[Client, float]) -> None:
        """Leave ``raise_to`` for :meth:`apply_deferred` (the highest value of each)."""
        with self._defer_lock:
            deferred = self._deferred
            for c, v in raise_to.items():
                if v > deferred.get(c, -1.0):
                    deferred[c] = v

    def apply_deferred(self, scheduler: SchedulerLike) -> int:
        """Raise the counters a background sync left while a scheduling pass held
        :attr:`guard` (the engine calls this with the guard held, at the edges of its
        passes); returns how many rose."""
        if not self._deferred:
            return 0
        with self._defer_lock:
            deferred, self._deferred = self._deferred, {}
        return scheduler.raise_counters(deferred)

    def _unacked_tenants(self) -> Iterable[Client]:
        """The tenants with service the store has not acknowledged."""
        return self._unacked if self._ledger is None else self._ledger.unacked_tenants()

    def _round_trip(
        self, scheduler: SchedulerLike, wait: set[Client], feed_wait: bool = False
    ) -> tuple[SyncReply, list[str]]:
        ledger = self._ledger
        push_json: bytes | None = None
        if ledger is None:
            push = dict(zip(_encode_all(self._unacked), self._unacked.values()))
            pushed = len(push)
        else:
            if getattr(self.store, "takes_json", False):  # built in the core
                push_json, pushed = ledger.push_json()
                push = {}
            else:
                push = ledger.pushed()
                pushed = len(push)
        keep: list[str] = []
        hints: dict[str, float] = {}
        since: int | None = None
        if self._full:
            cont = self._acked_wait - self._fleft if feed_wait else self._continuous
            keep = sorted(map(encode, wait & cont))
            add, rem = sorted(map(encode, wait - cont)), []
            for c in wait.union(self._unacked_tenants()):
                v = scheduler.counter(c)
                if v > 0:
                    hints[encode(c)] = v
            self.stats.full_syncs += 1
            if self.delta:
                since, self._cursor = 0, "0"
        elif feed_wait:  # only the tenants whose waiting count changed
            acked, dirty = self._acked_wait, self._fdirty
            add = sorted(encode(c) for c in dirty if c in wait and c not in acked)
            rem = sorted(encode(c) for c in dirty if c not in wait and c in acked)
            if self.delta:
                since = self._since
        else:
            add = sorted(map(encode, wait - self._acked_wait))
            rem = sorted(map(encode, self._acked_wait - wait))
            if self.delta:
                since = self._since
        if self.delta:  # the waiting set comes back (arrivals, and any written since)
            if feed_wait and ledger is not None:  # the ledger's waiting set is `wait`
                pull = sorted(_encode_all(ledger.unacked_tenants(False)))
            else:
                pull = sorted(_encode_all([c for c in self._unacked_tenants() if c not in wait]))
        else:
            pull = sorted({encode(c) for c in wait} | set(_encode_all(self._unacked_tenants())))
        self._seq += 1
        req = SyncRequest(
            self.replica_id,
            self._epoch,
            self._incarnation,
            self._seq,
            self._acked_seq,
            self._full,
            push,
            add,
            rem,
            pull,
            self.liveness_ms,
            keep=keep,
            hints=hints,
            forget_ms=self.forget_ms,
            since=since,
            cursor=self._cursor,
            services_json=push_json,
            raw_reply=push_json is not None,
        )
        self.stats.round_trips += 1
        self.stats.pushed_tenants += pushed
        return self.store.sync(req), pull

    def _rename(self) -> None:
        """The store refused this replica's id: a newer live process syncs under it.

        Nothing of the refused request was applied; the next one is a full sync
        under an id made unique by this incarnation, which the store counts as a
        new replica (what was pushed under the old id stays counted).
        """
        taken = self.replica_id
        self.replica_id = f"{taken}-{self._incarnation[:8]}"
        self.stats.renamed += 1
        self._full = True
        log.error(
            "vtc: replica id %r is in use by another live process; this one goes on as %r. "
            "Give each replica its own VTC_REPLICA_ID (or leave it unset)",
            taken,
            self.replica_id,
        )

    def _fail(self, now: float, err: BaseException) -> None:
        self.stats.failures += 1
        self.stats.last_error = f"{type(err).__name__}: {err}"
        if not self.degraded:
            if _unreachable(err):
                log.warning("vtc: shared counters unreachable (%s); scheduling locally", err)
            else:
                log.warning(
                    "vtc: shared-counter sync failed (%s: %s); scheduling locally",
                    type(err).__name__,
                    err,
                )
        self.degraded = True
        self._full = True
        self._retry_at = now + self.retry_ms

    # -- background mode ----------------------------------------------------------------------
    def start(
        self,
        scheduler: SchedulerLike,
        interval_ms: float | None = None,
        waiting: Callable[[], Iterable[Client]] | _CoreWaiting | None = None,
    ) -> None:
        """Sync from a daemon thread every ``interval_ms`` (default ``sync_ms``, else
        :data:`vtc.config.DEFAULT_SYNC_MS`: 50 ms), or less often when a sync's CPU
        would take more than ``cpu_share`` of the time (:meth:`_pause_after`).

        The engine thread then never waits on the store at all (the core is
        thread-safe); do not also call ``on_step``. ``waiting``, if given, is
        called before each sync for the tenants waiting here (it runs on the
        thread; the tracked requests otherwise). The thread survives any error
        (logged once, ``degraded`` set) and keeps trying.
        """
        if self._thread is not None:
            raise RuntimeError("already started")
        self.attach(scheduler)
        period = (interval_ms or self.sync_ms or DEFAULT_SYNC_MS) / 1000
        self._stop.clear()

        def loop() -> None:
            pause = period
            while not self._stop.wait(pause):
                cpu, began = self.stats.cpu_seconds, time.perf_counter()
                try:
                    w: Waiting = waiting() if callable(waiting) else waiting
                    self.sync(scheduler, w)
                except Exception as e:  # noqa: BLE001 - the thread must outlive any fault
                    if not self._loop_error_logged:
                        log.exception("vtc: shared-counter sync failed; retrying")
                        self._loop_error_logged = True
                    with self._sync_lock:
                        self._fail(self.clock(), e)
                pause = self._pause_after(
                    period, self.stats.cpu_seconds - cpu, time.perf_counter() - began
                )

        self._thread = threading.Thread(target=loop, name="vtc-shared-counters", daemon=True)
        self._thread.start()

    # A background sync holds the interpreter lock for at most its CPU time, which is
    # then taken from the engine thread. The pause after a sync keeps that within
    # cpu_share of the time: over a sync and the pause after it,
    #     cpu <= cpu_share * (wall + pause),
    # so pause >= cpu / cpu_share - wall, and never shorter than the period. It is capped
    # at a quarter of liveness_ms, so that however long a sync takes, the others never
    # take this replica for dead between two of its syncs (the share is then exceeded).
    def _pause_after(self, period: float, cpu: float, wall: float) -> float:
        """Seconds to wait before the next background sync, after one that took
        ``cpu`` seconds of CPU and ``wall`` seconds (``period``: the configured pause)."""
        needed = cpu / self.cpu_share - wall
        if needed <= period:
            return period
        self.stats.stretched += 1
        return min(needed, max(period, self.liveness_ms / 4000))

    def stop(self, scheduler: SchedulerLike | None = None) -> None:
        """Stop the background thread; with ``scheduler``, push a last sync."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        if scheduler is not None:
            self.sync(scheduler)


def from_env(
    env: Mapping[str, str] | None = None, *, replica_id: str | None = None
) -> SharedCounters | None:
    """A :class:`SharedCounters` on Redis configured by environment variables, or ``None``.

    ``VTC_REDIS_URL`` (e.g. ``redis://10.0.0.5:6379/0``; unset or empty: ``None``, the
    single-replica path), ``VTC_REDIS_NAMESPACE`` (default ``default``),
    ``VTC_SYNC_MODE`` (engines: ``background``, the default, or ``step``),
    ``VTC_SYNC_INTERVAL`` (steps, default 10), ``VTC_SYNC_MS`` (optional; the
    background period, default 50), ``VTC_REPLICA_ID`` (default host-pid-random),
    ``VTC_REDIS_TIMEOUT_MS`` (socket timeouts, default 100), ``VTC_SYNC_LIVENESS_MS``
    (default 10000), ``VTC_SYNC_RETRY_MS`` (default 1000), ``VTC_SYNC_FORGET_MS``
    (default 60000), ``VTC_SYNC_CPU_SHARE`` (default 0.005), parsed by
    :func:`vtc.config.shared_counter_settings`: a malformed one raises
    :class:`vtc.config.ConfigError` naming it.  Creating it does not contact Redis.
    """
    from vtc.config import shared_counter_settings

    settings = shared_counter_settings(env)
    if settings is None:
        return None
    return from_settings(settings, replica_id=replica_id)


def from_settings(
    settings: SharedCounterSettings, *, replica_id: str | None = None
) -> SharedCounters:
    """A :class:`SharedCounters` on Redis for parsed ``settings``.

    Raises :class:`vtc.config.ConfigError` when the ``redis`` client is not
    installed (saying what to install).  Does not contact Redis.
    """
    from vtc.config import ConfigError

    try:
        import redis  # noqa: F401
    except ImportError:
        raise ConfigError(
            f"{ENV_URL} is set, but the redis client is not installed: pip install 'vtc[redis]'"
        ) from None
    try:
        store = RedisStore.from_url(settings.url, settings.namespace, settings.timeout_ms)
    except ValueError as e:  # redis-py's own reading of the URL
        raise ConfigError(f"{ENV_URL}={settings.url!r}: {e}") from None
    shared = SharedCounters(
        store,
        replica_id=replica_id or settings.replica_id,
        sync_interval=settings.sync_interval,
        sync_ms=settings.sync_ms,
        liveness_ms=settings.liveness_ms,
        retry_ms=settings.retry_ms,
        forget_ms=settings.forget_ms,
        cpu_share=settings.cpu_share,
    )
    shared.mode = settings.mode
    return shared


# --------------------------------------------------------------------------- the bound
def staleness_bound(replicas: int, sync_interval: int, rate: float, weight: float = 1.0) -> float:
    """``eps = 2 (R - 1) S mu / w``: how far a replica's counter can lag the global one.

    ``rate`` (``mu``) is the most weighted service one replica charges in a step.
    See ``docs/distributed.md``.
    """
    return 2 * (replicas - 1) * sync_interval * rate / weight


def drift_bound(
    replicas: int, sync_interval: int, rate: float, u: float, weight: float = 1.0
) -> float:
    """``2 (R U + eps)``: the drift bound of global VTC over ``R`` replicas (``R = 1``: ``2U``)."""
    return 2 * (replicas * u / weight + staleness_bound(replicas, sync_interval, rate, weight))
