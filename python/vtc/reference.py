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
* A client is *backlogged* while it has waiting requests.  ``schedule()``
  repeatedly takes the backlogged client with the smallest key, where the key
  is ``(counter, seq of its head request)`` for ``vtc``/``lcf`` and
  ``(seq of its head request,)`` for ``fcfs``, and admits its oldest waiting
  request if ``occupancy + footprint <= M`` (footprint = prompt + tokens
  generated so far, which is non-zero only for a preempted request).  The
  first request that does not fit stops admission: no skipping.
* The lift (``vtc`` only): when a client with no waiting request submits one,
  ``counter = max(counter, min counter over backlogged clients)``, or, when no
  client is backlogged, ``max(counter, counter of the client that most
  recently left the backlog)``.  A client leaves the backlog when its last
  waiting request is admitted or cancelled.
* ``decode()`` without arguments is one engine iteration: each running request
  generates one token.  If the batch would outgrow ``M``, running requests are
  preempted first, from the client with the largest counter (latest admission
  among equals; under ``fcfs`` simply the latest admission): back to the head
  of their client's queue, never charged again for what they already paid.
  If the last remaining request alone cannot grow, ``CapacityError`` is
  raised and nothing changes.
* ``decode(request_ids, tokens)`` records what an engine produced; the engine
  owns memory there, so no capacity check is made (likewise ``pop()``).
"""

from __future__ import annotations

import math
import operator
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from vtc._core import MAX_TOKENS_PER_CALL
from vtc.errors import (
    CapacityError,
    DuplicateRequestError,
    InvalidArgumentError,
    RequestStateError,
    UnknownRequestError,
)

POLICIES = ("vtc", "lcf", "fcfs")


@dataclass
class _Client:
    counter: float = 0.0
    service: float = 0.0
    weight: float = 1.0
    inv_w: float = 1.0
    queue: deque = field(default_factory=deque)  # request ids, oldest first


@dataclass
class _Request:
    rid: int
    client: object
    prompt: int
    seq: int
    cached: int = 0
    generated: int = 0
    prefill_paid: bool = False
    running: bool = False
    admit_seq: int = 0


def _as_int(name: str, value) -> int:
    """An int, or anything with ``__index__`` (numpy integers); never a bool."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {value!r}") from None


def _check_int(name: str, value, minimum: int) -> int:
    value = _as_int(name, value)
    if value < minimum:
        raise InvalidArgumentError(f"{name} must be >= {minimum}, got {value}")
    return value


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


def _check_weight(weight) -> float:
    if isinstance(weight, bool) or not isinstance(weight, (int, float)):
        raise TypeError(f"weight must be a number, got {weight!r}")
    w = float(weight)
    if not (math.isfinite(w) and w > 0.0):
        raise InvalidArgumentError(f"weight must be a positive finite number, got {weight!r}")
    return w


class Scheduler:
    """Pure-Python VTC with the same API and semantics as ``vtc.Scheduler``."""

    def __init__(self, M: int, wp: float = 1.0, wq: float = 2.0, policy: str = "vtc") -> None:
        M = _check_int("M", M, 1)
        for name, w in (("wp", wp), ("wq", wq)):
            if isinstance(w, bool) or not isinstance(w, (int, float)):
                raise TypeError(f"{name} must be a number, got {w!r}")
            if not (math.isfinite(w) and w >= 0.0):
                raise InvalidArgumentError(f"{name} must be a finite number >= 0, got {w!r}")
        if policy not in POLICIES:
            raise InvalidArgumentError(f"unknown policy {policy!r}; expected one of {POLICIES}")
        self.M = M
        self.wp = float(wp)
        self.wq = float(wq)
        self.policy = policy
        self._clients: dict[object, _Client] = {}
        self._requests: dict[int, _Request] = {}
        self._running: list[int] = []
        self._seq = 0
        self._admit_seq = 0
        self._last_left = None
        self.occupancy = 0

    # -- read-only views ---------------------------------------------------
    @property
    def num_waiting(self) -> int:
        return sum(len(c.queue) for c in self._clients.values())

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
        return "running" if r.running else "waiting"

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
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"value must be a number, got {value!r}")
        if not math.isfinite(value):
            raise InvalidArgumentError(f"counter must be a finite number, got {value!r}")
        c = self._clients.setdefault(client, _Client())
        c.counter = max(c.counter, float(value))

    # -- the policy --------------------------------------------------------
    def _backlogged(self) -> list:
        return [k for k, c in self._clients.items() if c.queue]

    def _key(self, k):
        c = self._clients[k]
        head_seq = self._requests[c.queue[0]].seq
        if self.policy == "fcfs":
            return (head_seq,)
        return (c.counter, head_seq)

    def _select(self):
        backlog = self._backlogged()
        if not backlog:
            return None
        return min(backlog, key=self._key)

    def _lift(self, k) -> None:
        """place_entity: a client re-entering the backlog never keeps credit
        banked while it was idle, and is never moved backwards."""
        c = self._clients[k]
        backlog = self._backlogged()
        if backlog:
            floor = min(self._clients[b].counter for b in backlog)
        elif self._last_left is not None:
            floor = self._clients[self._last_left].counter
        else:
            return
        c.counter = max(c.counter, floor)

    def submit(self, request_id, client, prompt_len, cached_len=None) -> None:
        rid = _check_request_id(request_id)
        client = _check_client(client)
        prompt_len = _check_int("prompt_len", prompt_len, 1)
        cached = 0 if cached_len is None else _as_int("cached_len", cached_len)
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
        if not c.queue and self.policy == "vtc":
            self._lift(client)
        self._seq += 1
        self._requests[rid] = _Request(rid, client, prompt_len, self._seq, cached)
        c.queue.append(rid)

    def _charge(self, c: _Client, amount: float) -> None:
        c.counter += amount
        c.service += amount

    def _admit(self, k) -> int:
        c = self._clients[k]
        rid = c.queue.popleft()
        r = self._requests[rid]
        self.occupancy += r.prompt + r.generated
        if not r.prefill_paid:
            r.prefill_paid = True
            self._charge(c, (self.wp * (r.prompt - r.cached)) * c.inv_w)
        r.running = True
        self._admit_seq += 1
        r.admit_seq = self._admit_seq
        self._running.append(rid)
        if not c.queue:
            self._last_left = k
        return rid

    def schedule(self) -> list[int]:
        admitted = []
        while True:
            k = self._select()
            if k is None:
                break
            r = self._requests[self._clients[k].queue[0]]
            if self.occupancy + r.prompt + r.generated > self.M:
                break
            admitted.append(self._admit(k))
        return admitted

    def peek(self) -> int | None:
        k = self._select()
        return None if k is None else self._clients[k].queue[0]

    def pop(self, cached_len=None) -> int | None:
        k = self._select()
        if k is None:
            return None
        if cached_len is not None:
            cached = _as_int("cached_len", cached_len)
            r = self._requests[self._clients[k].queue[0]]
            if not 0 <= cached <= r.prompt:
                raise InvalidArgumentError(
                    f"cached_len must be between 0 and prompt_len={r.prompt}, got {cached}"
                )
            r.cached = cached
        return self._admit(k)

    def _get(self, rid) -> _Request:
        rid = _check_request_id(rid)
        r = self._requests.get(rid)
        if r is None:
            raise UnknownRequestError(f"unknown request {rid}")
        return r

    def _get_running(self, rid, what: str) -> _Request:
        r = self._get(rid)
        if not r.running:
            raise RequestStateError(f"cannot {what} request {r.rid}: it is waiting, not running")
        return r

    def _charge_tokens(self, per_client: dict) -> None:
        for k, tokens in per_client.items():
            c = self._clients[k]
            self._charge(c, (self.wq * tokens) * c.inv_w)

    def decode(self, request_ids: Sequence[int] | None = None, tokens=None) -> list[int]:
        if request_ids is None:
            if tokens is not None:
                raise TypeError("tokens given without request_ids")
            return self._decode_all()
        rids = list(request_ids)
        if isinstance(tokens, int) and not isinstance(tokens, bool):
            toks = [tokens] * len(rids)
        elif tokens is None:
            toks = [1] * len(rids)
        else:
            toks = list(tokens)
        if len(toks) != len(rids):
            raise InvalidArgumentError(
                f"request_ids and tokens differ in length: {len(rids)} != {len(toks)}"
            )
        seen = set()
        reqs = []
        for rid, t in zip(rids, toks):
            r = self._get_running(rid, "decode")
            if r.rid in seen:
                raise InvalidArgumentError(f"request {r.rid} appears twice in one decode call")
            seen.add(r.rid)
            t = _check_int("tokens", t, 0)
            if t > MAX_TOKENS_PER_CALL:
                raise InvalidArgumentError(f"tokens {t} exceeds {MAX_TOKENS_PER_CALL}")
            reqs.append((r, t))
        per_client: dict = {}
        for r, t in reqs:
            r.generated += t
            self.occupancy += t
            per_client[r.client] = per_client.get(r.client, 0) + t
        self._charge_tokens(per_client)
        return []

    def _decode_all(self) -> list[int]:
        victims = []
        if self.occupancy + len(self._running) > self.M:
            # Evict from the most-served client first, latest admission first
            # (fcfs, the baseline, evicts like a plain engine: latest first).
            order = sorted(
                self._running,
                key=lambda rid: (
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
        for rid in self._running:
            r = self._requests[rid]
            r.generated += 1
            per_client[r.client] = per_client.get(r.client, 0) + 1
        self.occupancy += len(self._running)
        self._charge_tokens(per_client)
        return victims

    def preempt(self, request_id) -> None:
        r = self._get_running(request_id, "preempt")
        self._running.remove(r.rid)
        r.running = False
        self.occupancy -= r.prompt + r.generated
        # Back to the head of its client's queue; it keeps its submit seq, so
        # it stays ahead of the client's later requests.  No lift: the client
        # was being served, not idle.
        self._clients[r.client].queue.appendleft(r.rid)

    def finish(self, request_id) -> None:
        r = self._get_running(request_id, "finish")
        self._running.remove(r.rid)
        self.occupancy -= r.prompt + r.generated
        del self._requests[r.rid]

    def cancel(self, request_id) -> None:
        r = self._get(request_id)
        if r.running:
            self._running.remove(r.rid)
            self.occupancy -= r.prompt + r.generated
        else:
            c = self._clients[r.client]
            c.queue.remove(r.rid)
            if not c.queue:
                self._last_left = r.client
        del self._requests[r.rid]

    def clients(self) -> list:
        return list(self._clients)

    def counters(self) -> dict:
        return {k: c.counter for k, c in self._clients.items()}

    def services(self) -> dict:
        return {k: c.service for k, c in self._clients.items()}

    def generated(self, request_id) -> int:
        return self._get(request_id).generated
