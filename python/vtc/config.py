"""Configuration and tenancy shared by the engine integrations (vLLM and SGLang).

Every ``VTC_*`` variable the engine shells read is parsed here, once, by one
rule: an unset or empty (all-whitespace) variable takes its default; any other
value must be well formed, or :class:`ConfigError` names the variable, the
value and what is allowed. Nothing is skipped silently. Importable and
testable without either engine installed.

=====================  ==========================================================
variable               meaning (default)
=====================  ==========================================================
``VTC_TENANT_KEY``     request field that names the tenant (``tenant``)
``VTC_WEIGHTS``        ``TENANT=WEIGHT`` entries separated by ``,`` (none)
``VTC_WEIGHTS_FILE``   path of a JSON object ``{tenant: weight}``; an entry of
                       ``VTC_WEIGHTS`` wins over the file's for the same tenant
``VTC_WEIGHTS_RELOAD`` seconds between checks of ``VTC_WEIGHTS_FILE`` for a
                       change, which is then re-read; 0 reads it only at start (1)
``VTC_PRIORITY_WEIGHTS`` ``PRIORITY=WEIGHT`` entries separated by ``,``: request
                       priorities share service by weight, a priority not listed
                       weighing 1 (none: strict bands, the more urgent first);
                       the engine's own priority values (docs/priority.md)
``VTC_WP``             price of a prompt token (1), in [0, 1e9]
``VTC_WQ``             price of a generated token (2), in [0, 1e9]; not both 0
``VTC_MAX_TENANTS``    active tenants tracked before new ones share the default
                       tenant (10000; :class:`vtc.adapter.Tenancy`)
``VTC_LOG_INTERVAL``   seconds between tenant log lines, 0 for none (10)
``VTC_TRACE_FILE``     JSON-lines tenant trace to append to (none)
``VTC_TRACE_INTERVAL`` seconds between trace records (0.1)
``VTC_METRICS``        per-tenant Prometheus series (:mod:`vtc.metrics`): ``auto``
                       (on when the engine serves this process's metrics: vLLM
                       with ``PROMETHEUS_MULTIPROC_DIR``, SGLang with
                       ``--enable-metrics``), ``on`` or ``off`` (``auto``)
``VTC_METRICS_MAX_TENANTS`` tenants with their own ``tenant`` label, the rest
                       summed as ``_other`` (100)
``VTC_METRICS_INTERVAL`` seconds between refreshes of the series (1)
``VTC_METRICS_RELABEL_INTERVAL`` seconds between two choices of the tenants with
                       a label once every label is taken (10)
``VTC_LOCALITY_QUANTUM`` the locality window ``Q`` in weighted tokens, a finite
                       number >= 0: a tenant within ``Q`` of the least served may
                       go first if the engine holds more of its next request's
                       prompt cached (docs/locality.md); 0 is plain VTC (0)
=====================  ==========================================================

Weights are checked by the core's own rule (a finite number in [1e-6, 1e6]).
Shared counters across replicas (:mod:`vtc.distributed`) are configured by
:data:`SHARED_VARIABLES`, parsed by :func:`shared_counter_settings` by the same rule:

=========================  =====================================================
``VTC_REDIS_URL``          ``redis://``, ``rediss://`` or ``unix://`` URL of the
                           shared store (none: one replica, nothing shared)
``VTC_REDIS_NAMESPACE``    key namespace, at most 256 characters without ``{``
                           or ``}`` (``default``)
``VTC_SYNC_INTERVAL``      engine steps between syncs, an integer >= 1 (10)
``VTC_SYNC_MS``            also sync after this many milliseconds, > 0 (none)
``VTC_REPLICA_ID``         this replica's name, unique among live replicas (host-pid-random)
``VTC_REDIS_TIMEOUT_MS``   socket timeouts in milliseconds, > 0 (100)
``VTC_SYNC_MODE``          engines: ``background`` (a thread syncs every
                           ``VTC_SYNC_MS``, default 50) or ``step`` (on the
                           engine thread every ``VTC_SYNC_INTERVAL`` steps)
``VTC_SYNC_LIVENESS_MS``   a replica silent this long is taken for dead, its
                           waiting tenants leave the global backlog; > 0 and
                           above the background period (10000)
``VTC_SYNC_RETRY_MS``      after a failed sync, the store is not tried again
                           for this long, > 0 (1000)
``VTC_SYNC_FORGET_MS``     the store forgets the counter of a tenant no replica
                           has had waiting or charged this long, once it is at
                           most the global floor; > 0 (60000)
``VTC_SYNC_CPU_SHARE``     background syncs: the most of the time their CPU may
                           take; a sync that cost more than this share of its
                           period stretches the pause after it, a number in
                           (0, 1] (0.005)
=========================  =====================================================

:func:`check_env` validates all of them at once; the engines call it at start-up,
before the model loads (vLLM through the ``vllm.general_plugins`` entry point
:func:`vtc.vllm_plugin.validate`, SGLang in :func:`vtc.sglang.register`).

Tenancy, the same in both engines: a tenant is named by a non-empty ``str`` of
at most :data:`MAX_TENANT_LEN` characters, or by an ``int`` (never a ``bool``),
which names the same tenant as its decimal string. Each engine looks at a few
request fields in a fixed order (see its module); the first that names a
tenant decides, a field holding anything else is treated as absent, and a
request naming none is billed to :data:`DEFAULT_TENANT`. A request is never
refused for its tenant.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from vtc._core import CHANGE_READERS, MAX_PRICE, Scheduler
from vtc.errors import InvalidArgumentError

__all__ = [
    "DEFAULT_TENANT",
    "DEFAULT_TENANT_KEY",
    "MAX_TENANT_LEN",
    "METRICS_CHANGES_READER",
    "SHARED_VARIABLES",
    "SYNC_CHANGES_READER",
    "VARIABLES",
    "ConfigError",
    "EngineConfig",
    "SharedCounterSettings",
    "check_env",
    "configured",
    "first_tenant",
    "parse_weights",
    "shared_counter_settings",
    "tenant_name",
]

DEFAULT_TENANT = "default"
DEFAULT_TENANT_KEY = "tenant"
#: Longest tenant name; a longer value does not name a tenant.
MAX_TENANT_LEN = 128

#: Every variable :meth:`EngineConfig.from_env` reads.
VARIABLES = (
    "VTC_TENANT_KEY",
    "VTC_WEIGHTS",
    "VTC_WEIGHTS_FILE",
    "VTC_WEIGHTS_RELOAD",
    "VTC_PRIORITY_WEIGHTS",
    "VTC_WP",
    "VTC_WQ",
    "VTC_MAX_TENANTS",
    "VTC_LOG_INTERVAL",
    "VTC_TRACE_FILE",
    "VTC_TRACE_INTERVAL",
    "VTC_METRICS",
    "VTC_METRICS_MAX_TENANTS",
    "VTC_METRICS_INTERVAL",
    "VTC_METRICS_RELABEL_INTERVAL",
    "VTC_LOCALITY_QUANTUM",
)

#: Every variable :func:`shared_counter_settings` reads (:mod:`vtc.distributed`).
SHARED_VARIABLES = (
    "VTC_REDIS_URL",
    "VTC_REDIS_NAMESPACE",
    "VTC_SYNC_INTERVAL",
    "VTC_SYNC_MS",
    "VTC_REPLICA_ID",
    "VTC_REDIS_TIMEOUT_MS",
    "VTC_SYNC_MODE",
    "VTC_SYNC_LIVENESS_MS",
    "VTC_SYNC_RETRY_MS",
    "VTC_SYNC_FORGET_MS",
    "VTC_SYNC_CPU_SHARE",
)

#: Longest ``VTC_REDIS_NAMESPACE`` (``vtc.distributed.check_namespace``'s rule).
MAX_NAMESPACE_LEN = 256

#: URL schemes redis-py's ``Redis.from_url`` accepts.
REDIS_SCHEMES = ("redis", "rediss", "unix")

#: ``VTC_METRICS`` values, and the mode each one means.
METRICS_MODES = {
    "auto": "auto",
    "on": "on",
    "1": "on",
    "true": "on",
    "yes": "on",
    "off": "off",
    "0": "off",
    "false": "off",
    "no": "off",
}


class ConfigError(ValueError):
    """A malformed ``VTC_*`` setting; the message names it, its value and what is allowed."""


# -- tenancy -----------------------------------------------------------------------------


def tenant_name(value: Any) -> str | None:
    """``value`` as a tenant name, or None if it cannot name one (see the module doc)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str) and 0 < len(value) <= MAX_TENANT_LEN:
        return value
    return None


def first_tenant(values: Iterable[Any]) -> str | None:
    """The first of ``values`` (request fields, in the engine's order) that names a
    tenant; None if none does. Anything that cannot name one is skipped."""
    for value in values:
        if type(value) is str:  # the usual field: tenant_name's rule for a str, inline
            if 0 < len(value) <= MAX_TENANT_LEN:
                return value
            continue
        name = tenant_name(value)
        if name is not None:
            return name
    return None


# -- values ------------------------------------------------------------------------------


def _check_weight(where: str, tenant: str, weight: float, shown: Any) -> float:
    try:
        Scheduler(1).set_weight(tenant, weight)  # the core's rule, not a copy of it
    except InvalidArgumentError as e:
        raise ConfigError(f"{where}: weight of tenant {tenant!r} is {shown!r}: {e}") from None
    return weight


def _pairs(text: str | None, variable: str, form: str) -> Iterator[tuple[str, str, str]]:
    """The ``NAME=VALUE`` entries of ``text`` separated by ``,`` (blanks and empty
    entries ignored), as ``(where, name, value)`` with ``where`` naming the variable
    and the entry for messages; an entry without ``=`` raises :class:`ConfigError`."""
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, value = item.partition("=")
        where = f"{variable} entry {item!r}"
        if not sep:
            raise ConfigError(f"{where} has no '=': {form}")
        yield where, name.strip(), value.strip()


def parse_weights(text: str | None, variable: str = "VTC_WEIGHTS") -> dict[str, float]:
    """Parse ``"gold=2, free=0.5"`` into ``{"gold": 2.0, "free": 0.5}``.

    Entries are separated by ``,``; blanks around names and values and empty
    entries are ignored. A tenant named twice, a name that is not a tenant
    (empty, too long) or holds ``=``, and a weight outside the core's range
    raise :class:`ConfigError` naming ``variable`` and the entry. (A tenant
    whose name holds ``=`` or ``,`` is weighted in ``VTC_WEIGHTS_FILE``.)
    """
    weights: dict[str, float] = {}
    form = "entries are TENANT=WEIGHT separated by ','"
    for where, name, value in _pairs(text, variable, form):
        tenant = tenant_name(name)
        if tenant is None:
            raise ConfigError(
                f"{where}: {name!r} is not a tenant name (1 to {MAX_TENANT_LEN} characters)"
            )
        try:
            weight = float(value)
        except ValueError:
            raise ConfigError(f"{where}: weight {value!r} is not a number; {form}") from None
        if tenant in weights:
            raise ConfigError(f"{where}: tenant {tenant!r} is given twice in {variable}")
        weights[tenant] = _check_weight(variable, tenant, weight, value)
    return weights


def parse_priority_weights(
    text: str | None, variable: str = "VTC_PRIORITY_WEIGHTS"
) -> dict[int, float] | None:
    """Parse ``"0=4, 1=1"`` into ``{0: 4.0, 1: 1.0}``; None when there are no
    entries (strict bands).

    Entries are separated by ``,``; blanks and empty entries are ignored. A
    priority that is not a 64-bit integer or is given twice, and a weight
    outside the core's range raise :class:`ConfigError` naming ``variable``
    and the entry.
    """
    weights: dict[int, float] = {}
    form = "entries are PRIORITY=WEIGHT separated by ',', PRIORITY an integer"
    for where, name, value in _pairs(text, variable, form):
        try:
            priority = int(name)
        except ValueError:
            raise ConfigError(f"{where}: priority {name!r} is not an integer; {form}") from None
        if not -(2**63) <= priority < 2**63:
            raise ConfigError(f"{where}: priority {priority} does not fit in 64 bits")
        try:
            weight = float(value)
        except ValueError:
            raise ConfigError(f"{where}: weight {value!r} is not a number; {form}") from None
        if priority in weights:
            raise ConfigError(f"{where}: priority {priority} is given twice in {variable}")
        try:
            Scheduler(1).set_band_weights({priority: weight})  # the core's rule
        except InvalidArgumentError as e:
            raise ConfigError(f"{where}: weight of priority {priority} is {value!r}: {e}") from None
        weights[priority] = weight
    return weights or None


def merge_weights(
    from_file: Mapping[str, float] | None, from_env: Mapping[str, float]
) -> dict[str, float]:
    """The weights in force: the file's, with ``VTC_WEIGHTS`` entries over them."""
    weights = dict(from_file or {})
    weights.update(from_env)
    return weights


def load_weights_file(path: str) -> dict[str, float]:
    """The ``{tenant: weight}`` of ``VTC_WEIGHTS_FILE`` at ``path``; :class:`ConfigError`
    names the path and what is wrong (unreadable, not UTF-8, not JSON, a tenant given
    twice, a name that is not a tenant, a weight outside the core's range)."""
    where = f"VTC_WEIGHTS_FILE {path!r}"

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in items:
            if k in out:
                raise ConfigError(f"{where}: tenant {k!r} is given twice")
            out[k] = v
        return out

    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f, object_pairs_hook=pairs)
    except OSError as e:
        raise ConfigError(f"{where} cannot be read: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{where} is not UTF-8 text: {e}") from None
    except json.JSONDecodeError as e:
        raise ConfigError(
            f"{where} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg}); "
            'expected an object of tenant: weight, e.g. {"gold": 2, "free": 0.5}'
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(
            f"{where} holds a JSON {type(data).__name__}; expected an object of tenant: weight"
        )
    weights: dict[str, float] = {}
    for name, value in data.items():
        tenant = tenant_name(name)
        if tenant is None:
            raise ConfigError(
                f"{where}: {name!r} is not a tenant name (1 to {MAX_TENANT_LEN} characters)"
            )
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: weight of tenant {tenant!r} is {value!r}, not a number")
        try:
            weight = float(value)
        except OverflowError:
            weight = math.inf
        weights[tenant] = _check_weight(where, tenant, weight, value)
    return weights


def _text(env: Mapping[str, str], name: str) -> str | None:
    """The variable's value stripped, or None when it is unset or blank."""
    text = env.get(name)
    if text is None or not text.strip():
        return None
    return text.strip()


def _number(env: Mapping[str, str], name: str, default: float, maximum: float = math.inf) -> float:
    text = _text(env, name)
    if text is None:
        return default
    allowed = f"a number in [0, {maximum:g}]" if maximum < math.inf else "a finite number >= 0"
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{name}={text!r} is not a number; expected {allowed}") from None
    if not (math.isfinite(value) and 0.0 <= value <= maximum):
        raise ConfigError(f"{name}={text!r} is out of range; expected {allowed}")
    return value


def _count(env: Mapping[str, str], name: str, default: int) -> int:
    text = _text(env, name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"{name}={text!r} is not an integer; expected an integer >= 1") from None
    if value < 1:
        raise ConfigError(f"{name}={text!r} is out of range; expected an integer >= 1")
    return value


def _ranged(
    env: Mapping[str, str], name: str, allowed: str, in_range: Callable[[float], bool]
) -> float | None:
    """A number for which ``in_range`` holds (``allowed`` says which, in the error), or
    None when the variable is unset or blank."""
    text = _text(env, name)
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{name}={text!r} is not a number; expected {allowed}") from None
    if not in_range(value):
        raise ConfigError(f"{name}={text!r} is out of range; expected {allowed}")
    return value


def _positive(env: Mapping[str, str], name: str) -> float | None:
    """A finite number > 0, or None when the variable is unset or blank."""
    return _ranged(env, name, "a finite number > 0", lambda v: math.isfinite(v) and v > 0.0)


def _share(env: Mapping[str, str], name: str) -> float | None:
    """A number in (0, 1], or None when the variable is unset or blank."""
    return _ranged(env, name, "a number in (0, 1]", lambda v: 0.0 < v <= 1.0)  # nan: False


def _metrics_mode(env: Mapping[str, str]) -> str:
    text = _text(env, "VTC_METRICS")
    if text is None:
        return "auto"
    mode = METRICS_MODES.get(text.lower())
    if mode is None:
        raise ConfigError(
            f"VTC_METRICS={text!r} is not a mode; expected auto, on (1, true, yes) "
            "or off (0, false, no)"
        )
    return mode


@dataclass(frozen=True)
class EngineConfig:
    """Tenancy, prices and observation settings of an engine integration."""

    tenant_key: str = DEFAULT_TENANT_KEY
    default_tenant: str = DEFAULT_TENANT
    #: the weights in force: ``weights_file``'s, with ``env_weights`` over them
    weights: Mapping[str, float] = field(default_factory=dict)
    #: ``VTC_WEIGHTS_FILE``, re-read every ``weights_reload`` seconds when it changed
    weights_file: str | None = None
    #: ``VTC_WEIGHTS``: they win over the file's at every reload
    env_weights: Mapping[str, float] = field(default_factory=dict)
    weights_reload: float = 1.0
    #: ``VTC_PRIORITY_WEIGHTS``: weighted priority bands (None: strict bands)
    priority_weights: Mapping[int, float] | None = None
    wp: float = 1.0
    wq: float = 2.0
    max_tenants: int = 10_000
    log_interval: float = 10.0
    trace_file: str | None = None
    trace_interval: float = 0.1
    metrics: str = "auto"  # "auto" | "on" | "off"
    metrics_max_tenants: int = 100
    metrics_interval: float = 1.0
    metrics_relabel_interval: float = 10.0
    #: ``VTC_LOCALITY_QUANTUM``: the core's ``locality_quantum`` (0: plain VTC)
    locality_quantum: float = 0.0
    #: shared counters across replicas (:func:`shared_counter_settings`; None: one
    #: replica, no Redis); the adapter starts them (:mod:`vtc.sharing`)
    shared: SharedCounterSettings | None = None

    def __post_init__(self) -> None:
        if self.metrics not in ("auto", "on", "off"):
            raise ConfigError(f"metrics={self.metrics!r}; expected 'auto', 'on' or 'off'")
        q = self.locality_quantum
        if isinstance(q, bool) or not isinstance(q, (int, float)) or not 0.0 <= q < math.inf:
            raise ConfigError(f"locality_quantum={q!r}; expected a finite number >= 0")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> EngineConfig:
        """Read every variable of :data:`VARIABLES` (the table in the module doc).

        Raises :class:`ConfigError` for the first malformed one.
        """
        env = os.environ if environ is None else environ
        path = _text(env, "VTC_WEIGHTS_FILE")
        env_weights = parse_weights(env.get("VTC_WEIGHTS"))
        weights = merge_weights(None if path is None else load_weights_file(path), env_weights)
        wp = _number(env, "VTC_WP", 1.0, MAX_PRICE)
        wq = _number(env, "VTC_WQ", 2.0, MAX_PRICE)
        if wp == 0.0 and wq == 0.0:
            raise ConfigError(
                "VTC_WP and VTC_WQ are both 0: every token would be free and VTC would "
                "order requests first come, first served; set at least one above 0"
            )
        return cls(
            tenant_key=_text(env, "VTC_TENANT_KEY") or DEFAULT_TENANT_KEY,
            weights=weights,
            weights_file=path,
            env_weights=env_weights,
            weights_reload=_number(env, "VTC_WEIGHTS_RELOAD", 1.0),
            priority_weights=parse_priority_weights(env.get("VTC_PRIORITY_WEIGHTS")),
            wp=wp,
            wq=wq,
            max_tenants=_count(env, "VTC_MAX_TENANTS", 10_000),
            log_interval=_number(env, "VTC_LOG_INTERVAL", 10.0),
            trace_file=_text(env, "VTC_TRACE_FILE"),
            trace_interval=_number(env, "VTC_TRACE_INTERVAL", 0.1),
            metrics=_metrics_mode(env),
            metrics_max_tenants=_count(env, "VTC_METRICS_MAX_TENANTS", 100),
            metrics_interval=_number(env, "VTC_METRICS_INTERVAL", 1.0),
            metrics_relabel_interval=_number(env, "VTC_METRICS_RELABEL_INTERVAL", 10.0),
            locality_quantum=_number(env, "VTC_LOCALITY_QUANTUM", 0.0),
            shared=shared_counter_settings(env),
        )

    def tenant(self, values: Iterable[Any]) -> str:
        """The tenant of a request whose tenant fields hold ``values``, in order."""
        name = first_tenant(values)
        return self.default_tenant if name is None else name


# -- shared counters (vtc.distributed) ------------------------------------------------------

#: The most of the time the background syncs' CPU may take without ``VTC_SYNC_CPU_SHARE``
#: (the interpreter lock they can hold is what they take from the engine thread).
DEFAULT_SYNC_CPU_SHARE = 0.005


@dataclass(frozen=True)
class SharedCounterSettings:
    """Where and how often a replica shares its counters (:data:`SHARED_VARIABLES`)."""

    url: str
    namespace: str = "default"
    sync_interval: int = 10
    sync_ms: float | None = None
    replica_id: str | None = None  # None: vtc.distributed makes one (host-pid-random)
    timeout_ms: float = 100.0
    mode: str = "background"  # engines: sync from a thread, or "step": on the engine thread
    liveness_ms: int = 10_000  # silent this long: taken for dead, reaped by the others
    retry_ms: float = 1000.0  # after a failure, the store is left alone this long
    forget_ms: int = 60_000  # idle this long (and at most the floor): the store forgets it
    cpu_share: float = DEFAULT_SYNC_CPU_SHARE  # background: most of the time their CPU takes
    #: Variables set that this mode does not read, one sentence each; the engine
    #: logs them as warnings when sharing starts (a setting is never ignored silently).
    ignored: tuple[str, ...] = ()


def _redis_url(text: str) -> str:
    from urllib.parse import urlsplit

    allowed = ", ".join(f"{s}://" for s in REDIS_SCHEMES)
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 (raises ValueError for a malformed port)
    except ValueError as e:
        message = f"VTC_REDIS_URL={text!r} is not a URL ({e}); expected {allowed}"
        raise ConfigError(message) from None
    if parts.scheme.lower() not in REDIS_SCHEMES:
        has = f"has scheme {parts.scheme!r}" if parts.scheme else "has no scheme"
        raise ConfigError(
            f"VTC_REDIS_URL={text!r} {has}; expected a URL starting with {allowed} "
            "(e.g. redis://10.0.0.5:6379/0)"
        )
    if parts.scheme.lower() == "unix" and not parts.path:
        raise ConfigError(
            f"VTC_REDIS_URL={text!r} names no socket path; e.g. unix:///run/redis.sock"
        )
    return text


#: ``VTC_SYNC_MODE`` values: how an engine syncs its counters.
SYNC_MODES = ("background", "step")

#: The background thread's period without ``VTC_SYNC_MS``, in milliseconds.
DEFAULT_SYNC_MS = 50.0

#: ``Scheduler.changes`` reader slots, one per reader of a core: each slot is a cursor
#: that a read drains, so two readers sharing one would each miss what the other read.
#: The per-tenant metrics (:mod:`vtc.metrics`) read this one (every TenantMetrics of a
#: core: one that reads after another starts the slot again, a full read) ...
METRICS_CHANGES_READER = 0
#: ... and the shared-counter sync (:class:`vtc.distributed.SharedCounters`) this one.
SYNC_CHANGES_READER = 1
assert len({METRICS_CHANGES_READER, SYNC_CHANGES_READER}) == 2
assert max(METRICS_CHANGES_READER, SYNC_CHANGES_READER) < CHANGE_READERS


def _sync_mode(env: Mapping[str, str]) -> str:
    text = _text(env, "VTC_SYNC_MODE")
    if text is None:
        return "background"
    if text.lower() not in SYNC_MODES:
        raise ConfigError(
            f"VTC_SYNC_MODE={text!r}; expected 'background' (sync from a thread, the "
            "default) or 'step' (every VTC_SYNC_INTERVAL steps on the engine thread)"
        )
    return text.lower()


#: (variable, the sync mode that does not read it, why): set in that mode, it is
#: listed in ``SharedCounterSettings.ignored`` (the engine logs it as a warning)
_UNREAD_IN_MODE = (
    (
        "VTC_SYNC_INTERVAL",
        "background",
        "VTC_SYNC_MODE=background syncs from a thread every VTC_SYNC_MS milliseconds; set "
        "VTC_SYNC_MODE=step to sync every VTC_SYNC_INTERVAL engine steps",
    ),
    (
        "VTC_SYNC_CPU_SHARE",
        "step",
        "VTC_SYNC_MODE=step syncs on the engine thread every VTC_SYNC_INTERVAL steps; the "
        "share bounds the background thread's syncs (VTC_SYNC_MODE=background)",
    ),
)


def shared_counter_settings(
    environ: Mapping[str, str] | None = None,
) -> SharedCounterSettings | None:
    """Read :data:`SHARED_VARIABLES`: the settings, or None when ``VTC_REDIS_URL`` is
    unset or blank (one replica, nothing shared).

    Every variable is checked even without a URL, so that a malformed one is not
    ignored until the URL is added. Raises :class:`ConfigError` for the first
    malformed one. Does not contact Redis (nor import it).
    """
    env = os.environ if environ is None else environ
    url = _text(env, "VTC_REDIS_URL")
    if url is not None:
        url = _redis_url(url)
    namespace = _text(env, "VTC_REDIS_NAMESPACE") or "default"
    if "{" in namespace or "}" in namespace or len(namespace) > MAX_NAMESPACE_LEN:
        raise ConfigError(
            f"VTC_REDIS_NAMESPACE={namespace!r} is not a namespace; expected at most "
            f"{MAX_NAMESPACE_LEN} characters without '{{' or '}}' (it is the Redis hash tag "
            "of every key: vtc:{NAMESPACE}:...)"
        )
    mode = _sync_mode(env)
    ignored = []
    for name, unread_in, why in _UNREAD_IN_MODE:
        text = _text(env, name)
        if mode == unread_in and text is not None:
            ignored.append(f"{name}={text!r} is ignored: {why}")
    settings = SharedCounterSettings(
        url=url or "",
        namespace=namespace,
        sync_interval=_count(env, "VTC_SYNC_INTERVAL", 10),
        sync_ms=_positive(env, "VTC_SYNC_MS"),
        replica_id=_text(env, "VTC_REPLICA_ID"),
        timeout_ms=_positive(env, "VTC_REDIS_TIMEOUT_MS") or 100.0,
        mode=mode,
        liveness_ms=math.ceil(_positive(env, "VTC_SYNC_LIVENESS_MS") or 10_000),
        retry_ms=_positive(env, "VTC_SYNC_RETRY_MS") or 1000.0,
        forget_ms=math.ceil(_positive(env, "VTC_SYNC_FORGET_MS") or 60_000),
        cpu_share=_share(env, "VTC_SYNC_CPU_SHARE") or DEFAULT_SYNC_CPU_SHARE,
        ignored=tuple(ignored),
    )
    period = settings.sync_ms or DEFAULT_SYNC_MS
    if settings.mode == "background" and settings.liveness_ms <= period:
        given = _text(env, "VTC_SYNC_LIVENESS_MS")
        liveness = "unset (10000)" if given is None else repr(given)
        raise ConfigError(
            f"VTC_SYNC_LIVENESS_MS={liveness} is out of range: a replica syncs every "
            f"{period:g} ms (VTC_SYNC_MS), so every one would be taken for dead between its "
            "syncs; expected several periods (default 10000)"
        )
    return settings if url is not None else None


# -- start-up ------------------------------------------------------------------------------


def configured(environ: Mapping[str, str] | None = None) -> bool:
    """Whether any ``VTC_*`` variable is set (to anything, even blank)."""
    env = os.environ if environ is None else environ
    return any(name.startswith("VTC_") for name in env)


def check_env(environ: Mapping[str, str] | None = None) -> EngineConfig:
    """Validate every ``VTC_*`` variable an engine integration reads
    (:data:`VARIABLES` and :data:`SHARED_VARIABLES`); the engine configuration.

    Raises :class:`ConfigError` (naming the variable, its value and what is
    allowed) for the first malformed one.
    """
    env = os.environ if environ is None else environ
    config = EngineConfig.from_env(env)
    shared_counter_settings(env)
    return config
