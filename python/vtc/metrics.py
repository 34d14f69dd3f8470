"""Per-tenant Prometheus metrics of an engine's VTC, as an adapter observer.

:class:`TenantMetrics` is a :class:`vtc.observer.Observer`: after every step it
refreshes the series if ``interval`` seconds have passed. Between refreshes a
step costs nothing but a clock read. A refresh reads only the tenants that changed
since the last one (``Scheduler.changes``, reader slot :data:`CHANGES_READER`: their
counters, services, token tallies and request counts, and the tenants forgotten),
into a mirror of every tenant kept in the core (``vtc._core.MetricsMirror``, which
gives back only the labelled tenants' rows and increments and the sums of the rest),
and before the core forgets tenants (whose tallies go with them); the adapter tells
it only of admissions and preemptions.
The window is the core's (``vtc._core.FairnessWindow``, which keeps its snapshots of
every tenant's service): Jain's index and the counter spread in one call, then the
labelled tenants' gains and the candidates for a label; the core must be a
``vtc.Scheduler``. A tenant is a key of the core, as it is: a name (the adapter's)
or an int key (a core used directly), which is its own tenant beside a name of the
same digits (``1`` and ``"1"`` are two tenants).

===================================  =========  ====================================
series                               type       meaning
===================================  =========  ====================================
``vtc_tenant_service_tokens_total``  counter    tokens charged, ``kind`` = ``prompt``
                                                (prefix-cache hits excluded) or
                                                ``decode``
``vtc_tenant_counter``               gauge      the tenant's virtual counter
``vtc_tenant_weight``                gauge      the tenant's weight in force (1 unless
                                                configured; follows ``VTC_WEIGHTS_FILE``)
``vtc_tenant_requests``              gauge      requests, ``state`` = ``waiting``
                                                (or set aside) or ``running``
``vtc_tenant_preemptions_total``     counter    preemptions of the tenant's requests
``vtc_tenants_active``               gauge      tenants with waiting or running requests
``vtc_fairness_jain_index``          gauge      Jain's index of the backlogged tenants'
                                                service rates over ``window`` seconds,
                                                per unit of weight (the core's
                                                services): 1 = fair; NaN: none of
                                                them was served
``vtc_counter_spread``               gauge      max - min counter of backlogged tenants
``vtc_fairness_bound``               gauge      ``2 * max(wp * L, wq * M)``: ``L`` the
                                                longest prompt admitted, ``M`` the KV
                                                budget (NaN when the engine does not
                                                give one)
===================================  =========  ====================================

Cardinality is bounded: at most ``max_tenants`` tenants get their own ``tenant``
label, among the most served over the window (ties: by name), kept with
hysteresis (:data:`LABEL_MARGIN`, :meth:`TenantMetrics._relabel`) and, once every
label is taken, chosen again every ``relabel_interval`` seconds; the others
are summed under ``tenant="_other"`` (their counters are not: a sum of virtual
counters means nothing, so ``_other`` has no ``vtc_tenant_counter`` nor
``vtc_tenant_weight``). The series of a tenant that leaves the labelled set, or
that the core forgets, are removed. Tenant names are label values as they are, never parsed;
an int key's label value is its decimal form. A label value is one tenant's: a tenant
whose value another tenant's label holds (``1`` while ``"1"`` has its label, or the
other way round) gets no label of its own while that one keeps it (it is summed under
``_other``, and a warning says so once per :class:`TenantMetrics`). Of two taking
labels at one refresh, the name takes it while every tenant fits in ``max_tenants``,
else the more served (ties: the name). A tenant named ``_other`` never has a label of its own
(that value is the sum's): it is summed under ``_other``, with the same warning.

In prometheus_client's multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``, how vLLM and
SGLang serve a scheduler process's metrics) the series live in files of vtc's own
(:mod:`vtc.multiproc`), from which a removed series leaves too.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import logging
import math
import os
import time
import warnings
import weakref
from collections.abc import Callable
from operator import mul
from typing import Any

from prometheus_client import REGISTRY, Counter, Gauge, Histogram

from vtc._core import FairnessWindow, MetricsMirror
from vtc.config import METRICS_CHANGES_READER
from vtc.multiproc import SeriesFiles
from vtc.observer import AdapterView, Observer, Tracked

__all__ = [
    "CHANGES_READER",
    "ENDED_KEPT_PER_LABEL",
    "LABEL_MARGIN",
    "OTHER",
    "RELABEL_INTERVAL",
    "TenantMetrics",
    "jain_index",
]

_log = logging.getLogger("vtc")

#: the reader slot of ``Scheduler.changes`` the metrics use, shared by every
#: TenantMetrics on one core: one that pulls after another did starts the slot again
#: (a full read; see :meth:`TenantMetrics._pull`); the slots are assigned in
#: :mod:`vtc.config` (the shared-counter sync reads ``SYNC_CHANGES_READER``)
CHANGES_READER = METRICS_CHANGES_READER

OTHER = "_other"
"""The ``tenant`` label of the tenants beyond ``max_tenants``."""


#: a tenant outside the labelled set takes the label of a labelled one outside the
#: top ``max_tenants`` when served more than ``1 + LABEL_MARGIN`` times as much over
#: the window: tenants served alike keep their labels (a swap ends series and
#: starts others, and rewrites vtc's multiprocess files)
LABEL_MARGIN = 1.0

#: seconds between two choices of the labelled set once every label is taken (the
#: default of ``TenantMetrics(relabel_interval=)``, ``VTC_METRICS_RELABEL_INTERVAL``)
RELABEL_INTERVAL = 10.0

_NO_SERIES: dict[Any, Any] = {}  # a tenant's series before its first (never written)

#: A counter series that ends (its tenant loses its label, or the core forgets it)
#: leaves its total behind; a series of the same labels made again (the tenant labelled
#: again) starts from it, so that rate() and increase() across the gap count only what
#: was served since: a new series from 0 reads as a counter reset only when its value
#: is below the old one, and a tenant back with more than that before the next scrape
#: would be undercounted by its whole old total. The totals of the last
#: ``ENDED_KEPT_PER_LABEL * max(1, max_tenants)`` series ended are kept (a tenant has
#: up to three counter series); older ones are dropped and their series start from 0.
ENDED_KEPT_PER_LABEL = 8

#: ``vtc_sync_seconds`` buckets: loopback syncs take ~0.2 ms, a timeout 100 ms
SYNC_BUCKETS = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class _Families:
    """The metric families of one registry (each can be registered only once)."""

    def __init__(self, registry: Any, files: SeriesFiles | None) -> None:
        self.files = files
        # every value :meth:`value` gave is one of vtc's files' (:meth:`write_all`)
        self._in_files = files is not None
        with self.creating():
            self._create(registry)

    def creating(self) -> contextlib.AbstractContextManager[None]:
        """The block in which series are made: with the values in vtc's own files
        in multiprocess mode."""
        return contextlib.nullcontext() if self.files is None else self.files.creating()

    def _create(self, registry: Any) -> None:
        reg = {"registry": registry}
        # Several scheduler processes may write one multiprocess directory (vLLM's
        # data-parallel ranks): a process's gauges go with it ("live"), requests
        # add up over them, active tenants show the most any one of them has (a
        # tenant active on two ranks would be counted twice by a sum), and the
        # rest are each process's own, the most recently written shown.
        live = {**reg, "multiprocess_mode": "livemostrecent"}
        summed = {**reg, "multiprocess_mode": "livesum"}
        most = {**reg, "multiprocess_mode": "livemax"}
        self.service = Counter(
            "vtc_tenant_service_tokens", "Tokens charged to a tenant", ["tenant", "kind"], **reg
        )
        self.counter = Gauge("vtc_tenant_counter", "A tenant's virtual counter", ["tenant"], **live)
        self.weight = Gauge(
            "vtc_tenant_weight",
            "A tenant's weight (VTC_WEIGHTS, VTC_WEIGHTS_FILE)",
            ["tenant"],
            **live,
        )
        self.requests = Gauge(
            "vtc_tenant_requests", "A tenant's requests by state", ["tenant", "state"], **summed
        )
        self.preemptions = Counter(
            "vtc_tenant_preemptions", "Preemptions of a tenant's requests", ["tenant"], **reg
        )
        self.active = Gauge(
            "vtc_tenants_active", "Tenants with waiting or running requests", **most
        )
        self.jain = Gauge(
            "vtc_fairness_jain_index", "Jain's index of backlogged tenants' service rates", **live
        )
        self.spread = Gauge("vtc_counter_spread", "Max - min counter of backlogged tenants", **live)
        self.bound = Gauge("vtc_fairness_bound", "The bound the counter spread stays under", **live)
        self.sync_seconds = Histogram(
            "vtc_sync_seconds",
            "Duration of one shared-counter sync with Redis (its round trips)",
            buckets=SYNC_BUCKETS,
            **reg,
        )
        self.sync_degraded = Gauge(
            "vtc_sync_degraded",
            "1 while shared counters are unreachable (VTC schedules locally)",
            **live,
        )
        self.labelled = (self.service, self.counter, self.weight, self.requests, self.preemptions)
        self.by_id = {id(m): m for m in self.labelled}
        # a child made by labels() of each labelled family, the pattern of the next
        # ones (:meth:`child`); none: prometheus_client's internals not as expected
        self._patterns: dict[int, Any] | None = (
            {} if _CHILDREN_TESTED and all(map(_has_children_dict, self.labelled)) else None
        )
        self.unlabelled = (
            self.active,
            self.jain,
            self.spread,
            self.bound,
            self.sync_seconds,
            self.sync_degraded,
        )

    # A tenant that gains a label gets ~6 series and one that loses it loses them:
    # through prometheus_client's labels() and remove() ~10-20 us each (labels()
    # builds the child through the metric's constructor, validating its name and
    # label names again; remove() looks the multiprocess variables up in the
    # environment), the largest part of a refresh with labels changing. These two
    # do what those calls do to the family's children (a dict under its lock, a
    # child made as labels() makes it) without the checks, which the first child
    # of each family passed; with prometheus_client's internals not as expected,
    # they call labels() and remove().
    def child(self, metric: Any, labelvalues: tuple[str, ...]) -> Any:
        """``metric.labels(*labelvalues)`` (str values, the right count), made in
        :meth:`creating`."""
        patterns = self._patterns
        pattern = None if patterns is None else patterns.get(id(metric))
        if pattern is None:
            child = metric.labels(*labelvalues)
            if patterns is not None:
                patterns[id(metric)] = child
            return child
        with metric._lock:
            child = metric._metrics.get(labelvalues)
            if child is None:
                child = object.__new__(type(pattern))
                child.__dict__.update(pattern.__dict__)  # name, labels, docs, mode
                child._labelvalues = labelvalues
                child._metric_init()  # its own value (and a counter's creation time)
                metric._metrics[labelvalues] = child
        return child

    # A refresh sets ~40 labelled tenants' gauges and adds ~30 tenants' tokens (1,000
    # tenants in vLLM's step): through a child's set() and inc() each call also checks
    # the child is observable (made by labels(): always, here) and, for a counter,
    # that the amount is not negative (token counts never are). The value a child
    # keeps (prometheus_client's, or vtc's in a multiprocess directory) has the same
    # set() and inc() without those checks.
    def value(self, child: Any) -> Any:
        """What a refresh sets or adds to for ``child``: the value it keeps, or, with
        prometheus_client's internals not as expected, the child (:class:`_Through`)."""
        value = getattr(child, "_value", None) if self._patterns is not None else None
        if value is None:
            value = _Through(child)
        if self.files is not None and not isinstance(value, self.files.value_class):
            self._in_files = False  # write_all: not every value is vtc's
        return value

    def write_all(self, writes: list[tuple[Any, float, float | None]], add: bool) -> None:
        """A refresh's writes, in order: each ``(value, amount, None)`` added to its
        value (``add``), or each ``(value, new, timestamp)`` set (None: no timestamp);
        values from :meth:`value`. In vtc's files, one call (SeriesFiles.write_all)."""
        if self._in_files:
            self.files.write_all(writes, add)  # type: ignore[union-attr]
        elif add:
            for value, amount, _ in writes:
                value.inc(amount)
        else:
            for value, new, timestamp in writes:
                value.set(new, timestamp)

    def remove(self, metric: Any, labelvalues: tuple[str, ...]) -> None:
        """``metric.remove(*labelvalues)`` (str values, the right count)."""
        if self._patterns is None:
            metric.remove(*labelvalues)
            return
        with metric._lock:
            metric._metrics.pop(labelvalues, None)


class _Through:
    """A child's ``set``/``inc`` with the call shape of the value it keeps (a gauge's
    ``set`` takes no timestamp: a ``mostrecent`` gauge's child stamps it itself)."""

    __slots__ = ("child",)

    def __init__(self, child: Any) -> None:
        self.child = child

    def set(self, value: float, timestamp: float | None = None) -> None:
        self.child.set(value)

    def inc(self, amount: float) -> None:
        self.child.inc(amount)

    def get(self) -> float:
        """The child's value (0.0 where it cannot be read: its series then starts anew
        when made again, as it did before :data:`ENDED_KEPT_PER_LABEL`)."""
        value = getattr(self.child, "_value", None)
        return float(value.get()) if value is not None else 0.0


def _children_tested(version: str) -> bool:
    """Whether :meth:`_Families.child` was tested against prometheus_client ``version``
    (its private layout of children): 0.26, what the test suites install. Any other
    version gets labels() and remove(), slower and safe."""
    parts = version.split(".")
    return parts[:2] == ["0", "26"]


def _prometheus_version() -> str:
    try:
        return importlib.metadata.version("prometheus_client")
    except importlib.metadata.PackageNotFoundError:  # vendored or renamed: not tested
        return ""


#: :meth:`_Families.child` and :meth:`_Families.remove` take prometheus_client's
#: private path only for a version they were tested against
_CHILDREN_TESTED = _children_tested(_prometheus_version())


def _has_children_dict(metric: Any) -> bool:
    """Whether a labelled family keeps its children as :meth:`_Families.child` expects
    (as prometheus_client 0.26 does): a dict of label values to children under a
    lock, each child's value made by its ``_metric_init``."""
    return (
        isinstance(getattr(metric, "_metrics", None), dict)
        and hasattr(metric, "_lock")
        and callable(getattr(metric, "_metric_init", None))
        and getattr(metric, "_labelvalues", None) == ()
    )


def _label(tenant: int | str) -> str:
    """The ``tenant`` label value of a core's key: a name as it is, an int key's
    decimal form (so ``1`` and ``"1"`` have the same: :meth:`TenantMetrics._claim`)."""
    return tenant if type(tenant) is str else str(tenant)


def _by_name(tenant: int | str) -> tuple[str, bool]:
    """The order of tenants' ties: by label value, a name before an int key (keys of
    both types are not comparable)."""
    return (_label(tenant), type(tenant) is not str)


# registry -> (the multiprocess directory then, its families), held weakly: a registry
# dropped (a test's, an engine's made and let go) takes its families with it, and in a
# multiprocess directory vtc's open files (SeriesFiles). A registry that cannot be
# referenced weakly is held by id for the process's life (_HELD).
_BY_REGISTRY: weakref.WeakKeyDictionary[Any, tuple[str, _Families]] = weakref.WeakKeyDictionary()
_HELD: dict[int, tuple[Any, str, _Families]] = {}


def _registry_entry(registry: Any) -> tuple[str, _Families] | None:
    """``registry``'s (directory, families), or None."""
    try:
        return _BY_REGISTRY.get(registry)
    except TypeError:  # not weakly referable, or not hashable
        held = _HELD.get(id(registry))
        return held[1:] if held is not None and held[0] is registry else None


def _keep_entry(registry: Any, entry: tuple[str, _Families]) -> None:
    try:
        _BY_REGISTRY[registry] = entry
    except TypeError:
        _HELD[id(registry)] = (registry, *entry)


#: id(core) -> the TenantMetrics that last pulled the core's reader slot
#: :data:`CHANGES_READER`: another that pulls it next starts the slot again (a full
#: read), so two TenantMetrics on one core each stay right (at a full read a refresh)
_READERS: dict[int, weakref.ref[Any]] = {}


def _reader_gone(key: int) -> Callable[[weakref.ref[Any]], None]:
    """The weakref callback that drops ``_READERS[key]`` when its TenantMetrics is
    collected (if the entry is still that one): the table holds one entry per live
    puller, not one per core ever read."""

    def drop(ref: weakref.ref[Any]) -> None:
        if _READERS.get(key) is ref:
            del _READERS[key]

    return drop


def _release_reader(key: int, metrics: Any) -> None:
    """Drop ``_READERS[key]`` if ``metrics`` holds it (it moves to another core)."""
    ref = _READERS.get(key)
    if ref is not None and ref() is metrics:
        del _READERS[key]


def _families(registry: Any) -> _Families:
    """The families of ``registry`` (prometheus_client's default if None), created
    once per process and multiprocess directory; a new :class:`TenantMetrics` (a
    new engine in this process) clears the series the last one left.

    With ``PROMETHEUS_MULTIPROC_DIR`` set (read now: the engine may set it after
    prometheus_client was imported) the values go to vtc's own files there."""
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR") or os.environ.get(
        "prometheus_multiproc_dir", ""
    )
    registry = REGISTRY if registry is None else registry
    entry = _registry_entry(registry)
    if entry is not None and entry[0] != directory:
        for metric in entry[1].labelled + entry[1].unlabelled:  # another directory now
            registry.unregister(metric)
    if entry is None or entry[0] != directory:
        files = None
        if directory:
            files = SeriesFiles(directory)
            _silence_removal_warnings()
        entry = (directory, _Families(registry, files))
        _keep_entry(registry, entry)
    else:
        families = entry[1]
        for metric in families.labelled:
            metric.clear()
        if families.files is not None:
            families.files.remove_tenants()
            families.files.compact()
    return entry[1]


def _silence_removal_warnings() -> None:
    """Drop prometheus_client's warning that removing a series is not implemented in
    multiprocess mode: for vtc's series, :mod:`vtc.multiproc` implements it. A filter
    added once (``catch_warnings`` around each call would swap the process's filters
    under the other threads' feet)."""
    warnings.filterwarnings(
        "ignore",
        message="(Removal of|Clearing) labels",
        category=UserWarning,
        module="prometheus_client",
    )


def jain_index(rates: list[float]) -> float:
    """Jain's fairness index ``(sum x)^2 / (n * sum x^2)``: 1 when all are equal,
    ``1/n`` when one gets everything; NaN for no rates or all zero."""
    square = sum(map(mul, rates, rates))
    if not rates or square <= 0.0:
        return math.nan
    return sum(rates) ** 2 / (len(rates) * square)


class TenantMetrics(Observer):
    """The series of the module doc, in ``registry`` (prometheus_client's default
    registry if None).

    ``interval``: seconds between two gauge refreshes (0: every step);
    ``relabel_interval``: seconds between two choices of the labelled set, at a
    refresh, once every label is taken (0: at every refresh; :meth:`_relabel`);
    ``window``: seconds of service Jain's index and the labelled set look at;
    ``budget``: the KV budget ``M`` of the fairness bound (None: unknown).
    """

    def __init__(
        self,
        registry: Any = None,
        *,
        max_tenants: int = 100,
        interval: float = 1.0,
        relabel_interval: float = RELABEL_INTERVAL,
        window: float = 30.0,
        budget: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_tenants < 1:
            raise ValueError(f"max_tenants must be >= 1, got {max_tenants}")
        if not (interval >= 0.0 and window > 0.0):
            raise ValueError(f"interval must be >= 0 and window > 0, got {interval}, {window}")
        if not relabel_interval >= 0.0:
            raise ValueError(f"relabel_interval must be >= 0, got {relabel_interval}")
        families = self._families = _families(registry)
        self.service = families.service
        self.counter = families.counter
        self.weight = families.weight
        self.requests = families.requests
        self.preemptions = families.preemptions
        self.active = families.active
        self.jain = families.jain
        self.spread = families.spread
        self.bound = families.bound
        self.sync_seconds = families.sync_seconds
        self.sync_degraded = families.sync_degraded
        self.max_tenants = max_tenants
        self.interval = interval
        self.relabel_interval = relabel_interval
        self.window = window
        self.budget = budget
        self._clock = clock
        self._last = -math.inf
        self._relabelled = -math.inf  # when the labelled set was last chosen (full)
        self._idle = True
        self._longest = 0  # the longest prompt admitted (L of the bound)
        # preemptions not yet on the series, by tenant
        # (tenants are the core's keys, as they are: names, or int keys)
        self._preempt: dict[int | str, int] = {}
        # the mirror of every tenant the core has, from Scheduler.changes, in the
        # core: its rows, the token increments not yet on the series, the totals
        self._core: Any = None  # the core mirrored
        self._mirror = MetricsMirror()
        self._removed = 0  # the mirror's count of tenants dropped, at the last relabelling
        self._n_active = 0  # tenants with waiting or running requests, at the last refresh
        self._labelled: set[int | str] = set()  # tenants with their own series
        self._warned = False  # of a tenant passed over: its label value was taken
        # tenant -> {(metric id, *labels): [child, last value set]}
        self._series: dict[int | str, dict[tuple[Any, ...], list[Any]]] = {}
        # labelled tenant -> its counter, weight, waiting and running entries of _series
        self._rows: dict[int | str, tuple[list[Any], ...]] = {}
        # (counter family id, label value, *labels) -> an ended series' total, oldest
        # first (ENDED_KEPT_PER_LABEL)
        self._ended: dict[tuple[Any, ...], float] = {}
        # the window's snapshots of every tenant's service, in the core
        self._fairness = FairnessWindow(window)

    # -- observer points ---------------------------------------------------------------
    # Tokens are not observed charge by charge: the core keeps each tenant's
    # tallies (Scheduler.tokens), read at refresh, and before it forgets.
    def admitted(self, t: Tracked, prompt_tokens: int) -> None:
        if t.prompt_len > self._longest:
            self._longest = t.prompt_len

    def forgetting(self, core: Any) -> None:
        self._pull(core)  # the tallies of the tenants it forgets go with them

    def preempted(self, t: Tracked) -> None:
        self._preempt[t.tenant] = self._preempt.get(t.tenant, 0) + 1

    def forgot(self, tenants: list[str]) -> None:
        labelled = self._labelled
        # an unlabelled tenant's tokens go to _other now, a labelled one's stay its
        # own until the next refresh's labels
        self._mirror.drop([t for t in tenants if t not in labelled], True)
        self._mirror.drop([t for t in tenants if t in labelled], False)
        for tenant in tenants:
            self._fold_into_other(tenant)
            self._remove(tenant)
            labelled.discard(tenant)
        self._compact()

    def stepped(self, adapter: AdapterView) -> None:
        # Refresh every `interval`, and at the step that leaves the engine idle:
        # no step follows it to carry its last tokens to the series.
        now = self._clock()
        idle = len(adapter.requests) == 0
        if now - self._last >= self.interval or (idle and not self._idle):
            self._last = now
            self.refresh(adapter, now)
        self._idle = idle

    # -- refresh ------------------------------------------------------------------------
    # Per-tenant Python work is for the tenants changed since the last refresh (the
    # core lists them: Scheduler.changes), the labelled ones whose values changed,
    # and the relabelling's candidates; what looks at every tenant is a pass in Rust
    # (vtc._core.FairnessWindow: the window's snapshots, Jain's index, the spread,
    # every tenant's gain against the relabelling's bar), not a Python loop.
    def refresh(self, adapter: AdapterView, now: float | None = None) -> None:
        """Bring every series up to date with ``adapter``'s core now."""
        now = self._clock() if now is None else now
        self._pull(adapter.core)

        # Jain's index and the spread over the backlogged tenants, from the core's
        # own snapshots of the window (FairnessWindow: one pass in Rust), which
        # then gives the tenants' gains over the window for the labels.
        jain, spread, _ = self._fairness.refresh(adapter.core, now)
        self._relabel(adapter.core, now)
        labelled = self._labelled
        # the labelled tenants' rows (changed, or without their gauges yet) and
        # increments, and the sums of the rest (MetricsMirror.take: one call)
        names = list(labelled)
        rows = self._rows
        taken, increments, other_p, other_d, other_w, other_r, n_active = self._mirror.take(
            names, labelled - rows.keys()
        )
        self._n_active = n_active
        preempt = self._preempt
        unlabelled = preempt.keys() - labelled
        if unlabelled:  # to _other (its own increments included)
            preempt[OTHER] = sum(map(preempt.pop, unlabelled))
        service, child, series_of = self.service, self._child, self._series
        prompt_key, decode_key = (id(service), "prompt"), (id(service), "decode")  # _child's
        families = self._families
        writes: list[tuple[Any, float, float | None]] = []  # one call for them all
        add = writes.append
        for i, p, d in increments:
            tenant = names[i]
            series = series_of.get(tenant, _NO_SERIES)
            if p:
                add(((series.get(prompt_key) or child(service, tenant, "prompt"))[0], p, None))
            if d:
                add(((series.get(decode_key) or child(service, tenant, "decode"))[0], d, None))
        if other_p:
            add((child(service, OTHER, "prompt")[0], other_p, None))
        if other_d:
            add((child(service, OTHER, "decode")[0], other_d, None))
        for tenant, n in preempt.items():
            add((child(self.preemptions, tenant)[0], n, None))
        preempt.clear()
        families.write_all(writes, True)

        weight = adapter.tenancy.weight
        stamp = time.time()  # of the "mostrecent" gauges (as their set() stamps them)
        writes = []
        add = writes.append
        for i, c, w, r in taken:
            tenant = names[i]
            row = rows.get(tenant) or self._row(tenant)
            counter, weighs, waiting, running = row  # [value, last value set] each
            if c is not None and counter[1] != c:
                add((counter[0], float(c), stamp))
                counter[1] = c
            v = weight(tenant)
            if weighs[1] != v:
                add((weighs[0], float(v), stamp))
                weighs[1] = v
            if waiting[1] != w:
                add((waiting[0], float(w), None))
                waiting[1] = w
            if running[1] != r:
                add((running[0], float(r), None))
                running[1] = r
        families.write_all(writes, False)
        if other_w or other_r or OTHER in self._series:
            self._set(self.requests, OTHER, "waiting", value=other_w)
            self._set(self.requests, OTHER, "running", value=other_r)

        sharing = getattr(adapter, "sharing", None)
        if sharing is not None:
            durations = sharing.shared.durations
            while durations:
                self.sync_seconds.observe(durations.popleft())
            self.sync_degraded.set(1.0 if sharing.shared.degraded else 0.0)
        self.active.set(self._n_active)
        self.spread.set(spread)
        config = adapter.config
        if self.budget is None:
            self.bound.set(math.nan)
        else:
            self.bound.set(2.0 * max(config.wp * self._longest, config.wq * self.budget))
        # Jain's index: the tenants backlogged at the window's start and now. The
        # core's services are already per unit of weight: fair shares are equal.
        # (Services gained, not rates: the index does not change with the scale.)
        # None: the window has no start before now yet (the first refresh).
        if jain is not None:
            self.jain.set(jain)
        self._compact()

    def _pull(self, core: Any) -> None:
        """Apply the core's changes since the last pull to the mirror
        (``MetricsMirror.read``: the changed tenants' rows, their token increments,
        the totals, the tenants forgotten dropped), at each refresh and before the
        core forgets tenants (whose tallies go with them; their increments stay theirs
        in the mirror until :meth:`forgot` or the next refresh). A core not pulled from before (a
        new TenantMetrics, another core), or whose reader slot another TenantMetrics
        pulled from since (:data:`_READERS`), starts the slot again: a full read,
        after which the tenants no longer there are dropped."""
        reader = _READERS.get(id(core))
        if core is not self._core or reader is None or reader() is not self:
            core.reset_changes(CHANGES_READER)
            if self._core is not None and core is not self._core:
                _release_reader(id(self._core), self)
            self._core = core
            _READERS[id(core)] = weakref.ref(self, _reader_gone(id(core)))
        self._mirror.read(core, CHANGES_READER)

    def _relabel(self, core: Any, now: float) -> None:
        """Give at most ``max_tenants`` of the most served tenants (their service
        gained over the window, as of this refresh) their own series, with
        hysteresis: a free label goes to the most served tenant without one (ties:
        by name); a tenant without a label takes the label of the least served
        labelled tenant once it was served more than ``1 + LABEL_MARGIN`` times as
        much. After a choice of labels with every label taken,
        no tenant without a label was served more than ``1 + LABEL_MARGIN`` times as
        much as any tenant with one, but for a tenant whose label value another
        tenant's label holds (:meth:`_claim`).

        With more tenants than labels the choice is one call in Rust
        (``FairnessWindow.relabel``: the labelled tenants' gains, every tenant's gain
        against the bar, the candidates' order and label values, the swaps), and
        the Python work is for the labels that change; with every tenant fitting, the
        new ones take labels here (by name).

        With more tenants than labels, the choice is made at most every
        ``relabel_interval`` seconds (a free label is taken at the next refresh): a
        label that changes ends series and starts others, and into a multiprocess
        directory rewrites vtc's files (~0.7 ms each), which at every refresh would
        cost more than the rest of it."""
        limit, labelled, tenants = self.max_tenants, self._labelled, self._mirror
        removed = tenants.removed
        if removed != self._removed:  # the mirror dropped tenants since
            self._removed = removed
            for tenant in [t for t in labelled if t not in tenants]:  # the core forgot it
                self._remove(tenant)
                labelled.discard(tenant)
        if len(tenants) <= limit:
            new = set(tenants.keys()) - labelled
            if new:
                labelled.update(t for _, t in self._claim(sorted((_by_name(t), t) for t in new)))
            return
        if len(labelled) >= limit and now - self._relabelled < self.relabel_interval:
            return
        self._relabelled = now
        # The labelled tenants' gains, the bar, the candidates above it (in Rust, over
        # every tenant), their order and label values, and the swaps: one call
        # (vtc._core.FairnessWindow.relabel, the rule above), then only the changes.
        names = list(labelled)
        dropped, taken, swaps, clash = self._fairness.relabel(
            core, names, limit, 1.0 + LABEL_MARGIN, OTHER
        )
        for i in dropped:  # pragma: no cover - max_tenants lowered: the least served go
            self._remove(names[i])
            labelled.discard(names[i])
        if clash is not None:
            self._passed_over(*clash)
        labelled.update(taken)
        for new, i in swaps:
            old = names[i]
            self._remove(old)
            labelled.discard(old)
            labelled.add(new)

    def _claim(self, rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        """``rows`` (each ending with a tenant without a label, in the order they take
        labels) less those whose label value a labelled tenant or an earlier row's
        tenant holds: a label value is one tenant's, else two tenants (``1`` and
        ``"1"``) would add to one series. Such a tenant stays under ``_other`` (its
        mirror, tallies and gains are its own); the first is logged."""
        held: dict[str, int | str | None] = {OTHER: None}  # _other's: no tenant's
        held.update((_label(t), t) for t in self._labelled)
        kept = []
        for row in rows:
            tenant = row[-1]
            label = _label(tenant)
            if label not in held:
                held[label] = tenant
                kept.append(row)
            else:
                self._passed_over(held[label], tenant)
        return kept

    def _passed_over(self, holder: int | str | None, tenant: int | str) -> None:
        """Log, the first time only, that ``tenant`` gets no label: ``holder`` has its
        label value (None: ``_other``'s, the sum of the tenants without a label)."""
        if self._warned:
            return
        self._warned = True
        if holder is None:
            _log.warning(
                "vtc metrics: tenant %r has the label value of the series that sums the "
                "tenants without a label of their own: it gets no series of its own "
                "(summed under %r)",
                tenant,
                OTHER,
            )
            return
        _log.warning(
            "vtc metrics: tenants %r and %r have the same tenant label value %r: "
            "%r gets no series of its own while %r has the label (summed under %r)",
            holder,
            tenant,
            _label(tenant),
            tenant,
            holder,
            OTHER,
        )

    def _fold_into_other(self, tenant: int | str) -> None:
        """Move ``tenant``'s pending preemptions to ``_other`` unless it is labelled
        (its tokens: ``MetricsMirror.drop``)."""
        if tenant in self._labelled:
            return
        pending = self._preempt
        n = pending.pop(tenant, 0)
        if n:
            pending[OTHER] = pending.get(OTHER, 0) + n

    def _child(self, metric: Any, tenant: int | str, *labels: str) -> list[Any]:
        """``[value, last value set]`` of a series (``value``: what
        :meth:`_Families.value` gives, to ``set`` or ``inc``), its child made once
        (labels() is slow: it validates and locks on every call)."""
        series = self._series.get(tenant)
        if series is None:
            series = self._series[tenant] = {}
        key = (id(metric), *labels)
        entry = series.get(key)
        if entry is None:
            families = self._families
            label = _label(tenant)
            with families.creating():
                child = families.child(metric, (label, *labels))
                entry = series[key] = [families.value(child), None]
            if self._ended:
                total = self._ended.pop((id(metric), label, *labels), None)
                if total:  # its series ended: this one goes on from its total
                    entry[0].inc(total)
        return entry

    def _row(self, tenant: int | str) -> tuple[list[Any], ...]:
        """The entries of a labelled tenant's gauges: its counter, weight, waiting
        and running requests (made at once: a tenant that gains its label has every
        series at the refresh, an idle one too)."""
        row = self._rows[tenant] = (
            self._child(self.counter, tenant),
            self._child(self.weight, tenant),
            self._child(self.requests, tenant, "waiting"),
            self._child(self.requests, tenant, "running"),
        )
        return row

    def _set(self, metric: Any, tenant: int | str, *labels: str, value: float) -> None:
        entry = self._child(metric, tenant, *labels)
        if entry[1] != value:
            entry[0].set(float(value))
            entry[1] = value

    def _remove(self, tenant: int | str) -> None:
        """Remove every series of ``tenant`` (from vtc's files at :meth:`_compact`):
        none without series of its own (its label value may be another tenant's)."""
        self._rows.pop(tenant, None)
        series = self._series.pop(tenant, None)
        if series is None:
            return
        families = self._families
        metrics, remove = families.by_id, families.remove
        label = _label(tenant)
        counters, ended = (id(families.service), id(families.preemptions)), self._ended
        for (metric_id, *labels), entry in series.items():
            if metric_id in counters:  # its total kept for a series made again
                total = entry[0].get()
                if total:
                    key = (metric_id, label, *labels)
                    ended.pop(key, None)  # newest last
                    ended[key] = total
            try:
                remove(metrics[metric_id], (label, *labels))
            except KeyError:  # pragma: no cover - already gone
                pass
        while len(ended) > ENDED_KEPT_PER_LABEL * max(1, self.max_tenants):
            del ended[next(iter(ended))]
        files = families.files
        if files is not None:
            files.remove(label)

    def _compact(self) -> None:
        """Rewrite vtc's multiprocess files that still hold removed series."""
        files = self._families.files
        if files is not None:
            files.compact()
