"""A readable, pure-Python twin of the Rust core.

This module is the executable specification of ``vtc.Scheduler``: it is
written straight from the rules, favours clarity over speed (selection is a
linear scan over clients), and the differential tests drive it and the Rust
core through the same random operation sequences and require identical
admissions, counters and errors after every step.

The rules
---------
* Every client ``c`` has a virtual counter ``counter[c]`` and a delivered
  ``service[c]``.  A charge of ``w`` tokens-worth adds ``w * (1 / weight[c])``
  to both.  Prefill is charged ``(wp * (prompt_len - cached_len)) * inv_w``
  when a request is admitted for the first time (``cached_len`` prompt tokens
  came from a prefix cache: they occupy the KV budget but cost nothing);
  decode is charged ``(wq * T) * inv_w`` per client and decode call, where
  ``T`` is the integer number of tokens that
  client's requests generated in that call (summing integers first keeps the
  result independent of iteration order).
* Priority bands: every request has a ``priority`` (``submit(...,
  priority=0)``, a signed 64-bit int; smaller is more urgent, as in vLLM).
  Each client keeps one queue of waiting requests per priority, in submit
  order.  A client is *backlogged in band p* while it has waiting requests of
  priority ``p``, and *backlogged* while it has any.
* ``schedule()`` repeatedly takes the most urgent band ``p*`` (the smallest
  priority of any waiting request), the client backlogged in ``p*`` with the
  smallest key, where the key is ``(counter, seq of its head request in p*)``
  for ``vtc``/``lcf`` and ``(seq of that request,)`` for ``fcfs``, and admits
  that head request if ``occupancy + footprint <= M`` (footprint = prompt +
  tokens generated so far, which is non-zero only for a preempted request).
  The first request that does not fit stops admission: no skipping, so a less
  urgent request never overtakes a more urgent one.  ``peek()``, ``pop()``
  and ``set_aside()`` name the same request as ``schedule()`` would.
* The lift (``vtc`` only): when a client submits a request of priority ``p``
  while it has no waiting request of priority ``p``, ``counter = max(counter,
  floor)``, the floor being the min counter over clients backlogged in band
  ``p``; if there are none, over all backlogged clients (any band); if none
  is backlogged, the counter of the client that most recently left the
  backlog; if there is no such client, there is no lift.  A client leaves the
  backlog when its last waiting request (of any band) is admitted, set aside
  or cancelled.  With every priority equal this is the plain VTC lift.
* Weighted bands (``band_weights={priority: weight}``; ``None``, the default,
  is strict bands): bands share the machine instead of taking turns by
  urgency.  Every band with a live request has a *band counter*: the service
  its requests received, divided by its weight (a priority not in the
  mapping weighs 1).  It grows by ``cost.prefill(prompt - cached) * (1 /
  band_weight)`` at a request's first admission and by ``cost.decode(sums of
  every token its requests generated in the call) * (1 / band_weight)`` per
  band and decode call: actual service, before the client's weight, with no
  length prediction.  ``schedule()`` takes the band with the least ``(band
  counter, priority)`` among those with a selectable client, then the
  client as above; no skipping.  A band is *backlogged* while a client waits
  in it.  The band lift (``vtc`` only): a request submitted in a band that
  is not backlogged sets its counter to ``max(counter, floor)``, the floor
  being the least band counter over backlogged bands; if none, the counter
  of the band that last left the backlog (its value when its last request
  left, if it has none now); a band with no live request starts at the
  floor (at 0 without one).  A band counter goes with the band's last live
  request.  Preemption and ``put_back`` lift no band.  Two bands ``a, b``
  backlogged over an interval keep ``|V_a - V_b| <= 2 * max(wp * L_input,
  wq * M) / min(w_a, w_b)`` (``docs/priority.md``).
* Locality (``locality_quantum=Q``, weighted tokens in counter units, a
  finite number ``>= 0``; ``vtc`` and ``lcf`` only; docs/locality.md): once
  the band is chosen and the least-key client ``k0`` in it found as above,
  every client backlogged in that band (and not excluded by the cap) whose
  ``counter <= counter[k0] + Q`` is a *candidate*; each offers its first
  ``LOCALITY_DEPTH`` (8) waiting requests in the band, in queue order, or only
  its head once ``LOCALITY_DEPTH - 1`` of its later requests were taken
  (admitted or set aside) before that head; the offered request with the
  longest cached prefix is taken, ties by its client's plain key ``(counter,
  seq of the head)``, then by queue position.  So with ``Q > 0`` a client's
  requests may leave its queue out of submit order, each overtaken by at most
  ``LOCALITY_DEPTH - 1`` later ones while it is the head; ``put_back`` still
  returns a request to the head.  The cached prefix comes from the engine's
  lookup (``set_prefix_lookup(fn)``): ``fn(request_id)`` returns how many of
  that waiting request's tokens the engine holds now, an int in ``[0,
  footprint]``; it is called once per offered request per selection, in no
  specified order, never for a request that is not offered, and never
  when ``Q == 0`` or only one request is offered; an answer of the wrong
  type is a ``TypeError``, out of range an ``InvalidArgumentError``, and
  that or the lookup's own exception propagates, raised before anything
  changed; except in ``schedule()`` once it has admitted requests: it then
  stops there and returns those (nothing admitted is ever lost to a caller),
  and the next selecting call asks the lookup again.  ``Q = 0``, or no lookup,
  is plain VTC exactly.  Everything else (lift, charges, preemption order,
  weights, band rules) is unchanged: the window only chooses among clients
  the lift and the charges already placed.  Two clients ``f, g`` backlogged
  over an interval keep ``|W_f - W_g| <= 2 * (max(wp * L_input, wq * M) /
  min(w_f, w_g) + Q)`` in the engine model of ``tests/test_properties.py``.
* ``set_aside()`` takes the request ``peek()`` names out of its client's queue
  without admitting or charging it (an engine skipped it); ``put_back(rid)``
  returns it to the head of its band's queue with its submit seq and without a
  lift, so no counter changes (its client was set aside, not idle).
* ``decode()`` without arguments is one engine iteration: each running request
  generates one token.  If the batch would outgrow ``M``, running requests are
  preempted first from the least urgent band (largest priority), within it
  from the client with the largest counter (latest admission among equals;
  under ``fcfs`` simply the latest admission): back to the head of their
  band's queue without a lift, never charged again for what they already paid.
  If the last remaining request alone cannot grow, ``CapacityError`` is
  raised and nothing changes.
* ``decode(request_ids, tokens)`` records what an engine produced; the engine
  owns memory there, so no capacity check is made (likewise ``pop()``).

Costs (``cost=``; see ``docs/accounting.md``)
---------------------------------------------
A cost is a monotone ``h(n_p, n_q)``, charged ``h(n_p - cached, 0)`` at first
admission and ``h(n_p, j) - h(n_p, j - 1)`` for the ``j``-th generated token.
Per client and decode call, four *integer* sums are taken over the client's
requests, each of which (prompt ``n``, ``g`` tokens before the call, ``t``
tokens in it) contributes::

    T = t                       P = t * n
    Q = t * (2*g + t)           C = t * (n + g) + t * (t - 1) // 2

and the charge (before ``* inv_w``) is

* linear    ``wq * T``                                (exactly the rule above)
* quadratic ``a_q * T + a_pq * P + a_qq * Q``         (prefill ``a_p * n + c``)
* context   ``wq * T + beta * C``                     (prefill ``wp * n``)

evaluated left to right.  Integer sums are exact, so the result does not
depend on the order of the requests in the call.

Arguments and errors
--------------------
Numbers: an integer argument (``priority`` included) is an ``int`` or has
``__index__`` (numpy integers), never a ``bool``; a real-number argument (``weight``, ``value``,
``wp``, ``wq``) is an ``int``, a ``float`` or any ``numbers.Real`` (``Fraction``,
numpy floats), converted with ``float()``; anything else (``Decimal``, ``str``)
is a ``TypeError``. A value of the right type outside its range (an ``int`` too
large for a float included) is an ``InvalidArgumentError`` naming it. An
exception raised by the caller's own ``__index__`` or ``__len__`` propagates.

Limits (``rust/core/src/limits.rs``; they keep every counter finite and every
token sum exact): ``1 <= M <= 2**53``; prices (``wp``, ``wq``, cost
coefficients) in ``[0, 1e9]``; weights in ``[1e-6, 1e6]``; ``raise_counter``
values within ``[-1e30, 1e30]``; at most ``MAX_TOKENS_PER_CALL`` tokens per
request per decode call and ``2**54`` per request over its life. An int
``client_cap`` above ``M`` is ``M``; ``policy=None`` is ``"vtc"``.

Order of checks in ``decode(request_ids, tokens)``: first the lengths, then
position by position: the id (type, range, known, running), a duplicate,
the token count (type, range). The first failing check raises; nothing is
charged. ``pop(cached_len)`` on an empty queue returns ``None`` without
looking at ``cached_len``.

Per-client cap (``client_cap=``): in ``schedule()`` a client is eligible when
it has nothing running or its running tokens plus the footprint of the
request selection would take (its head in ``p*``) are within the cap;
ineligible clients are left out of selection, in every band, for the rest of
the call (``p*`` is then taken over the remaining clients' requests), and "no
skipping" applies among the eligible ones.

Length prediction (``submit(..., predicted_output=p)``, or ``predictor="mean"``
for requests without one: the client's moving average of finished output
lengths, ``m += (g - m) * 0.125`` with the first sample taken as is,
floored): at first admission the request is charged
``(prefill + decode(sums of p tokens after 0)) * inv_w``; a decode then
charges only tokens beyond ``p``.  When a request that was admitted leaves
(finish or cancel) having generated ``g < p``, the over-charge
``decode(sums of p - g tokens after g) * inv_w`` becomes the client's
*credit*: counters never decrease, so the credit is absorbed by the client's
next charges (``used = min(credit, amount)``) instead.  The lift treats
``counter - credit`` as the client's position: ``new = max(counter, floor)``,
``credit = new - max(counter - credit, floor)``.

Token tallies (``tokens()``, ``client_tokens(client)``): per client, the raw
tokens charged, ``(prompt, decode)``, whatever they cost (prices, weight,
cost and credit do not enter).  ``prompt`` grows by ``prompt_len -
cached_len`` at a request's first admission (never at a re-admission after a
preemption); ``decode`` by ``T`` of every charge, the tokens of each decode
call beyond the prediction, and by the predicted tokens charged at first
admission.  Both only grow, saturating at ``2**64 - 1``.

Active clients (``active_clients()``): every client with a live request,
``(waiting, running)``, counted here from the requests themselves (the core
reads counts it keeps per client); a request set aside counts as waiting.
"""

from __future__ import annotations

import itertools
import math
import numbers
import operator
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from vtc._core import CHANGE_READERS, MAX_TOKENS_PER_CALL
from vtc.errors import (
    CapacityError,
    DuplicateRequestError,
    InvalidArgumentError,
    RequestStateError,
    UnknownRequestError,
)

POLICIES = ("vtc", "lcf", "fcfs")
# The limits of rust/core/src/limits.rs (tests check they agree).
MAX_BUDGET = 2**53
MAX_REQUEST_TOKENS = 2**54
MAX_PRICE = 1e9
MIN_WEIGHT = 1e-6
MAX_WEIGHT = 1e6
MAX_COUNTER = 1e30
U64_MAX = 2**64 - 1  # token tallies saturate there
DEFAULT_BETA = 1.0 / 512.0
# the locality window offers each candidate client's first LOCALITY_DEPTH waiting
# requests, or only its head once LOCALITY_DEPTH - 1 later ones went before it
LOCALITY_DEPTH = 8
PAPER_QUADRATIC = {"a_p": 2.1, "a_q": 1.0, "a_pq": 0.04, "a_qq": 0.032, "c": 11.46}


@dataclass(frozen=True)
class _Cost:
    """One of the three cost families, with its coefficients."""

    kind: str  # "linear" | "quadratic" | "context"
    coef: dict

    def prefill(self, computed: int) -> float:
        k = self.coef
        if self.kind == "quadratic":
            return k["a_p"] * computed + k["c"]
        return k["wp"] * computed

    def decode(self, T: int, P: int, Q: int, C: int) -> float:
        k = self.coef
        if self.kind == "linear":
            return k["wq"] * T
        if self.kind == "quadratic":
            return k["a_q"] * T + k["a_pq"] * P + k["a_qq"] * Q
        return k["wq"] * T + k["beta"] * C


def _cost_from(cost) -> _Cost:
    """A ``vtc`` cost object (by its attributes) or a cost name."""
    names = {
        "linear": ("linear", {"wp": 1.0, "wq": 2.0}),
        "quadratic": ("quadratic", dict(PAPER_QUADRATIC)),
        "context": ("context", {"wp": 1.0, "wq": 2.0, "beta": DEFAULT_BETA}),
    }
    if isinstance(cost, str):
        if cost not in names:
            raise InvalidArgumentError(f"unknown cost {cost!r}")
        return _Cost(*names[cost])
    kind = {"LinearCost": "linear", "QuadraticCost": "quadratic", "ContextCost": "context"}.get(
        type(cost).__name__
    )
    if kind is None:
        raise TypeError(f"cost must be a cost object or a name, got {cost!r}")
    fields = {
        "linear": ("wp", "wq"),
        "quadratic": tuple(PAPER_QUADRATIC),
        "context": ("wp", "wq", "beta"),
    }
    return _Cost(kind, {f: float(getattr(cost, f)) for f in fields[kind]})


@dataclass
class _Client:
    counter: float = 0.0
    service: float = 0.0
    weight: float = 1.0
    inv_w: float = 1.0
    # its waiting request ids per priority band, head first; an empty band is
    # dropped, so ``not bands`` means the client is not backlogged
    bands: dict = field(default_factory=dict)  # priority -> deque
    occupancy: int = 0  # KV tokens of its running requests
    credit: float = 0.0  # refunded over-prediction not yet absorbed
    mean_output: float | None = None  # "mean" predictor
    prompt_tokens: int = 0  # raw prompt tokens charged (cached ones excluded)
    decode_tokens: int = 0  # raw output tokens charged (predicted ones included)


@dataclass
class _Request:
    rid: int
    client: object
    prompt: int
    seq: int
    cached: int = 0
    generated: int = 0
    prefill_paid: bool = False
    aside: bool = False  # taken out of its queue by set_aside, not yet put back
    running: bool = False
    admit_seq: int = 0
    predicted_given: int | None = None
    predicted: int = 0  # output tokens pre-charged at first admission
    priority: int = 0  # its band: smaller is more urgent


@dataclass
class _Share:
    """A band's counter under weighted bands, while the band has live requests."""

    counter: float = 0.0
    inv_w: float = 1.0
    live: int = 0  # live requests of this priority (waiting, set aside or running)


def _as_int(name: str, value) -> int:
    """An int, or anything with ``__index__`` (numpy integers); never a bool.
    An exception raised inside ``__index__`` propagates."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise TypeError(f"{name} must be an int, got {value!r}")
    return operator.index(value)


def _as_float(name: str, value) -> float:
    """A real number: an int (never a bool), a float or a ``numbers.Real``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {value!r}")
    try:
        return float(value)
    except OverflowError:
        raise InvalidArgumentError(f"{name} {value!r} is out of range") from None


def _sized_len(arg) -> int | None:
    """The real length of a list, tuple or 1-d array; None for anything else
    (whose ``__len__`` may lie)."""
    if type(arg) in (list, tuple):
        return len(arg)
    if isinstance(arg, np.ndarray) and arg.ndim == 1:
        return len(arg)
    return None


def _read(arg, limit: int) -> tuple[list, bool]:
    """The items of a batch argument and whether it had more: a list, tuple or
    1-d array whole, any other iterable by iteration up to ``limit`` items."""
    if _sized_len(arg) is not None:
        return list(arg), False
    try:
        it = iter(arg)
    except TypeError:
        raise TypeError(
            f"a batch argument must be a sequence of ints, got {type(arg).__name__}"
        ) from None
    items = []
    for x in it:
        if len(items) == limit:
            return items, True
        items.append(x)
    return items, False


def _check_int(name: str, value, minimum: int) -> int:
    value = _as_int(name, value)
    if value < minimum:
        raise InvalidArgumentError(f"{name} must be >= {minimum}, got {value}")
    return value


def _check_tokens(value) -> int:
    """A decode call's token count: an int in ``[0, MAX_TOKENS_PER_CALL]``."""
    t = _check_int("tokens", value, 0)
    if t > MAX_TOKENS_PER_CALL:
        raise InvalidArgumentError(f"tokens {t} exceeds {MAX_TOKENS_PER_CALL}")
    return t


def _check_length(r, t: int) -> None:
    """Request ``r`` may generate ``t`` more tokens without passing MAX_REQUEST_TOKENS."""
    if r.generated + t > MAX_REQUEST_TOKENS:
        raise InvalidArgumentError(
            f"request {r.rid} would have generated {r.generated + t} tokens, "
            f"more than {MAX_REQUEST_TOKENS} (2**54)"
        )


def _check_request_id(rid) -> int:
    rid = _as_int("request_id", rid)
    if not 0 <= rid < 2**64:
        raise InvalidArgumentError(f"request_id must be in [0, 2**64), got {rid}")
    return rid


def _check_client(client):
    if isinstance(client, bool) or not isinstance(client, (int, str)):
        raise TypeError(f"client must be an int or a str, got {client!r}")
    if isinstance(client, int) and not -(2**63) <= client < 2**63:
        raise InvalidArgumentError(f"client id {client} does not fit in 64 bits")
    return client


def _check_reader(reader) -> int:
    """A ``changes`` reader slot: an int in ``[0, CHANGE_READERS)`` (None: 0)."""
    if reader is None:
        return 0
    try:
        r = operator.index(reader)
    except TypeError:
        raise TypeError(
            f"reader must be an int, got {reader!r} of type {type(reader).__name__}"
        ) from None
    if not 0 <= r < CHANGE_READERS:
        raise InvalidArgumentError(f"reader must be an int in [0, {CHANGE_READERS}), got {r}")
    return r


def _check_band_weights(band_weights) -> dict | None:
    """``None`` (strict bands) or a mapping of priority to weight, copied."""
    if band_weights is None:
        return None
    if not isinstance(band_weights, Mapping):
        kind = type(band_weights).__name__
        raise TypeError(f"band_weights must be a mapping of priority to weight, got {kind}")
    out = {}
    for p, w in list(band_weights.items()):
        p = _as_int("priority", p)
        if not -(2**63) <= p < 2**63:
            raise InvalidArgumentError(f"priority {p} does not fit in 64 bits")
        out[p] = _check_weight(w)
    return out


def _check_weight(weight) -> float:
    w = _as_float("weight", weight)
    if not MIN_WEIGHT <= w <= MAX_WEIGHT:
        raise InvalidArgumentError(
            f"weight must be a finite number in [{MIN_WEIGHT}, {MAX_WEIGHT}], got {w!r}"
        )
    return w


class Scheduler:
    """Pure-Python VTC with the same API and semantics as ``vtc.Scheduler``."""

    def __init__(
        self,
        M: int,
        wp: float | None = None,
        wq: float | None = None,
        policy: str | None = None,
        *,
        cost=None,
        client_cap: int | float | None = None,
        predictor: str | None = None,
        band_weights=None,
        locality_quantum=0.0,
    ) -> None:
        M = _check_int("M", M, 1)
        if M > MAX_BUDGET:
            raise InvalidArgumentError(f"M must be a number of tokens in [1, 2**53], got {M}")
        if predictor is None:
            predictor = "none"
        if not isinstance(predictor, str):
            raise TypeError(f"predictor must be a str, got {predictor!r}")
        if predictor not in ("none", "mean"):
            raise InvalidArgumentError(f"unknown predictor {predictor!r}")
        self.predictor = predictor
        if cost is not None and (wp is not None or wq is not None):
            raise InvalidArgumentError("give either wp/wq or cost, not both")
        wp = 1.0 if wp is None else wp
        wq = 2.0 if wq is None else wq
        for name, w in (("wp", wp), ("wq", wq)):
            w = _as_float(name, w)
            if not 0.0 <= w <= MAX_PRICE:
                raise InvalidArgumentError(
                    f"{name} must be a finite number in [0, {MAX_PRICE}], got {w!r}"
                )
        if policy is None:
            policy = "vtc"
        if not isinstance(policy, str):
            raise TypeError(f"policy must be a str, got {policy!r}")
        if policy not in POLICIES:
            raise InvalidArgumentError(f"unknown policy {policy!r}; expected one of {POLICIES}")
        if cost is None:
            self.cost = _Cost("linear", {"wp": float(wp), "wq": float(wq)})
        else:
            self.cost = _cost_from(cost)
        if client_cap is not None:
            if isinstance(client_cap, int) and not isinstance(client_cap, bool):
                if client_cap < 1:
                    raise InvalidArgumentError(f"client_cap must be >= 1, got {client_cap}")
                client_cap = min(client_cap, M)  # a cap above M is M
            else:
                f = _as_float("client_cap", client_cap)
                if not 0.0 < f <= 1.0:
                    raise InvalidArgumentError(f"bad client_cap {client_cap!r}")
                client_cap = max(1, math.floor(f * M))
        q = _as_float("locality_quantum", locality_quantum)
        if not (math.isfinite(q) and q >= 0.0):
            raise InvalidArgumentError(f"locality_quantum must be a finite number >= 0, got {q!r}")
        if q > 0.0 and policy == "fcfs":
            raise InvalidArgumentError(
                f"locality_quantum={q!r} needs a counter policy (vtc or lcf), not fcfs"
            )
        self.locality_quantum = q
        self._prefix_lookup = None
        # (client, band) -> (seq of the head, how many later requests were taken
        # before it): the locality window's overtakes of each head
        self._skips: dict = {}
        self.client_cap = client_cap
        self.M = M
        self.wp = self.cost.coef.get("wp", self.cost.coef.get("a_p"))
        self.wq = self.cost.coef.get("wq", self.cost.coef.get("a_q"))
        self.policy = policy
        self._clients: dict[object, _Client] = {}
        self._requests: dict[int, _Request] = {}
        self._running: list[int] = []
        self._readers: dict[int, dict] = {}  # changes(): each reader's last read
        self._seq = 0
        self._admit_seq = 0
        self._last_left = None
        self.occupancy = 0
        self._band_weights = None
        self._shares: dict[int, _Share] = {}
        self._band_last_left = None  # (priority, value when its share went)
        self.set_band_weights(band_weights)

    # -- read-only views ---------------------------------------------------
    @property
    def num_waiting(self) -> int:
        return sum(len(q) for c in self._clients.values() for q in c.bands.values())

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_clients(self) -> int:
        return len(self._clients)

    def counter(self, client) -> float:
        c = self._clients.get(_check_client(client))
        return c.counter if c else 0.0

    def service(self, client) -> float:
        c = self._clients.get(_check_client(client))
        return c.service if c else 0.0

    def weight(self, client) -> float:
        c = self._clients.get(_check_client(client))
        return c.weight if c else 1.0

    def status(self, request_id) -> str | None:
        r = self._requests.get(_check_request_id(request_id))
        if r is None:
            return None
        return "running" if r.running else "aside" if r.aside else "waiting"

    def statuses(self, request_ids) -> list[str | None]:
        """``status`` of each id, in order; the first bad id raises as ``status`` does."""
        ndim = getattr(request_ids, "ndim", 1)  # a numpy array must be 1-d
        if isinstance(ndim, int) and ndim != 1:
            raise TypeError(f"request_ids must be a 1-d integer array, got a {ndim}-d array")
        rids = [_check_request_id(r) for r in request_ids]
        return [self.status(r) for r in rids]

    def running(self) -> list[int]:
        return sorted(self._running, key=lambda rid: self._requests[rid].admit_seq)

    # -- configuration -----------------------------------------------------
    def set_weight(self, client, weight) -> None:
        client = _check_client(client)
        w = _check_weight(weight)
        c = self._clients.setdefault(client, _Client())
        c.weight = w
        c.inv_w = 1.0 / w

    def raise_counter(self, client, value) -> None:
        client = _check_client(client)
        v = _as_float("value", value)
        if not (math.isfinite(v) and abs(v) <= MAX_COUNTER):
            raise InvalidArgumentError(
                f"counter must be a finite number in [-{MAX_COUNTER}, {MAX_COUNTER}], got {v!r}"
            )
        c = self._clients.setdefault(client, _Client())
        c.counter = max(c.counter, v)

    def raise_counters(self, counters) -> int:
        if not isinstance(counters, Mapping):
            raise TypeError(
                f"counters must be a mapping of client to counter, got {type(counters).__name__}"
            )
        checked = []
        for client, value in list(counters.items()):
            client = _check_client(client)
            v = _as_float("value", value)
            if not (math.isfinite(v) and abs(v) <= MAX_COUNTER):
                raise InvalidArgumentError(
                    f"counter must be a finite number in [-{MAX_COUNTER}, {MAX_COUNTER}], got {v!r}"
                )
            checked.append((client, v))
        raised = 0
        for client, v in checked:
            c = self._clients.setdefault(client, _Client())
            if v > c.counter:
                c.counter = v
                raised += 1
        return raised

    def set_band_weights(self, band_weights) -> None:
        """Weighted bands with these weights (a priority not listed weighs 1),
        or strict bands with ``None``.  Band counters of live bands are kept
        across a change of weights; switching modes starts them at 0."""
        weights = _check_band_weights(band_weights)
        if weights is None:
            self._shares = {}
        elif self._band_weights is None:
            self._shares = {}
            for r in self._requests.values():
                self._shares.setdefault(r.priority, _Share()).live += 1
        if weights is None or self._band_weights is None:
            self._band_last_left = None
        self._band_weights = weights
        for p, sh in self._shares.items():
            sh.inv_w = 1.0 / weights.get(p, 1.0)

    def set_prefix_lookup(self, lookup) -> None:
        """The engine's prefix-cache lookup for the locality window, or ``None``:
        ``lookup(request_id)`` returns how many tokens of that waiting request the
        engine holds cached now (an int in ``[0, prompt + generated]``).  The
        scheduler calls it only for the requests the window offers, only when ``Q > 0``, and
        stores nothing it returns; ``peek()`` and the ``pop()`` after it agree
        as long as the answers do not change in between."""
        if lookup is not None and not callable(lookup):
            raise TypeError(f"lookup must be callable or None, got {lookup!r}")
        self._prefix_lookup = lookup

    def band_weights(self) -> dict | None:
        return None if self._band_weights is None else dict(self._band_weights)

    def band_counters(self) -> dict:
        """Weighted bands: each live band's counter, by priority; else empty."""
        return {p: sh.counter for p, sh in sorted(self._shares.items())}

    # -- the policy --------------------------------------------------------
    def _backlogged(self, band=None) -> list:
        """The clients with waiting requests (of priority ``band`` if given)."""
        if band is None:
            return [k for k, c in self._clients.items() if c.bands]
        return [k for k, c in self._clients.items() if band in c.bands]

    def _enqueue(self, r: _Request, head: bool = False) -> None:
        """Into its client's queue of its band: at the tail, or back at the head."""
        q = self._clients[r.client].bands.setdefault(r.priority, deque())
        if head:
            q.appendleft(r.rid)
        else:
            q.append(r.rid)

    def _dequeue(self, r: _Request, taken: bool = False) -> None:
        """Out of its band's queue (admitted, set aside or cancelled); a client whose
        last waiting request it was leaves the backlog. ``taken`` (admitted or set
        aside) from behind the head: one more overtake of that head."""
        c = self._clients[r.client]
        q = c.bands[r.priority]
        if taken and q[0] != r.rid:
            head = self._requests[q[0]].seq
            seq, n = self._skips.get((r.client, r.priority), (None, 0))
            self._skips[(r.client, r.priority)] = (head, n + 1 if seq == head else 1)
        q.remove(r.rid)
        if not q:
            self._skips.pop((r.client, r.priority), None)
            del c.bands[r.priority]
            if self._band_weights is not None and not self._backlogged(r.priority):
                self._band_last_left = (r.priority, None)
        if not c.bands:
            self._last_left = r.client

    def _key(self, k, band):
        c = self._clients[k]
        head_seq = self._requests[c.bands[band][0]].seq
        if self.policy == "fcfs":
            return (head_seq,)
        return (c.counter, head_seq)

    def _eligible(self, k, rid) -> bool:
        """Within the per-client cap (a client with nothing running always is)."""
        if self.client_cap is None:
            return True
        c = self._clients[k]
        r = self._requests[rid]
        running = any(self._requests[x].client == k for x in self._running)
        return not running or c.occupancy + r.prompt + r.generated <= self.client_cap

    def _select(self, exclude=()):
        """``(client, request id)`` next in line, or None: the most urgent band among
        the clients not excluded, the least key in that band, its head request."""
        backlog = [k for k in self._backlogged() if k not in exclude]
        if not backlog:
            return None
        bands = {p for k in backlog for p in self._clients[k].bands}
        if self._band_weights is None:
            band = min(bands)
        else:
            band = min(bands, key=lambda p: (self._shares[p].counter, p))
        in_band = [k for k in backlog if band in self._clients[k].bands]
        k = min(in_band, key=lambda k: self._key(k, band))
        if self.locality_quantum > 0.0 and self._prefix_lookup is not None:
            return self._closest(in_band, band, self._clients[k].counter + self.locality_quantum)
        return k, self._clients[k].bands[band][0]

    def _depth(self, k, band) -> int:
        """How many of client ``k``'s waiting requests in ``band`` the window offers:
        its first ``LOCALITY_DEPTH``, or only its head once ``LOCALITY_DEPTH - 1``
        of its later requests were taken before that head."""
        q = self._clients[k].bands[band]
        seq, n = self._skips.get((k, band), (None, 0))
        if seq == self._requests[q[0]].seq and n >= LOCALITY_DEPTH - 1:
            return 1
        return LOCALITY_DEPTH

    def _closest(self, in_band, band, edge):
        """The locality window: among the clients of ``in_band`` whose counter is
        ``<= edge`` (the least counter + Q), each offering its first ``_depth``
        waiting requests in queue order, ``(client, request id)`` of the request
        with the longest cached prefix; ties by its client's plain key (counter,
        seq of the head), then by queue position."""
        window = [k for k in in_band if self._clients[k].counter <= edge]
        offered = [
            (k, i, rid)
            for k in window
            for i, rid in enumerate(
                itertools.islice(self._clients[k].bands[band], self._depth(k, band))
            )
        ]
        if len(offered) == 1:
            return window[0], offered[0][2]

        def key(o):
            k, i, rid = o
            return (-self._hit(rid), *self._key(k, band), i)

        k, _, rid = min(offered, key=key)
        return k, rid

    def _hit(self, rid) -> int:
        """The engine's cached prefix of waiting request ``rid``, checked."""
        r = self._requests[rid]
        hit = _as_int("prefix lookup", self._prefix_lookup(rid))
        if not 0 <= hit <= r.prompt + r.generated:
            raise InvalidArgumentError(
                f"prefix lookup of request {rid} returned {hit}, outside "
                f"[0, {r.prompt + r.generated}] (its prompt and generated tokens)"
            )
        return hit

    def _lift(self, k, band) -> None:
        """lift: a client entering a band never keeps credit banked while
        it was idle there, and is never moved backwards."""
        c = self._clients[k]
        backlog = self._backlogged(band) or self._backlogged()
        if backlog:
            floor = min(self._clients[b].counter for b in backlog)
        elif self._last_left is not None:
            floor = self._clients[self._last_left].counter
        else:
            return
        if c.credit > 0.0:
            # the client stands at counter - credit; lift that to the floor
            raised = max(c.counter, floor)
            c.credit = raised - max(c.counter - c.credit, floor)
            c.counter = raised
        else:
            c.counter = max(c.counter, floor)

    def _lift_band(self, p) -> None:
        """lift_band: a band entering the backlog banks no idleness."""
        backlog = {q for k in self._backlogged() for q in self._clients[k].bands}
        floor = None
        if backlog:
            floor = min(self._shares[q].counter for q in backlog)
        elif self._band_last_left is not None:
            q, value = self._band_last_left
            floor = self._shares[q].counter if q in self._shares else value
        sh = self._shares.get(p)
        if sh is None:
            sh = self._shares[p] = _Share(inv_w=1.0 / self._band_weights.get(p, 1.0))
            sh.counter = 0.0 if floor is None or self.policy != "vtc" else floor
        elif floor is not None and self.policy == "vtc":
            sh.counter = max(sh.counter, floor)

    def submit(
        self, request_id, client, prompt_len, cached_len=None, predicted_output=None, priority=None
    ) -> None:
        rid = _check_request_id(request_id)
        client = _check_client(client)
        prompt_len = _as_int("prompt_len", prompt_len)
        cached = 0 if cached_len is None else _as_int("cached_len", cached_len)
        predicted = None
        if predicted_output is not None:
            predicted = _as_int("predicted_output", predicted_output)
            if not -(2**63) <= predicted < 2**63:
                raise InvalidArgumentError(f"predicted_output {predicted} does not fit in 64 bits")
        # the arguments are converted (type, 64-bit range) in order, then their values checked
        priority = 0 if priority is None else _as_int("priority", priority)
        if not -(2**63) <= priority < 2**63:
            raise InvalidArgumentError(f"priority {priority} does not fit in 64 bits")
        if predicted is not None and not 0 <= predicted <= MAX_TOKENS_PER_CALL:
            raise InvalidArgumentError(f"bad predicted_output {predicted}")
        prompt_len = _check_int("prompt_len", prompt_len, 1)
        if prompt_len > self.M:
            raise InvalidArgumentError(
                f"prompt_len {prompt_len} exceeds the KV budget M={self.M}; "
                "it could never be admitted"
            )
        if not 0 <= cached <= prompt_len:
            raise InvalidArgumentError(
                f"cached_len must be between 0 and prompt_len={prompt_len}, got {cached}"
            )
        if rid in self._requests:
            raise DuplicateRequestError(f"request {rid} is already live")
        c = self._clients.setdefault(client, _Client())
        if priority not in c.bands and self.policy == "vtc":
            self._lift(client, priority)
        if self._band_weights is not None:
            if not self._backlogged(priority):
                self._lift_band(priority)
            self._shares[priority].live += 1
        self._seq += 1
        r = _Request(
            rid, client, prompt_len, self._seq, cached, predicted_given=predicted, priority=priority
        )
        self._requests[rid] = r
        self._enqueue(r)

    def _charge(self, c: _Client, amount: float) -> None:
        if c.credit > 0.0:
            used = min(c.credit, amount)
            amount -= used
            c.credit -= used
        c.counter += amount
        c.service += amount

    def _admit(self, rid) -> int:
        r = self._requests[rid]
        c = self._clients[r.client]
        self._dequeue(r, taken=True)
        self.occupancy += r.prompt + r.generated
        c.occupancy += r.prompt + r.generated
        if not r.prefill_paid:
            r.prefill_paid = True
            if r.predicted_given is not None:
                r.predicted = r.predicted_given
            elif self.predictor == "mean" and c.mean_output is not None:
                r.predicted = math.floor(c.mean_output)
            amount = self.cost.prefill(r.prompt - r.cached)
            sh = self._shares.get(r.priority)
            if sh is not None:
                sh.counter += amount * sh.inv_w
            c.prompt_tokens = min(c.prompt_tokens + r.prompt - r.cached, U64_MAX)
            c.decode_tokens = min(c.decode_tokens + r.predicted, U64_MAX)
            if r.predicted > 0:
                amount = amount + self.cost.decode(*self._sums(r.prompt, 0, r.predicted))
            self._charge(c, amount * c.inv_w)
        r.running = True
        self._admit_seq += 1
        r.admit_seq = self._admit_seq
        self._running.append(rid)
        return rid

    def schedule(self) -> list[int]:
        admitted = []
        capped = set()  # clients at their cap: out of selection for this call
        while True:
            try:
                picked = self._select(capped)
            except Exception:  # the prefix lookup's: raised before anything changed
                if not admitted:
                    raise
                break  # what was admitted is returned; the next call asks again
            if picked is None:
                break
            k, rid = picked
            if not self._eligible(k, rid):
                capped.add(k)
                continue
            r = self._requests[rid]
            if self.occupancy + r.prompt + r.generated > self.M:
                break
            admitted.append(self._admit(rid))
        return admitted

    def peek(self) -> int | None:
        picked = self._select()
        return None if picked is None else picked[1]

    def pop(self, cached_len=None) -> int | None:
        picked = self._select()
        if picked is None:
            return None
        rid = picked[1]
        if cached_len is not None:
            cached = _as_int("cached_len", cached_len)
            r = self._requests[rid]
            if not 0 <= cached <= r.prompt:
                raise InvalidArgumentError(
                    f"cached_len must be between 0 and prompt_len={r.prompt}, got {cached}"
                )
            r.cached = cached
        return self._admit(rid)

    def set_aside(self) -> int | None:
        """Take the request ``peek()`` names out of its client's queue: not admitted,
        not charged, its place kept for ``put_back``."""
        picked = self._select()
        if picked is None:
            return None
        r = self._requests[picked[1]]
        self._dequeue(r, taken=True)  # may leave the backlog, as an admission would
        r.aside = True
        return r.rid

    def put_back(self, request_id) -> None:
        """Back to the head of its client's queue of its band with its place; nothing
        charged and no lift: it was set aside, not idle."""
        r = self._get(request_id)
        if not r.aside:
            now = "running" if r.running else "waiting"
            raise RequestStateError(f"cannot put back request {r.rid}: it is {now}, not set aside")
        r.aside = False
        self._enqueue(r, head=True)

    def _get(self, rid) -> _Request:
        rid = _check_request_id(rid)
        r = self._requests.get(rid)
        if r is None:
            raise UnknownRequestError(f"unknown request {rid}")
        return r

    def _get_running(self, rid, what: str) -> _Request:
        r = self._get(rid)
        if not r.running:
            now = "set aside" if r.aside else "waiting"
            raise RequestStateError(f"cannot {what} request {r.rid}: it is {now}, not running")
        return r

    @staticmethod
    def _sums(n: int, g: int, t: int) -> tuple[int, int, int, int]:
        """T, P, Q, C of ``t`` tokens generated after ``g`` with prompt ``n``."""
        return (t, t * n, t * (2 * g + t), t * (n + g) + t * (t - 1) // 2)

    def _add_tokens(self, per_client: dict, r: _Request, t: int) -> None:
        """Add request ``r``'s ``t`` new tokens (``r.generated`` is the count
        before them) to its client's integer sums; tokens within the
        prediction were paid at admission and are left out."""
        self._clients[r.client].occupancy += t
        g, end = r.generated, r.generated + t
        g = max(g, r.predicted)
        if end <= g:
            return
        sums = per_client.setdefault(r.client, [0, 0, 0, 0])
        for i, v in enumerate(self._sums(r.prompt, g, end - g)):
            sums[i] += v

    def _add_band_tokens(self, per_band: dict, r: _Request, t: int) -> None:
        """Weighted bands: every new token of ``r`` (predicted or not) to its band's sums."""
        if self._band_weights is None or t == 0:
            return
        sums = per_band.setdefault(r.priority, [0, 0, 0, 0])
        for i, v in enumerate(self._sums(r.prompt, r.generated, t)):
            sums[i] += v

    def _charge_bands(self, per_band: dict) -> None:
        for p, sums in per_band.items():
            sh = self._shares[p]
            sh.counter += self.cost.decode(*sums) * sh.inv_w

    def _charge_tokens(self, per_client: dict) -> None:
        for k, sums in per_client.items():
            c = self._clients[k]
            c.decode_tokens = min(c.decode_tokens + sums[0], U64_MAX)  # sums[0] is T
            self._charge(c, self.cost.decode(*sums) * c.inv_w)

    def _settle(self, r: _Request, learn: bool) -> None:
        """A request that was admitted leaves: refund an over-prediction as credit."""
        if not r.prefill_paid:
            return
        c = self._clients[r.client]
        if r.predicted > r.generated:
            over = self.cost.decode(*self._sums(r.prompt, r.generated, r.predicted - r.generated))
            c.credit += over * c.inv_w
        if learn and self.predictor == "mean":
            if c.mean_output is None:
                c.mean_output = float(r.generated)
            else:
                c.mean_output += (r.generated - c.mean_output) * 0.125

    def decode(self, request_ids: Sequence[int] | None = None, tokens=None) -> list[int]:
        if request_ids is None:
            if tokens is not None:
                raise TypeError("tokens given without request_ids")
            return self._decode_step()
        for name, arg in (("request_ids", request_ids), ("tokens", tokens)):
            ndim = getattr(arg, "ndim", 1)  # a numpy array must be 1-d
            if isinstance(ndim, int) and ndim != 1 and not isinstance(arg, int):
                raise TypeError(f"{name} must be a 1-d integer array, got a {ndim}-d array")
        # The reading rule: a list, tuple or 1-d array is read whole; any other
        # iterable by iteration (never sized from its __len__, which may lie)
        # and only up to a limit: request_ids up to one more id than there are
        # running requests (more is an error whatever they are), or as many as
        # a list, tuple or array of tokens holds; tokens up to as many as the
        # ids read. `more` records that an iterable had items past its limit.
        n_tok = _sized_len(tokens)
        limit = len(self._running) + 1
        rids, more = _read(request_ids, max(limit, n_tok) if n_tok is not None else limit)
        if isinstance(tokens, int) and not isinstance(tokens, bool):
            toks, tok_more = [tokens] * len(rids), more
        elif tokens is None:
            toks, tok_more = [1] * len(rids), more
        else:
            toks, tok_more = _read(tokens, len(rids))
        if len(toks) != len(rids) or tok_more != more:

            def n(items, cut):
                return f"more than {len(items)}" if cut else str(len(items))

            raise InvalidArgumentError(
                f"request_ids and tokens differ in length: {n(rids, more)} != {n(toks, tok_more)}"
            )
        seen = set()
        reqs = []
        for rid, t in zip(rids, toks):
            r = self._get_running(rid, "decode")
            if r.rid in seen:
                raise InvalidArgumentError(f"request {r.rid} appears twice in one decode call")
            seen.add(r.rid)
            t = _check_tokens(t)
            _check_length(r, t)
            reqs.append((r, t))
        if more:  # not reached: more ids than running ones hold an error above
            raise InvalidArgumentError(
                f"request_ids has more than {len(rids)} items, more than there are running requests"
            )
        self._charge_decoded(reqs)
        return []

    def decode_all(self, tokens=None) -> None:
        """Engine form, uniform: every running request generated ``tokens`` (default 1)."""
        t = 1 if tokens is None else _check_tokens(tokens)
        running = [self._requests[x] for x in self._running]
        running.sort(key=lambda r: r.admit_seq)  # checked in admission order
        for r in running:
            _check_length(r, t)
        self._charge_decoded([(r, t) for r in running])

    def _charge_decoded(self, reqs: list) -> None:
        """Charge checked ``(request, tokens)`` pairs of one decode call."""
        per_client: dict = {}
        per_band: dict = {}
        for r, t in reqs:
            self._add_tokens(per_client, r, t)
            self._add_band_tokens(per_band, r, t)
            r.generated += t
            self.occupancy += t
        self._charge_tokens(per_client)
        self._charge_bands(per_band)

    def _decode_step(self) -> list[int]:
        victims = []
        if self.occupancy + len(self._running) > self.M:
            # Evict from the least urgent band first, then the most-served
            # client, latest admission first (fcfs, the baseline, evicts like a
            # plain engine within a band: latest first).
            order = sorted(
                self._running,
                key=lambda rid: (
                    self._requests[rid].priority,
                    0.0
                    if self.policy == "fcfs"
                    else self._clients[self._requests[rid].client].counter,
                    self._requests[rid].admit_seq,
                ),
                reverse=True,
            )
            occ, keep = self.occupancy, len(order)
            while occ + keep > self.M:
                r = self._requests[order[len(victims)]]
                if keep == 1:
                    raise CapacityError(
                        f"request {r.rid} holds {r.prompt + r.generated} tokens and cannot "
                        f"grow within M={self.M}; finish or cancel it"
                    )
                occ -= r.prompt + r.generated
                keep -= 1
                victims.append(r.rid)
            for rid in victims:
                self.preempt(rid)
        per_client: dict = {}
        per_band: dict = {}
        for rid in self._running:
            r = self._requests[rid]
            self._add_tokens(per_client, r, 1)
            self._add_band_tokens(per_band, r, 1)
            r.generated += 1
        self.occupancy += len(self._running)
        self._charge_tokens(per_client)
        self._charge_bands(per_band)
        return victims

    def preempt(self, request_id) -> None:
        r = self._get_running(request_id, "preempt")
        self._running.remove(r.rid)
        r.running = False
        self.occupancy -= r.prompt + r.generated
        self._clients[r.client].occupancy -= r.prompt + r.generated
        # Back to the head of its client's queue of its band; it keeps its
        # submit seq, so it stays ahead of the client's later requests.  No
        # lift: the client was being served, not idle.
        self._enqueue(r, head=True)

    def finish(self, request_id) -> None:
        r = self._get_running(request_id, "finish")
        self._settle(r, True)
        self._running.remove(r.rid)
        self.occupancy -= r.prompt + r.generated
        self._clients[r.client].occupancy -= r.prompt + r.generated
        self._forget(r)

    def _forget(self, r: _Request) -> None:
        """A request leaves for good; under weighted bands its band's counter goes
        with the band's last live request."""
        del self._requests[r.rid]
        sh = self._shares.get(r.priority)
        if sh is not None:
            sh.live -= 1
            if sh.live == 0:
                del self._shares[r.priority]
                if self._band_last_left is not None and self._band_last_left[0] == r.priority:
                    self._band_last_left = (r.priority, sh.counter)

    def cancel(self, request_id) -> None:
        r = self._get(request_id)
        self._settle(r, False)
        if r.running:
            self._running.remove(r.rid)
            self.occupancy -= r.prompt + r.generated
            self._clients[r.client].occupancy -= r.prompt + r.generated
        elif r.aside:
            pass  # out of every queue already
        else:
            self._dequeue(r)
        self._forget(r)

    def clients(self) -> list:
        return list(self._clients)

    def counters(self) -> dict:
        return {k: c.counter for k, c in self._clients.items()}

    def services(self) -> dict:
        return {k: c.service for k, c in self._clients.items()}

    def tokens(self) -> dict:
        return {k: (c.prompt_tokens, c.decode_tokens) for k, c in self._clients.items()}

    def changes(self, reader=None) -> tuple[bool, dict, list]:
        """``vtc._core.Scheduler.changes`` the plain way: each reader's last read of
        every client against a fresh one (O(clients)). Lists only the clients whose
        values differ (the core also lists a client changed and back, or charged
        nothing) and, the reference forgetting no client, no ``gone``."""
        r = _check_reader(reader)
        active = self.active_clients()
        now = {
            k: (c.counter, c.service, c.prompt_tokens, c.decode_tokens, *active.get(k, (0, 0)))
            for k, c in self._clients.items()
        }
        last = self._readers.get(r)
        self._readers[r] = now
        if last is None:
            return True, dict(now), []
        gone = [k for k in last if k not in now]
        return False, {k: v for k, v in now.items() if last.get(k) != v}, gone

    def reset_changes(self, reader=None) -> None:
        self._readers.pop(_check_reader(reader), None)

    def client_tokens(self, client) -> tuple[int, int]:
        c = self._clients.get(_check_client(client))
        return (c.prompt_tokens, c.decode_tokens) if c else (0, 0)

    def active_clients(self) -> dict:
        counts: dict = {}
        for r in self._requests.values():
            waiting, running = counts.get(r.client, (0, 0))
            counts[r.client] = (waiting, running + 1) if r.running else (waiting + 1, running)
        return {k: counts[k] for k in self._clients if k in counts}

    def credit(self, client) -> float:
        c = self._clients.get(_check_client(client))
        return c.credit if c else 0.0

    def generated(self, request_id) -> int:
        return self._get(request_id).generated
