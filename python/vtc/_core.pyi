# Hand-kept stub for the compiled module vtc._core (rust/python/src/lib.rs).
# Keep every signature here in step with the #[pyo3(signature = ...)] there:
# `make test-core` runs mypy's stubtest, which fails on any difference.

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any, Literal, final

import numpy as np
import numpy.typing as npt
from typing_extensions import Self, disjoint_base

__version__: str
MAX_TOKENS_PER_CALL: int
MAX_BUDGET: int  # the largest M (2**53): every token count stays exact in a float
MAX_REQUEST_TOKENS: int  # the most tokens one request may hold over its life (2**54)
MAX_PRICE: float  # the largest price of a token: wp, wq, every cost coefficient (1e9)
MIN_WEIGHT: float  # the smallest client weight (1e-6)
MAX_WEIGHT: float  # the largest client weight (1e6)
MAX_COUNTER: float  # the largest magnitude raise_counter accepts (1e30)
SNAPSHOT_VERSION: int  # the format snapshot() writes (2); from_snapshot also reads 1
CHANGE_READERS: int  # reader slots of Scheduler.changes (4): independent cursors
_LISTS_IN_PLACE: bool  # lists read from their item array (layout checked at import)

def key_id(key: Hashable, /) -> int:
    """The request id ``decode_outputs(..., missing="hash")`` gives ``key``:
    ``hash(key) % 2**64``. Python salts str hashes per process, so such ids
    are not stable across processes (do not put them in snapshots you restore
    elsewhere)."""

__all__ = [
    "__version__",
    "Scheduler",
    "LinearCost",
    "QuadraticCost",
    "ContextCost",
    "FairnessWindow",
    "MetricsMirror",
    "SyncLedger",
    "TenantRule",
    "Tracked",
    "WaitingQueue",
    "key_id",
    "SchedulerError",
    "InvalidArgumentError",
    "DuplicateRequestError",
    "UnknownRequestError",
    "RequestStateError",
    "CapacityError",
    "SnapshotError",
    "InternalError",
    "MAX_TOKENS_PER_CALL",
    "MAX_BUDGET",
    "MAX_REQUEST_TOKENS",
    "MAX_PRICE",
    "MIN_WEIGHT",
    "MAX_WEIGHT",
    "MAX_COUNTER",
    "SNAPSHOT_VERSION",
    "CHANGE_READERS",
]

_ClientKey = int | str
_IntArray = Sequence[int] | npt.NDArray[np.integer]

class SchedulerError(Exception):
    """Base class of every error vtc raises. The scheduler is unchanged after any of them."""

class InvalidArgumentError(SchedulerError, ValueError):
    """An argument has a value the scheduler cannot accept (M, weights, lengths, policy)."""

class DuplicateRequestError(SchedulerError, ValueError):
    """The request id is already waiting or running."""

class UnknownRequestError(SchedulerError, KeyError):
    """The request id is neither waiting nor running."""

class RequestStateError(SchedulerError, ValueError):
    """The request is in the wrong state for the operation (e.g. finishing a waiting one)."""

class SnapshotError(SchedulerError, ValueError):
    """A snapshot could not be restored (truncated, corrupted or another version)."""

class InternalError(SchedulerError):
    """An earlier internal error (a Rust panic, raised as ``PanicException``) left the
    scheduler's state undefined: every call but ``snapshot()`` and ``repr()`` raises
    this. Rebuild with ``Scheduler.from_snapshot(s.snapshot())``."""

class CapacityError(SchedulerError):
    """The last running request alone cannot grow within M; finish or cancel it."""

@final
class LinearCost:
    """``h(n_p, n_q) = wp·n_p + wq·n_q``: the default cost (same as passing ``wp``/``wq``)."""

    wp: float
    wq: float
    def __new__(cls, wp: float | None = None, wq: float | None = None) -> Self:
        """``wp`` 1.0 and ``wq`` 2.0 when omitted."""

@final
class QuadraticCost:
    """``h = a_p·n_p + a_q·n_q + a_pq·n_p·n_q + a_qq·n_q² + c`` (the paper's profiled cost).

    Charged ``a_p·computed + c`` at first admission (``computed`` = prompt minus the
    prefix-cache hit) and ``h(n_p, j) - h(n_p, j-1) = a_q + a_pq·n_p + a_qq·(2j-1)``
    for the j-th generated token (``n_p`` = the whole prompt).
    """

    a_p: float
    a_q: float
    a_pq: float
    a_qq: float
    c: float
    def __new__(
        cls,
        a_p: float | None = None,
        a_q: float | None = None,
        a_pq: float | None = None,
        a_qq: float | None = None,
        c: float | None = None,
    ) -> Self:
        """Omitted coefficients are the paper's: 2.1, 1.0, 0.04, 0.032, 11.46."""

@final
class ContextCost:
    """Context-aware decode: ``wp`` per computed prompt token, and ``wq + beta·context_len``
    per generated token, ``context_len`` = prompt + tokens generated before it.

    Meters KV reads (HBM bandwidth) instead of tokens. Default ``beta = 1/512``.
    """

    wp: float
    wq: float
    beta: float
    def __new__(
        cls, wp: float | None = None, wq: float | None = None, beta: float | None = None
    ) -> Self:
        """``wp`` 1.0, ``wq`` 2.0 and ``beta`` 1/512 when omitted."""

_Cost = LinearCost | QuadraticCost | ContextCost

@final
class FairnessWindow:
    """The window figures of the per-tenant metrics (``vtc.metrics``), kept in the
    core: snapshots of every client's service and whether it was backlogged (waiting
    or set-aside requests), one every ``window / 32`` seconds at most, the window's start being
    the last snapshot at least ``window`` old (else the first). Clients are matched
    across snapshots by key (a client forgotten and back is the same tenant, its
    service started again); clients without a key are left out. One per reader: the
    snapshots follow its own clock. ``window``: seconds, > 0 (``inf`` allowed), else
    ``InvalidArgumentError``."""

    def __new__(cls, window: float) -> Self: ...
    @property
    def window(self) -> float: ...
    @property
    def snapshots(self) -> int:
        """Snapshots kept (at most ~34 while time moves forward)."""
    def refresh(self, scheduler: Scheduler, now: float) -> tuple[float | None, float, int]:
        """``(jain, spread, backlogged)`` of ``scheduler`` at time ``now`` (seconds,
        a clock that does not go back; one going back or NaN takes no snapshot and
        drops none), taking a snapshot when one is due. ``jain``: Jain's index
        ``(sum g)^2 / (n * sum g^2)`` of the services ``g`` gained since the window's
        start by the clients backlogged both then and now (NaN for none, or all 0;
        None while the window has no start before ``now``: the first refresh);
        ``spread``: max - min counter of the clients backlogged now (0.0 for fewer
        than two); ``backlogged``: how many. O(clients) in Rust, one call. Not a
        ``Scheduler``: ``TypeError``."""
    def gains(self, scheduler: Scheduler, tenants: Iterable[_ClientKey]) -> list[float]:
        """The service each of ``tenants`` gained over the window as of the last
        ``refresh``: its service now less its service at that refresh's window start
        (0.0 if it was not in it, or the refresh had no start: its whole service);
        NaN for a key ``scheduler`` does not have. A tenant forgotten and back may
        have gained less than 0. Not a key: ``TypeError``."""
    def above(self, scheduler: Scheduler, bar: float) -> list[tuple[_ClientKey, float]]:
        """``(key, gain)`` of every client of ``scheduler`` whose ``gains`` is more
        than ``bar``, in client id order: one pass in Rust (the candidates for the
        metrics' labels)."""
    def relabel(
        self,
        scheduler: Scheduler,
        labelled: Iterable[_ClientKey],
        limit: int,
        factor: float,
        reserved: str | None = None,
    ) -> tuple[
        list[int],
        list[_ClientKey],
        list[tuple[_ClientKey, int]],
        tuple[_ClientKey | None, _ClientKey] | None,
    ]:
        """The metrics' labels' changes as of the last ``refresh`` (``vtc.metrics``,
        ``TenantMetrics._relabel`` with more tenants than labels), in one call:
        ``(dropped, taken, swaps, clash)`` for ``labelled`` (the tenants with a label,
        no two with one label value), at most ``limit`` labels, a candidate having to
        gain more than ``factor`` times a labelled tenant's ``max(gain, 0)`` to take
        its label. ``dropped``: indices into ``labelled`` of the least served over
        ``limit``, in the order they go (ties: by label value, a name before an int
        key). Candidates: the clients not labelled whose gain is above the bar
        (``-inf`` while a label is free, else the least labelled gain times
        ``factor``), most served first (ties: by label value, a name first), less
        those whose label value (a name, an int key's decimal form) a labelled tenant
        or an earlier candidate holds, or that is ``reserved`` (no tenant takes it):
        ``clash`` is the first of them, ``(holder, tenant)`` (holder None for
        ``reserved``), or None. ``taken``: the first candidates, one per free label;
        ``swaps``: ``(tenant, index into labelled)``, each next candidate with the
        least served labelled tenant left (ties: the last by label value first) while
        it gained more than ``factor`` times as much. ``limit`` < 0:
        ``InvalidArgumentError``; not a ``Scheduler``, a key, an int, a float or a str:
        ``TypeError``."""

@final
class TenantRule:
    """Which tenant an arriving request is billed to (``vtc.adapter.Tenancy.rule``):
    counts arrivals, and answers the common case natively. ``known``: the tenants
    counted against the cap (held, not copied: change it in place); ``key``: the
    ``extra_args`` key that names a tenant; every ``forget_every``-th arrival is due
    a ``forget_idle``; a ``str`` field names a tenant if it has 1 to ``max_len``
    characters; ``slow(due, fields)`` answers every other case. ``forget_every`` or
    ``max_len`` below 1, or ``slow`` not callable: ``InvalidArgumentError``."""

    def __new__(
        cls,
        known: set[str],
        key: str,
        forget_every: int,
        max_len: int,
        slow: Callable[[bool, tuple[Any, Any]], str],
    ) -> Self: ...
    @property
    def arrivals(self) -> int:
        """Arrivals counted so far."""
    @property
    def forget_every(self) -> int:
        """Idle tenants are due a ``forget_idle`` every this many arrivals."""
    def count_arrival(self) -> bool:
        """Count one arrival; whether it is due a ``forget_idle``."""
    def __call__(self, request: Any, /) -> str:
        """The tenant of an arriving vLLM request, counted as an arrival. Its tenant
        fields are ``request.sampling_params.extra_args.get(key)`` (if a dict) and
        then ``request.lora_request.lora_name`` (``vtc.adapter.vllm_tenant_fields``, the
        second read only if the first names no tenant). When no forget is due and the
        first field that names one is a ``str`` in ``known``, that ``str``;
        otherwise ``slow(due, (extra, lora))``."""

@final
class Tracked:
    """What the adapter knows about one engine request (``vtc.observer.Tracked``):
    the record ``vtc.adapter.Requests`` keeps per request and hands its observers.
    Native data: the identity fields are fixed when it is made; ``owed``,
    ``admissions`` and ``charged`` may be set (an int in i64, else
    ``OverflowError``/``TypeError``). Equal only to itself, hashed by identity."""

    def __new__(
        cls,
        key: Hashable,
        rid: int,
        request: Any,
        tenant: str,
        prompt_len: int,
        owed: int = 0,
        admissions: int = 0,
        charged: int = 0,
    ) -> Self: ...
    @property
    def key(self) -> Hashable:
        """The engine's handle for it (vLLM: its request id; SGLang: ``id(Req)``)."""
    @property
    def rid(self) -> int:
        """The core's id."""
    @property
    def request(self) -> Any:
        """The engine's request object (kept alive while tracked)."""
    @property
    def tenant(self) -> str: ...
    @property
    def prompt_len(self) -> int:
        """As submitted: clamped to [1, M]."""
    @property
    def owed(self) -> int:
        """Tokens produced while not running: charged when admitted again."""
    @owed.setter
    def owed(self, n: int) -> None: ...
    @property
    def admissions(self) -> int:
        """Times admitted (its prompt is charged at the first)."""
    @admissions.setter
    def admissions(self, n: int) -> None: ...
    @property
    def charged(self) -> int:
        """Tokens charged so far, for a shell that sees cumulative output counts
        (SGLang)."""
    @charged.setter
    def charged(self, n: int) -> None: ...

@disjoint_base
class WaitingQueue:
    """The native half of an engine's waiting queue (``vtc.vllm.VTCRequestQueue``
    derives from it): the hot questions and the step's charge with no Python frame.
    ``requests`` is the ``vtc.adapter.Requests`` table it serves: its ``core`` (a
    ``Scheduler``, else ``TypeError``) answers, under its lock; its ``_by_rid`` (core
    id -> record, a dict, held, not copied) gives each record's ``request`` (the
    engine's). Every method but ``settle`` and ``record_outputs`` first calls
    ``self.settle()`` while a pop is pending (a subclass may decide its pops
    itself).

    Its methods' calls of ``settle``, ``record_outputs`` and ``release_finished``
    run this class's own unless the queue's class defines one (looked up on the
    class at each call, as for a special method): that is then called by name, so a
    subclass may replace or wrap each.

    ``prefilling`` (a set, else ``TypeError``): the engine's own set of its requests
    still in a prefill chunk after a step's chunks are counted (vLLM's
    ``Scheduler._inflight_prefills``), held, not copied; see ``record_step``."""

    def __new__(
        cls,
        requests: Any,
        running: Any = None,
        loading: Any = None,
        tenant_of: Callable[[Any], str] | None = None,
        finished: Iterable[Any] | None = None,
        prefilling: set[Any] | None = None,
    ) -> Self: ...
    def add_request(self, request: Any) -> None:
        """A request arrives, or a paused one returns (its ``request_id`` is tracked:
        ``requests.put_back(record)``): ``requests.submit(request.request_id,
        request, tenant_of(request), request.num_prompt_tokens, request.priority)``.
        Made here, as ``Requests.submit`` makes it, when nothing else must see it or
        be converted: the id and the tenant exact ``str``, the prompt length an int
        in [1, M], the priority an int in i64, the id ``key_id(request_id)`` free, no
        observer, and ``requests.submit`` and ``requests.admit`` the table's own
        methods when the queue was made. Built without ``tenant_of``:
        ``NotImplementedError``."""
    def settle(self, num_scheduled_tokens: Mapping[Any, int] | None = None) -> None:
        """Decide the pending pop (none: nothing to do), by its record's ``request``:
        admitted (``requests.admit(record, cached)``) if its ``status`` equals
        ``running`` or ``loading`` (the engine's statuses given at construction) or
        its ``num_computed_tokens`` is above 0; else skipped
        (``requests.set_aside(record)``). ``cached`` is ``num_computed_tokens``, less
        ``num_scheduled_tokens.get(request.request_id, 0)`` for a running request.
        The admission is made here, as ``vtc.adapter.Requests.admit`` makes it, when
        nothing else must see it: the record a ``Tracked``, ``cached`` an int in i64,
        no observer in ``requests.observers``, and ``requests.admit`` and
        ``requests.submit`` the table's own methods when the queue was made (else
        ``requests.admit`` is called). Nothing
        stays pending, whatever raises. Built without the statuses:
        ``NotImplementedError`` (a subclass decides its pops itself)."""
    @property
    def _pending(self) -> Any | None:
        """The record ``pop_request`` took, until ``settle`` decides it (None)."""
    @_pending.setter
    def _pending(self, record: Any | None) -> None: ...
    @property
    def prefilling(self) -> set[Any] | None:
        """The engine's set of requests still prefilling the queue was made with
        (the same object), None if none."""
    def __bool__(self) -> bool:
        """Whether a request waits in the core."""
    def __len__(self) -> int:
        """How many requests wait in the core (its ``num_waiting``)."""
    def peek_request(self) -> Any:
        """The engine's request the core admits next (its ``peek``);
        ``IndexError`` if none waits."""
    def pop_request(self) -> Any:
        """As ``peek_request``, and its record becomes the pending pop."""
    def scheduled(self, output: Any, running: int) -> None:
        """The engine scheduled a step (``output``): the pending pop settled by its
        ``num_scheduled_tokens``, and the step kept for ``record_step`` if
        ``running`` (the engine's running requests) equals the core's
        ``num_running``, with the core's ``state_version`` now and whether the
        ``prefilling`` set is empty (else nothing is kept)."""
    def record_step(
        self,
        scheduler_output: Any,
        model_runner_output: Any,
        outputs: Mapping[Any, Any],
        finished: Any,
    ) -> None:
        """``record_outputs(outputs.values(), finished, running, tokens)`` of an
        updated step: ``running`` when ``scheduler_output`` is the step
        ``scheduled`` kept (used once) and the core's ``state_version`` is as it was then;
        ``tokens``, for a running step, ``model_runner_output.sampled_token_ids``
        if it is a non-empty list whose first item is a list (else None). The
        lists are known to hold one token each, and are not read, when the kept
        step found ``prefilling`` empty (no request in a chunk that leaves its
        prompt unfinished: each samples a token) and ``scheduler_output`` has no
        draft tokens (``scheduled_spec_decode_tokens`` an empty dict): as many
        lists as outputs as running requests are then charged one token each
        (``decode_all(1)``)."""
    def record_outputs(
        self,
        outputs: Iterable[Any],
        finished: Any = None,
        running: bool = False,
        tokens: list[Any] | None = None,
    ) -> None:
        """One step's output groups (each with an ``outputs`` list): charged as
        ``requests.charge_outputs(outs, running=running, tokens=tokens)`` charges
        them (natively when ``running``, ``tokens`` a list of one list per output,
        all of one length, and no observer: ``decode_uniform``, one more in the
        core's ``uniform_decodes``); then, if any finished,
        ``self.release_finished(finished)`` (a subclass's if it defines one):
        ``finished``, else the ids of the outputs whose ``finish_reason`` is not None."""
    def release_finished(self, finished: Iterable[Any]) -> None:
        """A step's finished requests forgotten (``finished``: their keys): each
        tracked key's once, if its request's ``is_finished()`` says so (a request
        whose ``status`` is one of the ``finished`` statuses the queue was made with,
        the same object, is finished without the call), as
        ``requests.release_finished(finished, done)`` releases them (natively when no
        observer listens and ``requests``' methods were the table's own when the
        queue was made; else ``requests._drop(records, True)``, or, without the
        table, ``requests.release_finished``). The pending pop is dropped if
        released."""

@final
class MetricsMirror:
    """The per-tenant metrics' mirror of every tenant (``vtc.metrics``), kept in the
    core: each keyed client's last row read from a scheduler's change feed
    (``Scheduler.changes``), the prompt and decode tokens not yet taken, and the
    totals over every tenant, so a refresh's Python touches only the labelled
    tenants' rows and the sums of the rest. A tenant's tokens grew by the difference
    of its tallies with its last row (both from zero when either went back: forgotten
    and back); a full read compares each client with its key's row and drops the keys
    it no longer has. A dropped tenant's tokens not yet taken stay its key's until
    the next ``take``. Tenants are keys, an int key and a str of the same digits two
    tenants."""

    def __new__(cls) -> Self: ...
    def __len__(self) -> int: ...
    def __contains__(self, key: object, /) -> bool:
        """Not a key: ``TypeError``."""
    @property
    def removed(self) -> int:
        """Tenants dropped so far (forgotten, or gone at a full read): while it is
        unchanged, every tenant mirrored at some point since is mirrored still."""
    def read(self, scheduler: Scheduler, reader: int | None = None) -> bool:
        """Apply ``scheduler``'s changes since reader slot ``reader``'s (default 0)
        last call (``Scheduler.changes``: forgotten clients dropped first); whether it
        was a full read. Not a ``Scheduler``: ``TypeError``; a reader outside
        ``[0, CHANGE_READERS)``: ``InvalidArgumentError``."""
    def drop(self, keys: Iterable[_ClientKey], fold: bool) -> None:
        """Drop the tenants of ``keys`` (the core forgets them): their tokens not yet
        taken stay their keys' (``fold`` False: their own at the next ``take`` if
        labelled then), or go to the sum of the rest (``fold`` True). Not a key:
        ``TypeError``."""
    def take(
        self, labelled: Iterable[_ClientKey], fresh: Iterable[_ClientKey]
    ) -> tuple[
        list[tuple[int, float | None, int, int]],
        list[tuple[int, int, int]],
        int,
        int,
        int,
        int,
        int,
    ]:
        """A refresh's part: ``(rows, increments, other_prompt, other_decode,
        other_waiting, other_running, active)`` for ``labelled`` (the tenants with a
        label; a key repeated counts once, at its first index). ``rows``: ``(index
        into labelled, counter, waiting, running)`` of each labelled tenant changed
        since the last ``take``, or in ``fresh``, the counter None for a tenant not
        mirrored; ``increments``: ``(index, prompt, decode)`` tokens of each labelled
        tenant with some; ``other_prompt``, ``other_decode``: every other tenant's
        tokens (dropped ones' included), summed; ``other_waiting``, ``other_running``:
        the requests of the tenants not labelled; ``active``: tenants with waiting or
        running requests. Every token is taken and every tenant marked unchanged. Not
        a key: ``TypeError``."""
    def keys(self) -> list[_ClientKey]:
        """Every tenant's key."""
    def rows(self) -> dict[_ClientKey, tuple[float, float, int, int, int, int]]:
        """Every tenant's row as ``Scheduler.changes`` gives it: ``(counter, service,
        prompt tokens, decode tokens, waiting, running)``."""
    def totals(self) -> tuple[int, int, int]:
        """``(active, waiting, running)`` over every tenant."""

@final
class SyncLedger:
    """The shared counters' ledger (``vtc.distributed.SharedCounters``), kept in the
    core: per tenant, the service charged here that the store has not acknowledged,
    and whether the tenant had requests waiting (or set aside) at the last read.
    It reads the scheduler's change-feed slot ``reader`` (an int in
    ``[0, CHANGE_READERS)``, else ``InvalidArgumentError``): the service a tenant
    gained since the last read is folded into its amount (all of it for a tenant
    not seen live at the last read: new, or forgotten and back). Tenants are keys,
    as the store names them; clients without a key are left out. Not a
    ``Scheduler``: ``TypeError``."""

    def __new__(cls, reader: int) -> Self: ...
    @property
    def reader(self) -> int: ...
    def reset(self, scheduler: Scheduler) -> None:
        """Serve ``scheduler``: its reader slot starts again (the next ``read`` is
        full) and the service it holds now counts as already in the store (never
        pushed). Amounts not yet acknowledged are kept."""
    def read(
        self, scheduler: Scheduler, idle: bool = False
    ) -> tuple[bool, list[_ClientKey], list[_ClientKey], list[_ClientKey], list[_ClientKey], int]:
        """Fold what ``scheduler`` charged since the last read: ``(full, entered,
        left, idle, gone, rows)``. ``full``: the slot's first read (``entered`` then
        lists every tenant waiting now); otherwise ``entered``/``left``: the tenants
        whose waiting state changed since the last read (``left`` includes forgotten
        ones that were waiting); ``idle`` (when asked): every changed tenant with
        nothing waiting; ``gone``: the tenants forgotten since; ``rows``: changed
        plus forgotten. O(changed tenants) in Rust."""
    def push_json(self) -> tuple[bytes, int]:
        """``(json, n)``: the unacknowledged amounts of ``n`` tenants as one JSON array
        ``["<key>", "<amount>", ...]`` (keys ``i:<int>``/``s:<str>``, UTF-8; each
        amount the shortest text of its float): the sync script's services argument."""
    def pushed(self) -> dict[str, float]:
        """The unacknowledged amounts by stored key (``i:<int>``, ``s:<str>``)."""
    def unacked(self) -> list[tuple[_ClientKey, float]]:
        """``(tenant, amount)`` of every unacknowledged amount (each > 0)."""
    def unacked_tenants(self, waiting: bool | None = None) -> list[_ClientKey]:
        """The tenants with an unacknowledged amount; with ``waiting`` given, only
        those whose waiting state at the last read is that."""
    def unacked_of(self, tenant: _ClientKey) -> float:
        """The unacknowledged amount of ``tenant`` (0.0 for none)."""
    def seen(self, tenant: _ClientKey) -> float | None:
        """The service of ``tenant`` at the last read (None: not live then)."""
    def acknowledge(self) -> None:
        """The store applied every amount: none is unacknowledged any more."""
    def forget(self, tenants: Iterable[_ClientKey]) -> None:
        """The scheduler forgot ``tenants`` and this ledger did not read in between:
        their service starts again from 0."""
    def take_changed(self, keys: bytes, values: bytes) -> tuple[int, int]:
        """Read a sync reply's changed counters as the script sent them (``keys`` a JSON
        array of stored keys, ``{}`` for none; ``values`` their counters
        comma-separated) for ``raise_pulled``/``pulled_values``: ``(kept, dropped)``,
        a value that is no counter (not a number in ``[0, MAX_COUNTER]``) dropped. A
        reply that cannot be read (not such a list, a key that is no key, fewer or more
        values than keys): ``InvalidArgumentError``, nothing kept."""
    def raise_pulled(
        self, scheduler: Scheduler, extra: Mapping[_ClientKey, float] | None = None
    ) -> tuple[int, int]:
        """Raise each counter taken by ``take_changed``, and each of ``extra`` (tenant
        -> global counter), to the global counter plus the tenant's unacknowledged
        amount (charged here since the last acknowledgment), in one call into
        ``scheduler``: ``(raised, skipped)``, skipped a value past ``MAX_COUNTER``. The
        counters taken are used up, also on an error."""
    def pulled_values(
        self, extra: Mapping[_ClientKey, float] | None = None
    ) -> tuple[dict[_ClientKey, float], int]:
        """What ``raise_pulled`` would raise each tenant to, and how many it would skip
        (a raise left for later); uses up the counters taken."""
    @property
    def num_pulled(self) -> int:
        """Counters taken and not used yet."""
    def check(self) -> None:
        """``AssertionError`` if the ledger's invariant is broken (for tests)."""
    def __len__(self) -> int:
        """Tenants with an unacknowledged amount."""

@final
class Scheduler:
    """The Virtual Token Counter scheduler (Sheng et al., OSDI '24).

    Each client has a virtual counter of the weighted service it received:
    ``wp`` per prompt token, charged when a request is first admitted, and
    ``wq`` per generated token, charged as generated; every charge is divided
    by the client's weight. ``schedule()`` admits the oldest waiting request of
    the backlogged client with the least counter until the next one would not
    fit in the KV budget ``M`` (no skipping). A client that submits while it
    has nothing waiting is lifted to the least counter of the backlogged
    clients, so idle time cannot be banked.

    ``policy``: ``"vtc"``; ``"lcf"`` (least counter first without the lift);
    ``"fcfs"`` (global submit order). Safe to share between threads.

    Accounting beyond tokens (``docs/accounting.md``):

    * ``cost``: a cost object, or ``"linear"`` / ``"quadratic"`` / ``"context"`` for the
      default coefficients; not together with ``wp``/``wq``. Decode charges are summed
      per client and call as exact integer aggregates, so they do not depend on the
      order of requests in a call.
    * ``client_cap``: KV tokens one client may hold in the running batch, an int, or a
      float in (0, 1] as a fraction of M (``max(1, floor(f·M))``). In ``schedule()`` a
      client is eligible while it has nothing running or its running tokens plus its
      head request fit in the cap; ineligible clients are left out of selection for
      that call (no skipping among eligible clients). ``peek``/``pop`` ignore the cap.
    * ``predictor``: ``"none"`` (default) or ``"mean"``: a request submitted without
      ``predicted_output`` gets the client's moving average of finished output lengths.
    * ``locality_quantum``: the locality window ``Q`` in counter units (0.0 when
      omitted: plain VTC), a finite number ``>= 0``, above 0 only with ``vtc`` or
      ``lcf``. With ``Q > 0`` and a ``set_prefix_lookup`` lookup, selection prefers,
      among the clients of the band within ``Q`` of the least counter (each
      offering its first 8 waiting requests, only its head once 7 later ones went
      before it), the request with the longest cached prefix (docs/locality.md).
    """

    def __new__(
        cls,
        M: int,
        wp: float | None = None,  # 1.0 when omitted; not together with ``cost``
        wq: float | None = None,  # 2.0 when omitted; not together with ``cost``
        policy: Literal["vtc", "lcf", "fcfs"] | None = None,  # "vtc" when omitted
        *,
        cost: _Cost | Literal["linear", "quadratic", "context"] | None = None,
        client_cap: int | float | None = None,
        predictor: Literal["none", "mean"] | None = None,
        band_weights: Mapping[int, float] | None = None,
        locality_quantum: float = ...,  # the stored value when omitted
    ) -> Self: ...
    @property
    def locality_quantum(self) -> float:
        """The locality window's quantum ``Q`` (0.0: plain VTC)."""
    def set_prefix_lookup(self, lookup: Callable[[int], int] | None) -> None:
        """The engine's prefix-cache lookup for the locality window, or ``None``.

        ``lookup(request_id)`` returns how many tokens of that waiting request the
        engine holds cached now, an int in ``[0, prompt + generated]``. The
        selecting calls (``schedule``, ``peek``, ``pop``, ``set_aside``) call it only
        when ``locality_quantum > 0``, once per offered request (never with a single
        one), and store nothing it returns. A non-int answer is a
        ``TypeError``, one out of range an ``InvalidArgumentError``; that or the
        lookup's own exception propagates, raised before anything changed, except
        in a ``schedule()`` that has already admitted requests: it returns those,
        and the next selecting call asks again. The lookup must not call back into
        this scheduler: any such call, ``repr`` and ``snapshot`` included, raises
        ``RuntimeError`` (the scheduler is locked meanwhile) instead of waiting for
        itself. Another scheduler may be called unless it is locked too.
        """
    @property
    def cost(self) -> _Cost:
        """The cost function."""
    @property
    def client_cap(self) -> int | None:
        """The per-client KV cap in tokens, or None."""
    @property
    def predictor(self) -> str:
        """``"none"`` or ``"mean"``."""
    def credit(self, client: _ClientKey) -> float:
        """Refunded over-prediction not yet absorbed by the client's later charges."""
    @property
    def M(self) -> int:
        """KV budget in tokens: prompt + generated tokens of all running requests."""
    @property
    def wp(self) -> float:
        """Weight of a prompt (prefill) token (the cost's ``wp``, or ``a_p``)."""
    @property
    def wq(self) -> float:
        """Weight of a generated (decode) token (the cost's ``wq``, or ``a_q``)."""
    @property
    def policy(self) -> str:
        """``"vtc"``, ``"lcf"`` or ``"fcfs"``."""
    @property
    def occupancy(self) -> int:
        """Tokens held by running requests (prompt + generated)."""
    @property
    def num_waiting(self) -> int:
        """Requests waiting to be admitted."""
    @property
    def num_running(self) -> int:
        """Requests admitted and not yet finished, cancelled or preempted."""
    @property
    def state_version(self) -> int:
        """The scheduling state's version: it advances with every call that changes
        the requests, their states, the counters, the weights or the configuration
        (a call that fails changes nothing and leaves it; reads, ``changes`` and
        ``reset_changes`` leave it too). Equal reads: nothing changed in between, so
        an answer kept since (the next request, the running set) still holds.
        Compare for equality only (it wraps at 2**64); not kept in a snapshot."""
    @property
    def uniform_decodes(self) -> int:
        """The ``decode_all`` calls (``decode_uniform`` ones included) that charged
        tokens, so far: an engine's uniform steps. Not kept in a snapshot."""
    @property
    def num_clients(self) -> int:
        """Clients the scheduler has seen (by submit or set_weight)."""
    def set_band_weights(self, weights: Mapping[int, float] | None) -> None:
        """Weighted priority bands (``None``: strict bands, the default).

        While several bands are backlogged they share service in proportion to
        their weights (a priority not listed weighs 1): the band with the least
        band counter (its requests' actual service divided by its weight; before
        client weights, without length predictions) is served first, VTC among
        the clients inside it. A band entering the backlog is lifted to the least
        band counter of the backlogged ones. Two bands backlogged over an interval
        stay within ``2·max(wp·L_input, wq·M) / min(w_a, w_b)`` of each other.
        Counters of live bands are kept across a change of weights. Every pair is
        checked before anything changes.
        """
    def band_weights(self) -> dict[int, float] | None:
        """The band weights by priority, or ``None`` under strict bands."""
    def band_counters(self) -> dict[int, float]:
        """Under weighted bands, the counter of each band with live requests, by
        priority (empty under strict bands). Not kept in snapshots."""
    def set_weight(self, client: _ClientKey, weight: float) -> None:
        """Weighted VTC: every later charge to ``client`` is divided by ``weight`` (> 0, finite)."""
    def raise_counter(self, client: _ClientKey, value: float) -> None:
        """Raise the client's counter to at least ``value`` (never lowers it).

        For counters shared across replicas: a replica lifts its local view to the
        global counter it learned. Delivered service is unchanged.
        """
    def raise_counters(self, counters: Mapping[_ClientKey, float]) -> int:
        """``raise_counter`` for every ``client: value`` of ``counters``, in one call.

        Every pair is checked (the client, then its value, in the mapping's order)
        before any counter moves: an error changes nothing. Returns how many
        counters rose.
        """
    def weight(self, client: _ClientKey) -> float:
        """The client's weight (1.0 for a client never seen)."""
    def counter(self, client: _ClientKey) -> float:
        """The client's virtual counter: service received plus lifts (0.0 if never seen)."""
    def service(self, client: _ClientKey) -> float:
        """Weighted service actually delivered to the client, without lifts."""
    def counters(self) -> dict[_ClientKey, float]:
        """Every client's virtual counter."""
    def services(self) -> dict[_ClientKey, float]:
        """Every client's delivered weighted service."""
    def client_tokens(self, client: _ClientKey) -> tuple[int, int]:
        """The raw tokens charged to the client, ``(prompt, decode)`` (``(0, 0)`` if
        never seen): token counts, whatever they cost (prices, weight, cost function
        and credit do not enter).

        ``prompt``: at each request's first admission (``schedule`` or ``pop``), its
        prompt less its ``cached_len``; a request re-admitted after a preemption adds
        nothing. ``decode``: the output tokens whose cost was charged: those of every
        ``decode`` and ``decode_outputs`` call, and a prediction's tokens, charged at
        the first admission (decode then adds only tokens beyond it; a refunded
        over-prediction is not taken back). Both only grow, saturating at 2**64 - 1,
        until ``forget_idle`` forgets the client; a scheduler restored by
        ``from_snapshot`` starts every client at ``(0, 0)``.
        """
    def tokens(self) -> dict[_ClientKey, tuple[int, int]]:
        """Every client's ``client_tokens``: ``(prompt, decode)``, the same keys as
        ``counters()``. One call for a metrics refresh."""
    def active_clients(self) -> dict[_ClientKey, tuple[int, int]]:
        """Every client with live requests: ``(waiting, running)``, its request counts.

        ``waiting`` includes the requests taken by ``set_aside`` and not yet put back
        or cancelled (between a pop and a put back within one engine step they are
        still waiting); ``running``: admitted and not yet finished, cancelled or
        preempted. A client with neither is absent: one that finished everything
        drops out at once, though ``counters()`` keeps it until ``forget_idle``.

        The waiting counts sum to ``num_waiting`` plus the set-aside requests, the
        running ones to ``num_running``; each pair is what counting the client's
        requests by ``status`` gives (``"aside"`` as waiting). Read from counts the
        core keeps per client (O(clients), no per-request work) under the scheduler's
        lock, so a call from another thread (metrics, a shared-counter sync) while
        the engine thread schedules sees a consistent state. Keys as in
        ``tokens()``.
        """
    def clients(self) -> list[_ClientKey]:
        """Every client the scheduler knows (not forgotten), by internal id."""
    def submit(
        self,
        request_id: int,
        client: _ClientKey,
        prompt_len: int,
        cached_len: int | None = None,
        predicted_output: int | None = None,
        priority: int | None = None,
    ) -> None:
        """Queue a request. ``request_id`` must not be live; ``1 <= prompt_len <= M``.

        ``cached_len`` prompt tokens (``0 <= cached_len <= prompt_len``, default 0) are
        a prefix-cache hit: they count in the KV budget but are not charged. A client
        with nothing waiting in the request's band is first lifted to the floor (under
        ``"vtc"``): the least counter of that band, or of all bands when nobody waits
        in it.

        ``priority`` (a 64-bit int, default 0; smaller is more urgent, as in vLLM):
        strict bands. A request is admitted only when no more urgent request waits;
        inside a band the least counter goes first; a client has one counter across
        bands. Preemption by ``decode()`` evicts from the least urgent band first.

        ``predicted_output`` (oracle or user prediction, ``0..=MAX_TOKENS_PER_CALL``):
        the cost of that many output tokens is charged at first admission, decode then
        charges only tokens beyond it, and an over-estimate becomes ``credit`` when the
        request finishes (or is cancelled after admission): counters never decrease,
        the credit is absorbed by the client's next charges.
        """
    def schedule(self) -> list[int]:
        """Admit requests until the next does not fit in M; returns them in admission order."""
    def decode(
        self, request_ids: _IntArray | None = None, tokens: int | _IntArray | None = None
    ) -> list[int]:
        """Charge generated tokens.

        Without arguments: one engine iteration, every running request generates
        one token; requests are preempted first if the batch would outgrow M (from
        the most-served client), and their ids are returned.

        With ``request_ids`` (a sequence or numpy array): engine form, request
        ``request_ids[i]`` generated ``tokens[i]`` tokens (``tokens`` may be one
        int for all; default 1). No capacity check; returns ``[]``. All or nothing.
        """
    def decode_all(self, tokens: int | None = None) -> None:
        """Engine form, uniform: every running request generated ``tokens`` tokens
        (default 1), without passing ids: the charges of ``decode(<every running
        id>, tokens)``. No capacity check; all or nothing.
        """
    def decode_uniform(self, outputs: Any, /, *, tokens_attr: str | None = "new_token_ids") -> bool:
        """Engine form of ``decode_all`` for an engine step's output objects whose
        requests the caller knows to be distinct running requests (their ids are
        not read, so this is not checked).

        If ``outputs`` is a list of exactly ``num_running`` objects that each hold
        the same number ``t >= 1`` of tokens (``len(obj.<tokens_attr>)`` of an exact
        list or tuple, or an exact int), charges ``decode_all(t)`` (the charges of
        ``decode_outputs`` for them) and returns True; otherwise charges nothing and
        returns False, and the caller reads the ids (``decode_outputs``).
        ``tokens_attr=None``: each item is itself the tokens (an exact list or tuple,
        or an exact int), e.g. the per-request token lists of a sampler's output.
        """
    def decode_outputs(
        self,
        outputs: Iterable[Any],
        request_ids: dict[Hashable, int],
        /,
        *,
        missing: Literal["error", "hash", "hash-str"] = "error",
        id_attr: str = "request_id",
        tokens_attr: str = "new_token_ids",
    ) -> None:
        """Engine form of ``decode`` that reads an engine step's output objects itself.

        For each object, ``len(obj.<tokens_attr>)`` tokens (or the int it holds)
        are charged to the request its key ``obj.<id_attr>`` names:
        ``request_ids[key]``; a key not there is an ``UnknownRequestError``, or
        with ``missing="hash"`` names request ``key_id(key)`` (an engine that
        submits requests as ``key_id(its key)`` passes only the keys whose id
        was taken). ``missing="hash-str"`` hashes only a ``str`` key (any other
        is an ``UnknownRequestError``): a str's hash is salted per process, so
        a key no live request was submitted under names one only by a 64-bit
        collision, while an int's hash is the int itself (``1`` and ``2**61``
        hash alike), so an engine with int keys passes them all in the mapping.
        One call, no Python-level loop; all or nothing, like ``decode(ids, tokens)``.
        """
    def finish(self, request_id: int) -> None:
        """A running request is done: its prompt + generated tokens leave the KV budget."""
    def cancel(self, request_id: int) -> None:
        """Drop a waiting request, or abort a running one (releasing its tokens)."""
    def preempt(self, request_id: int) -> None:
        """Evict a running request back to the head of its client's queue.

        Its tokens leave the budget; it is not charged again when re-admitted.
        """
    def peek(self) -> int | None:
        """The request the policy would admit next, without admitting it."""
    def pop(self, cached_len: int | None = None) -> int | None:
        """Engine mode: admit the request ``peek()`` names, without the KV check.

        ``cached_len``, when given, replaces the request's prefix-cache hit (known to
        the engine only at admission): only ``prompt_len - cached_len`` is charged.
        """
    def set_aside(self) -> int | None:
        """Engine mode: take the request ``peek()`` names out of its client's queue
        without admitting or charging it (the engine popped it and skips it for now);
        its status is ``"aside"`` until ``put_back``. None if nothing waits."""
    def put_back(self, request_id: int) -> None:
        """Return a request ``set_aside`` took to the head of its client's queue, with
        its place: nothing is charged and its client is not lifted (it was set aside,
        not idle). ``RequestStateError`` if it is not set aside."""
    def status(self, request_id: int) -> Literal["waiting", "running", "aside"] | None:
        """Where a request is; None once finished or cancelled (or never seen)."""
    def statuses(
        self, request_ids: _IntArray | Iterable[int]
    ) -> list[Literal["waiting", "running", "aside"] | None]:
        """``status`` of each id, in order, in one call; the first bad id raises as
        ``status`` would (nothing changes either way)."""
    def generated(self, request_id: int) -> int:
        """Tokens a live request has generated so far."""
    def running(self) -> list[int]:
        """Running request ids, oldest admission first."""
    def changes(
        self, reader: int | None = None
    ) -> tuple[
        bool,
        dict[_ClientKey, tuple[float, float, int, int, int, int]],
        list[_ClientKey],
    ]:
        """The clients changed since this ``reader``'s last call: ``(full, changed,
        gone)``, for a reader that mirrors every client (metrics, a sync) without
        reading them all each time.

        ``changed``: key -> ``(counter, service, prompt tokens, decode tokens,
        waiting, running)`` (``counters()``, ``services()``, ``tokens()`` and
        ``active_clients()``'s values; ``(0, 0)`` requests for an idle client) of every
        client charged, lifted or raised (``raise_counter(s)``), or whose waiting,
        set-aside or running requests changed (submit, admission, preemption, finish,
        cancel, ``set_aside``, ``put_back``), whose weight was set (``set_weight``), or
        new. ``gone``: the keys
        ``forget_idle`` forgot since; apply them before ``changed`` (a key forgotten
        and back is in both). ``full``: the reader's first call (a new scheduler, one
        restored by ``from_snapshot``, or after ``reset_changes``): ``changed`` holds
        every client, and the reader drops what it had. Applying each result to the
        last gives ``changed`` of a full read.

        ``reader`` (default 0): one of ``CHANGE_READERS`` slots, each its own cursor
        (independent readers take different slots). O(changed clients); marking a
        change costs the engine's calls nothing while no reader has read, a byte
        compare once one has. A reader that stops reading should call
        ``reset_changes``: its list grows to at most one entry per client (plus the
        forgotten keys). A reader outside ``[0, CHANGE_READERS)``:
        ``InvalidArgumentError``; not an int: ``TypeError``.
        """
    def reset_changes(self, reader: int | None = None) -> None:
        """Drop ``reader``'s pending changes; its next ``changes`` is a full read."""
    def forget_idle(self) -> int:
        """Forget idle clients whose state can no longer influence any decision.

        Under ``"vtc"``: clients with nothing waiting or running, default weight, a
        counter at or below the floor (the least counter among backlogged and running
        clients), other than the lift's last-left reference. When such a client
        returns, the lift places it exactly where a brand-new client goes, so every
        future decision is unchanged; only its ``service()`` history and its
        ``tokens()`` tally are lost. Under ``"fcfs"`` any idle client with default
        weight; under ``"lcf"`` none. Call it periodically to keep memory
        proportional to the live clients. Returns the number forgotten.
        """
    def snapshot(self) -> bytes:
        """The state as bytes (format ``SNAPSHOT_VERSION``, 2): the whole configuration
        (``M``, the cost, the policy, ``client_cap`` in tokens, the predictor, the band
        weights, ``locality_quantum``), every client's key, counter, service, weight,
        refund credit and ``mean`` moving average, and the client that last left the
        backlog.

        Requests are not included (an engine that restarts has lost its batch and
        resubmits), nor the ``tokens()`` tallies, the band counters or the prefix
        lookup. Versioned and checksummed.
        """
    @staticmethod
    def from_snapshot(
        data: bytes,
        *,
        cost: _Cost | Literal["linear", "quadratic", "context"] | None = None,
        client_cap: int | float | None = None,
        predictor: Literal["none", "mean"] | None = None,
        band_weights: Mapping[int, float] | None = None,
        locality_quantum: float = ...,  # the stored value when omitted
    ) -> Scheduler:
        """A scheduler with the state of ``data`` and no requests.

        With no arguments, a version 2 snapshot restores the whole configuration it
        stores. Each argument given replaces the stored value (a restarted engine may
        change its cost, say); one omitted, or None, keeps it (to drop stored band
        weights, call ``set_band_weights(None)`` afterwards). A version 1 snapshot
        stores ``M``, ``wp``, ``wq`` and the policy only: the rest is the default
        unless given, and its credits and moving averages start empty. A bad argument
        raises as in ``Scheduler(...)``. ``set_prefix_lookup`` is not kept; every
        client's ``tokens()`` tally starts at ``(0, 0)``.

        Raises ``SnapshotError`` naming what is wrong if ``data`` is truncated,
        corrupted or of another version.
        """
    def _panic_for_tests(self) -> None:
        """Tests only: panic inside the core's lock, as an internal bug would."""
    def _check_invariants(self) -> None:
        """Raise AssertionError if an internal invariant is broken (tests)."""
