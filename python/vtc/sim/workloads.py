"""Seeded, deterministic workload generators.

A workload is a list of :class:`Request` sorted by arrival step.  Time is in
engine steps (one decode iteration each); rates are in requests per step.
Each client's stream is drawn from its own ``random.Random`` seeded by the
workload seed and the client's spec, so adding a client never changes the
requests of another, and the same seed always gives the same workload.

The building block is :class:`ClientSpec` (one client's arrival process and
length distribution over a span of steps) turned into requests by
:func:`generate`; the functions below it build the workloads of
``docs/simulation.md`` and of the VTC paper from specs.  :func:`load_trace`
replays a CSV trace.
"""

from __future__ import annotations

import csv
import itertools
import math
import os
import random
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Union

Client = Union[int, str]
Range = tuple[int, int]  # inclusive [lo, hi]; (n, n) is a fixed length

PROMPT: Range = (64, 512)  # the default prompt lengths
OUTPUT: Range = (32, 384)  # the default output lengths

TRACE_ENV = "VTC_TRACE"
TRACE_NAME = "chatbot_arena_27clients.csv"


@dataclass(frozen=True)
class Request:
    """One request: when it arrives, who sent it, and its true lengths.

    ``output_len`` is known to the harness only (it decides when the request
    finishes); the scheduler never sees it.  ``prefix`` describes the shared
    start of the prompt for the prefix cache (:mod:`vtc.sim.cache`): segments
    ``(prefix_id, tokens)`` in order, a ``prefix_id`` naming the same tokens
    wherever it appears (after the same segments); the rest of the prompt is
    the request's own.  The default ``()`` shares nothing.
    """

    arrival: int
    client: Client
    prompt_len: int
    output_len: int
    prefix: tuple[tuple[Hashable, int], ...] = ()


@dataclass(frozen=True)
class ClientSpec:
    """One client's traffic over ``[start, end)`` steps.

    ``rate`` is in requests per step.  With ``rate_end`` set the rate grows
    (or shrinks) linearly from ``rate`` at ``start`` to ``rate_end`` at
    ``end`` (an inhomogeneous Poisson process).  ``arrival`` is ``"poisson"``
    (exponential gaps) or ``"gamma"`` (gamma gaps with coefficient of
    variation ``cv``: ``cv > 1`` is burstier than Poisson, ``cv = 1`` is
    Poisson).  ``end=None`` means the workload's horizon.
    """

    client: Client
    rate: float
    prompt: Range = PROMPT
    output: Range = OUTPUT
    start: int = 0
    end: int | None = None
    arrival: str = "poisson"
    cv: float = 1.0
    rate_end: float | None = None
    burst: int = 0


def service_rate(M: int, prompt: Range = PROMPT, output: Range = OUTPUT) -> float:
    """Rough number of requests per step an engine with KV budget ``M`` completes.

    A request holds on average ``prompt + output / 2`` tokens over the
    ``output`` steps it lives, so about ``M / (prompt + output / 2)`` run at
    once (Little's law).  Workloads use it to express load as a multiple of
    capacity, so that "overloaded" stays overloaded when ``M`` or the lengths
    change.
    """
    mean_p = (prompt[0] + prompt[1]) / 2
    mean_o = (output[0] + output[1]) / 2
    return M / (mean_p + mean_o / 2) / mean_o


def _gaps(rng: random.Random, spec: ClientSpec) -> Iterator[float]:
    if spec.arrival == "poisson":
        while True:
            yield rng.expovariate(spec.rate)
    elif spec.arrival == "gamma":
        shape = 1.0 / (spec.cv * spec.cv)
        scale = 1.0 / (shape * spec.rate)
        while True:
            yield rng.gammavariate(shape, scale)
    else:
        raise ValueError(f"unknown arrival process {spec.arrival!r}; use 'poisson' or 'gamma'")


def _times(rng: random.Random, spec: ClientSpec, end: int) -> Iterator[float]:
    t = float(spec.start)
    if spec.rate_end is None:
        for gap in _gaps(rng, spec):
            t += gap
            if t >= end:
                return
            yield t
        return
    if spec.arrival != "poisson":
        raise ValueError("a rate ramp (rate_end) needs Poisson arrivals")
    # Thinning: draw at the peak rate, keep each arrival with probability rate(t) / peak.
    peak = max(spec.rate, spec.rate_end)
    span = end - spec.start
    while True:
        t += rng.expovariate(peak)
        if t >= end:
            return
        rate = spec.rate + (spec.rate_end - spec.rate) * (t - spec.start) / span
        if rng.random() * peak < rate:
            yield t


def generate(specs: Sequence[ClientSpec], steps: int, seed: int = 0) -> list[Request]:
    """Draw every spec's requests over ``[0, steps)`` and merge them by arrival.

    Requests arriving in the same step keep spec order, then draw order.
    """
    out: list[tuple[int, int, int, Request]] = []
    for k, spec in enumerate(specs):
        rates = (spec.rate,) if spec.rate_end is None else (spec.rate, spec.rate_end)
        if min(rates) < 0 or max(rates) <= 0:
            raise ValueError(f"rates must be >= 0 and not all zero: {spec}")
        end = steps if spec.end is None else min(spec.end, steps)
        rng = random.Random(f"{seed}/{k}/{spec.client!r}/{spec.start}")
        times = itertools.chain([float(spec.start)] * spec.burst, _times(rng, spec, end))
        for j, t in enumerate(times):
            req = Request(
                arrival=int(t),
                client=spec.client,
                prompt_len=rng.randint(*spec.prompt),
                output_len=rng.randint(*spec.output),
            )
            out.append((req.arrival, k, j, req))
    out.sort(key=lambda x: x[:3])
    return [x[3] for x in out]


def overloaded(
    loads: Sequence[float],
    steps: int,
    M: int,
    *,
    prompt: Range = PROMPT,
    output: Range = OUTPUT,
    arrival: str = "poisson",
    cv: float = 1.0,
    seed: int = 0,
) -> list[Request]:
    """Clients ``0..n-1`` sending for the whole run, client ``i`` at ``loads[i]`` x capacity.

    With every load above ``1/n`` each client is permanently over its share
    (its queue grows without bound); loads that differ make FCFS unfair.
    """
    cap = service_rate(M, prompt, output)
    specs = [
        ClientSpec(i, load * cap, prompt, output, arrival=arrival, cv=cv)
        for i, load in enumerate(loads)
    ]
    return generate(specs, steps, seed)


def proportional(
    ratios: Sequence[float], total_load: float, steps: int, M: int, *, seed: int = 0
) -> list[Request]:
    """Clients whose rates are in the proportion ``ratios``, together ``total_load`` x capacity."""
    total = sum(ratios)
    return overloaded([total_load * r / total for r in ratios], steps, M, seed=seed)


def length_mix(
    lengths: Sequence[tuple[int, int]], load: float, steps: int, M: int, *, seed: int = 0
) -> list[Request]:
    """Clients with fixed ``(prompt, output)`` lengths, each at ``load`` x its own capacity.

    E.g. ``[(64, 64), (256, 256)]`` (short vs long) or ``[(512, 32), (32, 512)]``
    (prefill-heavy vs decode-heavy).
    """
    specs = []
    for i, (p, o) in enumerate(lengths):
        rate = load * service_rate(M, (p, p), (o, o))
        specs.append(ClientSpec(i, rate, (p, p), (o, o)))
    return generate(specs, steps, seed)


def incumbent(
    steps: int,
    M: int,
    *,
    prompt: int = 64,
    output: int = 256,
    loads: Sequence[float] = (2.0, 1.0),
    seed: int = 0,
) -> list[Request]:
    """The batch-commitment case behind the ``w_q * M`` lower bound.

    Client 0 has a backlog big enough to fill the KV budget at step 0 (the
    whole first batch is its), client 1 arrives from step 1; afterwards both
    send at ``loads`` x capacity.  Fixed lengths with short prompts and long
    outputs make the decode the machine is committed to dominate.
    """
    p, o = (prompt, prompt), (output, output)
    cap = service_rate(M, p, o)
    specs = [
        ClientSpec(0, loads[0] * cap, p, o, burst=-(-M // prompt)),
        ClientSpec(1, loads[1] * cap, p, o, start=1),
    ]
    return generate(specs, steps, seed)


def returning(
    steps: int,
    M: int,
    *,
    return_step: int,
    quiet: int = 2000,
    under_load: float = 0.25,
    load: float = 1.0,
    back_load: float = 1.5,
    seed: int = 0,
) -> list[Request]:
    """The returning client: client 0 on/off, client 1 steady.

    Client 1 sends at ``load`` x capacity for the whole run.  Client 0 sends
    under its share (``under_load`` x capacity) until ``return_step - quiet``,
    is silent for ``quiet`` steps, then comes back overloaded, in a burst of
    ``back_load`` x capacity (more than the machine serves, so its queue
    does not run dry and whatever it is not given is the scheduler's choice).
    """
    if not 0 < quiet < return_step < steps:
        raise ValueError(
            f"need 0 < quiet ({quiet}) < return_step ({return_step}) < steps ({steps})"
        )
    cap = service_rate(M)
    specs = [
        ClientSpec(0, under_load * cap, end=return_step - quiet),
        ClientSpec(0, back_load * cap, start=return_step),
        ClientSpec(1, load * cap),
    ]
    return generate(specs, steps, seed)


def ramp(
    steps: int, M: int, *, load: float = 1.0, peak: float = 2.0, seed: int = 0
) -> list[Request]:
    """Client 0 steady at ``load`` x capacity; client 1's rate grows linearly from 0 to ``peak``."""
    cap = service_rate(M)
    specs = [
        ClientSpec(0, load * cap),
        ClientSpec(1, 0.0, rate_end=peak * cap, end=steps),
    ]
    return generate(specs, steps, seed)


def phases(loads: Sequence[Sequence[float]], steps: int, M: int, *, seed: int = 0) -> list[Request]:
    """A distribution shift: ``loads[k][i]`` is client ``i``'s load in phase ``k``.

    The run is cut into ``len(loads)`` equal phases; a load of 0 means silent.
    """
    cap = service_rate(M)
    span = math.ceil(steps / len(loads))
    specs = [
        ClientSpec(i, load * cap, start=k * span, end=(k + 1) * span)
        for k, phase in enumerate(loads)
        for i, load in enumerate(phase)
        if load > 0
    ]
    return generate(specs, steps, seed)


PREFIX_RATES = (1.0, 1.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0)  # prefix-heavy tenants' relative rates
PREFIXES: Range = (2, 4)  # shared prefixes per tenant
PREFIX_LEN: Range = (1024, 4096)
SUFFIX_LEN: Range = (20, 200)
SHORT_OUTPUT: Range = (8, 64)


def prefix_heavy(
    steps: int,
    M: int,
    *,
    load: float = 1.0,
    rates: Sequence[float] = PREFIX_RATES,
    prefixes: Range = PREFIXES,
    prefix_len: Range = PREFIX_LEN,
    suffix: Range = SUFFIX_LEN,
    output: Range = SHORT_OUTPUT,
    seed: int = 0,
) -> list[Request]:
    """Tenants ``0..n-1`` (``n = len(rates)``), each with a few long shared prefixes.

    Tenant ``i`` draws ``prefixes`` shared prefixes of ``prefix_len`` tokens
    (ids ``(i, j)``); each of its requests is one of them, uniformly, then its
    own suffix of ``suffix`` tokens, and a short output.  Tenants send Poisson
    arrivals, together ``load`` x :func:`service_rate` of the whole prompt
    lengths (the most the KV budget lets an engine serve, whatever it caches:
    a load of 1 overloads any engine whose prefill takes time), split in the
    proportion ``rates`` (unequal, so FCFS is unfair).
    """
    lo, hi = prefix_len[0] + suffix[0], prefix_len[1] + suffix[1]
    cap = load * service_rate(M, (lo, hi), output) / sum(rates)
    out: list[tuple[int, int, int, Request]] = []
    for i, rate in enumerate(rates):
        rng = random.Random(f"{seed}/prefix/{i}")
        lengths = [rng.randint(*prefix_len) for _ in range(rng.randint(*prefixes))]
        spec = ClientSpec(i, rate * cap)
        for j, t in enumerate(_times(rng, spec, steps)):
            k = rng.randrange(len(lengths))
            req = Request(
                arrival=int(t),
                client=i,
                prompt_len=lengths[k] + rng.randint(*suffix),
                output_len=rng.randint(*output),
                prefix=(((i, k), lengths[k]),),
            )
            out.append((req.arrival, i, j, req))
    out.sort(key=lambda x: x[:3])
    return [x[3] for x in out]


def no_sharing(steps: int, M: int, **kwargs) -> list[Request]:
    """:func:`prefix_heavy`'s requests (same arrivals and lengths) with nothing
    shared: every prompt is unique."""
    return [replace(r, prefix=()) for r in prefix_heavy(steps, M, **kwargs)]


def load_trace(path: str | os.PathLike, steps_per_second: float) -> list[Request]:
    """Replay a CSV trace with columns ``arrival_s,client,prompt_len,output_len``.

    ``arrival_s`` (seconds) becomes step ``int(arrival_s * steps_per_second)``;
    clients keep their names from the file.
    """
    if steps_per_second <= 0:
        raise ValueError("steps_per_second must be positive")
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = {"arrival_s", "client", "prompt_len", "output_len"} - set(reader.fieldnames or ())
        if missing:
            raise ValueError(f"{path}: missing columns {sorted(missing)}")
        reqs = [
            Request(
                arrival=int(float(row["arrival_s"]) * steps_per_second),
                client=row["client"],
                prompt_len=int(row["prompt_len"]),
                output_len=int(row["output_len"]),
            )
            for row in reader
        ]
    reqs.sort(key=lambda r: r.arrival)  # stable: ties keep file order
    return reqs


def find_trace(path: str | os.PathLike | None = None) -> Path:
    """Locate the Chatbot Arena trace.

    Order: ``path`` if given, then ``$VTC_TRACE``, then ``shared/traces/``
    beside the checkout (``<repo>/../shared/traces/``, where CI puts it), then
    ``../shared/traces/`` and ``shared/traces/`` under the working directory.
    """
    if path is not None:
        return Path(path)
    env = os.environ.get(TRACE_ENV)
    if env:
        return Path(env)
    repo = Path(__file__).resolve().parents[3]
    candidates = [
        repo.parent / "shared" / "traces" / TRACE_NAME,
        Path.cwd().parent / "shared" / "traces" / TRACE_NAME,
        Path.cwd() / "shared" / "traces" / TRACE_NAME,
    ]
    for c in candidates:
        if c.is_file():
            return c
    raise FileNotFoundError(
        f"cannot find {TRACE_NAME}; looked in {[str(c) for c in candidates]}. "
        f"Pass --trace PATH or set {TRACE_ENV}."
    )
