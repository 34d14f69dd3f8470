"""The experiments of ``docs/simulation.md`` and the VTC paper, one function each.

Every experiment takes :class:`Options` and returns a
:class:`~vtc.sim.report.Report` (tables plus the runs worth plotting).  The
default setup: ``M = 8192``, ``w_p = 1``, ``w_q = 2``,
prompts ``U[64, 512]``, outputs ``U[32, 384]``, an RPM "minute" of 2000 steps.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Callable

import numpy as np

from vtc.sim import metrics, workloads
from vtc.sim.cache import PrefixCache
from vtc.sim.engine import SchedulerFactory, SimResult, simulate
from vtc.sim.progress import Progress
from vtc.sim.report import Panel, Report, Table
from vtc.sim.workloads import Request

TWO_OVERLOADED = (2.0, 1.0)  # loads (x capacity) of the two permanently overloaded clients
KV_SWEEP = (2048, 4096, 8192, 16384, 32768)
RPM_SWEEP = (5, 20, 40, 80, None)
TRACE_RPMS = (5, 20)
WEIGHTS = (1.0, 2.0, 3.0, 4.0)
PRIORITY_LOADS = (0.5, 2.0, 0.6)  # urgent (priority 0), batch-a and batch-b (priority 1)


@dataclass
class Options:
    """Knobs shared by the experiments; ``None`` means the experiment's own default."""

    steps: int | None = None
    seed: int = 0
    M: int | None = None
    wp: float = 1.0
    wq: float = 2.0
    minute: int = 2000
    trace: str | os.PathLike | None = None
    steps_per_second: float = 18.0
    factory: SchedulerFactory | None = None
    progress: bool | None = None
    sync_interval: int = 10
    redis_url: str | None = None

    def run(
        self,
        label: str,
        requests: Sequence[Request],
        steps: int,
        *,
        M: int,
        policy: str,
        rpm: int | None = None,
        minute: int | None = None,
        weights: dict | None = None,
        options: dict | None = None,
        cached: Sequence[int] | None = None,
        predicted: Sequence[int] | None = None,
        priority: Sequence[int] | None = None,
        cache: PrefixCache | None = None,
        prefill_time: float = 0.0,
        factory: SchedulerFactory | None = None,
    ) -> SimResult:
        """:func:`~vtc.sim.engine.simulate` with these options and a progress bar
        (``factory``, when given, instead of ``self.factory``)."""
        return simulate(
            requests,
            steps,
            M=M,
            wp=self.wp,
            wq=self.wq,
            policy=policy,
            weights=weights,
            rpm=rpm,
            minute=self.minute if minute is None else minute,
            factory=factory or self.factory,
            progress=Progress(label, steps, enabled=self.progress),
            options=options,
            cached=cached,
            predicted=predicted,
            priority=priority,
            cache=cache,
            prefill_time=prefill_time,
        )


def _drift_row(result: SimResult) -> dict:
    drift = metrics.max_drift(result, 0, 1)
    return {
        "half_run_drift": metrics.max_drift(result, 0, 1, end=result.steps // 2),
        "max_drift": drift,
        "drift_over_2U": drift / (2 * metrics.result_u(result)),
        "throughput": metrics.throughput(result),
    }


def drift(opts: Options) -> Report:
    """Table 1: FCFS vs least-counter-first (no lift) vs VTC, two clients permanently overloaded.

    Client 0 sends at twice capacity, client 1 at capacity, both from step 0.
    VTC must stay within ``2U``; FCFS drift grows for as long as the run
    (``half_run_drift`` is the max drift over the first half of the run).
    """
    steps, M = opts.steps or 20000, opts.M or 8192
    reqs = workloads.overloaded(TWO_OVERLOADED, steps, M, seed=opts.seed)
    table = Table(
        "drift",
        f"Two permanently overloaded clients (M={M:,}, {steps:,} steps)",
        ["scheduler", "half_run_drift", "max_drift", "drift_over_2U", "throughput"],
    )
    panels = []
    for policy in ("fcfs", "lcf", "vtc"):
        res = opts.run(f"drift {policy}", reqs, steps, M=M, policy=policy)
        table.rows.append({"scheduler": policy, **_drift_row(res)})
        panels.append(Panel(policy, res))
    return Report([table], panels)


def returning(opts: Options, window: int = 600, quiet: int = 2000) -> Report:
    """Table 2: the returning client.

    Client 0 sends under its share, is silent for ``quiet`` steps, then comes
    back overloaded at ``steps - window``; client 1 is overloaded throughout.
    Measured over the ``window`` steps after the return: client 0's share of
    the service and the service client 1 received.
    """
    steps, M = opts.steps or 6600, opts.M or 8192
    ret = steps - window
    reqs = workloads.returning(steps, M, return_step=ret, quiet=quiet, seed=opts.seed)
    table = Table(
        "returning",
        f"Returning client, {window} steps after its return (M={M:,})",
        ["scheduler", "returning_share", "steady_service"],
    )
    panels, zoom = [], []
    for policy in ("fcfs", "lcf", "vtc"):
        res = opts.run(f"returning {policy}", reqs, steps, M=M, policy=policy)
        steady = metrics.service(res, 1)
        table.rows.append(
            {
                "scheduler": policy,
                "returning_share": metrics.shares(res, ret, steps)[0],
                "steady_service": float(steady[steps] - steady[ret]),
            }
        )
        mark = [(ret, "client 0 returns")]
        names = {0: "client 0 (returning)", 1: "client 1 (steady)"}
        panels.append(
            Panel(policy, res, marks=mark, shade=(ret - quiet, ret, "silent"), labels=names)
        )
        zoom.append(
            Panel(f"{policy}: service since the return", res, mark, zoom=(ret, steps), labels=names)
        )
    return Report([table], panels + zoom)


def kv_sweep(opts: Options, sizes: Sequence[int] = KV_SWEEP) -> Report:
    """Table 3: VTC's max drift as the KV budget ``M`` grows, against ``2 * w_q * M``.

    Two workloads: ``note`` is table 1's (random lengths, both clients from
    step 0); ``incumbent`` is the batch-commitment case behind the lower
    bound (client 0's backlog fills the whole first batch before client 1
    arrives; fixed 64-token prompts and 256-token outputs).
    """
    steps = opts.steps or 20000
    table = Table(
        "kv_sweep",
        f"VTC max drift vs KV budget ({steps:,} steps)",
        ["workload", "M", "max_drift", "two_wq_M", "drift_over_2U", "drift_over_service"],
    )
    panels = []
    gens: dict[str, Callable[[int], list[Request]]] = {
        "note": lambda M: workloads.overloaded(TWO_OVERLOADED, steps, M, seed=opts.seed),
        "incumbent": lambda M: workloads.incumbent(steps, M, seed=opts.seed),
    }
    for name, gen in gens.items():
        for M in sizes:
            res = opts.run(f"kv-sweep {name} M={M}", gen(M), steps, M=M, policy="vtc")
            row = _drift_row(res)
            total = sum(float(metrics.service(res, c)[steps]) for c in (0, 1))
            table.rows.append(
                {
                    "workload": name,
                    "M": M,
                    "max_drift": row["max_drift"],
                    "two_wq_M": 2 * opts.wq * M,
                    "drift_over_2U": row["drift_over_2U"],
                    "drift_over_service": row["max_drift"] / total,
                }
            )
            if name == "incumbent":
                panels.append(Panel(f"incumbent, M={M:,}", res))
    return Report([table], panels)


def rpm_sweep(opts: Options, limits: Sequence[int | None] = RPM_SWEEP) -> Report:
    """Table 4: an RPM quota in front of FCFS, drift vs throughput, with VTC for reference.

    Table 1's workload; a "minute" is ``opts.minute`` steps; ``None`` is no
    limit (plain FCFS).
    """
    steps, M = opts.steps or 20000, opts.M or 8192
    reqs = workloads.overloaded(TWO_OVERLOADED, steps, M, seed=opts.seed)
    table = Table(
        "rpm_sweep",
        f"RPM limit vs VTC (M={M:,}, minute = {opts.minute:,} steps, {steps:,} steps)",
        ["scheduler", "rpm", "max_drift", "throughput"],
    )
    panels = []
    for rpm in limits:
        res = opts.run(f"rpm-sweep rpm={rpm}", reqs, steps, M=M, policy="fcfs", rpm=rpm)
        row = _drift_row(res)
        table.rows.append(
            {
                "scheduler": "fcfs" if rpm is None else "fcfs+rpm",
                "rpm": "unlimited" if rpm is None else rpm,
                "max_drift": row["max_drift"],
                "throughput": row["throughput"],
            }
        )
        panels.append(Panel("no limit" if rpm is None else f"RPM {rpm}", res))
    res = opts.run("rpm-sweep vtc", reqs, steps, M=M, policy="vtc")
    row = _drift_row(res)
    table.rows.append(
        {
            "scheduler": "vtc",
            "rpm": None,
            "max_drift": row["max_drift"],
            "throughput": row["throughput"],
        }
    )
    panels.append(Panel("vtc", res))
    return Report([table], panels)


def trace(opts: Options) -> Report:
    """The real trace (27 clients, ~600 s) under FCFS, LCF, VTC and RPM 5 / 20.

    Arrival seconds become steps at ``opts.steps_per_second`` (default 18:
    the trace then offers ~1.3x what the engine serves, close to the paper's
    A10G run, 981 tokens/s offered for 777 served).  The run ends with the
    last arrival (``--steps`` cuts it shorter).  Service difference uses 60 s
    windows and is in weighted tokens per second; the RPM minute is 60 s of
    trace time.  Latency: first-token latency in seconds of requests admitted
    during the run, for the clients that sent more requests than the average
    client ("heavy") and the others ("light").
    """
    sps = opts.steps_per_second
    M = opts.M or 10000
    reqs = workloads.load_trace(workloads.find_trace(opts.trace), sps)
    steps = min(opts.steps or reqs[-1].arrival + 1, reqs[-1].arrival + 1)
    minute = round(60 * sps)
    counts: dict = {}
    for r in reqs:
        counts[r.client] = counts.get(r.client, 0) + 1
    heavy = [c for c, k in counts.items() if k > len(reqs) / len(counts)]
    light = [c for c in counts if c not in heavy]
    table = Table(
        "trace",
        f"Chatbot Arena trace, {len(counts)} clients, {len(reqs):,} requests "
        f"(M={M:,}, {sps:g} steps/s, {steps:,} steps)",
        [
            "scheduler",
            "max_diff",
            "avg_diff",
            "diff_var",
            "throughput",
            "throughput_tok_s",
            "admitted",
        ],
    )
    lat = Table(
        "trace_latency",
        f"First-token latency (s) on the trace: {len(heavy)} heavy clients vs {len(light)} light",
        ["scheduler", "heavy_ttft_p50", "heavy_ttft_p99", "light_ttft_p50", "light_ttft_p99"],
    )
    panels = []
    runs = [("fcfs", "fcfs", None), ("lcf", "lcf", None), ("vtc", "vtc", None)]
    runs += [(f"rpm{k}", "fcfs", k) for k in TRACE_RPMS]
    for name, policy, rpm in runs:
        res = opts.run(f"trace {name}", reqs, steps, M=M, policy=policy, rpm=rpm, minute=minute)
        diff = metrics.service_difference(res, window=minute) * sps
        tput = metrics.throughput(res)
        table.rows.append(
            {
                "scheduler": name,
                "max_diff": float(diff.max()),
                "avg_diff": float(diff.mean()),
                "diff_var": float(diff.var()),
                "throughput": tput,
                "throughput_tok_s": tput * sps,
                "admitted": float(np.mean(np.array(res.first_admit) >= 0)),
            }
        )
        hv, lt = metrics.ttft(res, heavy) / sps, metrics.ttft(res, light) / sps
        lat.rows.append(
            {
                "scheduler": name,
                "heavy_ttft_p50": metrics.percentile(hv, 50),
                "heavy_ttft_p99": metrics.percentile(hv, 99),
                "light_ttft_p50": metrics.percentile(lt, 50),
                "light_ttft_p99": metrics.percentile(lt, 99),
            }
        )
        panels.append(Panel(name, res))
    return Report([table, lat], panels)


def weighted(opts: Options, weights: Sequence[float] = WEIGHTS) -> Report:
    """Weighted VTC: overloaded clients with weights 1:2:3:4 get service in that ratio.

    Every client sends at capacity (all are over their share).  ``share`` is
    the client's fraction of weighted tokens over the run; first-token
    latencies are in steps.
    """
    steps, M = opts.steps or 20000, opts.M or 8192
    reqs = workloads.overloaded([1.0] * len(weights), steps, M, seed=opts.seed)
    ws = dict(enumerate(weights))
    res = opts.run("weighted vtc", reqs, steps, M=M, policy="vtc", weights=ws)
    share = metrics.shares(res)
    table = Table(
        "weighted",
        f"Weighted VTC, {len(ws)} overloaded clients (M={M:,}, {steps:,} steps)",
        ["client", "weight", "share", "expected_share", "ttft_p50", "ttft_p99"],
    )
    for c, w in ws.items():
        lat = metrics.ttft(res, [c])
        table.rows.append(
            {
                "client": c,
                "weight": w,
                "share": share[c],
                "expected_share": w / sum(weights),
                "ttft_p50": metrics.percentile(lat, 50),
                "ttft_p99": metrics.percentile(lat, 99),
            }
        )
    return Report(
        [table], [Panel("weighted vtc, weights " + ":".join(f"{w:g}" for w in weights), res)]
    )


def priority(opts: Options, loads: Sequence[float] = PRIORITY_LOADS) -> Report:
    """Priority bands: an interactive tenant at priority 0 and two batch tenants at 1.

    ``urgent`` sends at half the capacity (over its third of the machine, under
    the whole of it), ``batch-a`` at 2x and ``batch-b`` at 0.6x: both are over
    their share of what is left. Four schedulers: FCFS and VTC, both ignoring
    priorities; stock priority (what vLLM and SGLang do: the band, then
    arrival); VTC with strict bands (the band, then the least counter); VTC
    with weighted bands 1:1 and 1:3 (the bands share the machine by weight).
    Rows: the urgent tenant's first-token latency (steps) and share of all
    service; inside the batch band, ``batch-a``'s share of the band's service
    and the largest gap between ``batch-a`` and ``batch-b`` while both were
    backlogged (against the bound ``2 * max(wp * L, wq * M)``); between the
    bands, the largest gap of their weighted service while both were
    backlogged, against ``2 * max(wp * L, wq * M) / min weight``
    (``docs/priority.md``; 1:1 weights for the rows without).
    """
    steps, M = opts.steps or 20000, opts.M or 8192
    reqs = workloads.overloaded(list(loads), steps, M, seed=opts.seed)
    bands = [0 if r.client == 0 else 1 for r in reqs]
    names = {0: "urgent", 1: "batch-a", 2: "batch-b"}
    runs = [
        ("fcfs", "fcfs", None, None),
        ("stock priority", "fcfs", bands, None),
        ("vtc", "vtc", None, None),
        ("vtc + bands", "vtc", bands, None),
        ("vtc + bands 1:1", "vtc", bands, (1.0, 1.0)),
        ("vtc + bands 1:3", "vtc", bands, (1.0, 3.0)),
    ]
    table = Table(
        "priority",
        f"Priority bands: urgent {loads[0]:g}x capacity at priority 0, batch-a {loads[1]:g}x and "
        f"batch-b {loads[2]:g}x at priority 1 (M={M:,}, {steps:,} steps)",
        [
            "scheduler",
            "urgent_ttft_p50",
            "urgent_ttft_p99",
            "urgent_share",
            "batch_a_share_of_band",
            "batch_max_drift",
            "drift_over_2U",
            "band_drift_over_bound",
            "throughput",
        ],
    )
    panels = []
    for label, policy, prio, band_w in runs:
        options = None if band_w is None else {"band_weights": {0: band_w[0], 1: band_w[1]}}
        res = opts.run(
            f"priority {label}", reqs, steps, M=M, policy=policy, priority=prio, options=options
        )
        lat = metrics.ttft(res, [0])
        share = metrics.shares(res)
        drift = metrics.max_drift(res, 1, 2)
        w = band_w or (1.0, 1.0)
        band_drift = metrics.max_group_drift(res, [0], [1, 2], w)
        band_bound = 2 * metrics.result_u(res) / min(w)
        table.rows.append(
            {
                "scheduler": label,
                "urgent_ttft_p50": metrics.percentile(lat, 50),
                "urgent_ttft_p99": metrics.percentile(lat, 99),
                "urgent_share": share[0],
                "batch_a_share_of_band": share[1] / (share[1] + share[2]),
                "batch_max_drift": drift,
                "drift_over_2U": drift / (2 * metrics.result_u(res)),
                "band_drift_over_bound": band_drift / band_bound,
                "throughput": metrics.throughput(res),
            }
        )
        if prio is not None:
            panels.append(Panel(label, res, labels=names))
    return Report([table], panels)


def scenarios(opts: Options) -> Report:
    """The paper's other workloads under FCFS and VTC: max pairwise drift, throughput, shares."""
    steps, M, seed = opts.steps or 20000, opts.M or 8192, opts.seed
    gens: dict[str, Callable[[], list[Request]]] = {
        "overload-4": lambda: workloads.overloaded([0.5, 1.0, 1.5, 2.0], steps, M, seed=seed),
        "proportional": lambda: workloads.proportional([1, 2, 3, 4], 1.5, steps, M, seed=seed),
        "gamma-cv4": lambda: workloads.overloaded(
            TWO_OVERLOADED, steps, M, arrival="gamma", cv=4.0, seed=seed
        ),
        "64/64-256/256": lambda: workloads.length_mix(
            [(64, 64), (256, 256)], 1.0, steps, M, seed=seed
        ),
        "512/32-32/512": lambda: workloads.length_mix(
            [(512, 32), (32, 512)], 1.0, steps, M, seed=seed
        ),
        "ramp": lambda: workloads.ramp(steps, M, seed=seed),
        "phases": lambda: workloads.phases(
            [[1.0, 0.2], [0.2, 1.0], [1.0, 1.0]], steps, M, seed=seed
        ),
    }
    table = Table(
        "scenarios",
        f"Other workloads (M={M:,}, {steps:,} steps); shares in % of weighted tokens",
        ["workload", "scheduler", "max_drift", "drift_over_2U", "throughput", "shares"],
    )
    panels = []
    for name, gen in gens.items():
        reqs = gen()
        for policy in ("fcfs", "vtc"):
            res = opts.run(f"{name} {policy}", reqs, steps, M=M, policy=policy)
            drift = metrics.max_pair_drift(res)
            share = metrics.shares(res)
            table.rows.append(
                {
                    "workload": name,
                    "scheduler": policy,
                    "max_drift": drift,
                    "drift_over_2U": drift / (2 * metrics.result_u(res)),
                    "throughput": metrics.throughput(res),
                    "shares": [share[c] for c in res.clients],
                }
            )
            if policy == "vtc":
                panels.append(Panel(f"{name} (vtc)", res))
    return Report([table], panels)


def replicas(opts: Options, sizes: Sequence[int] = (2, 4, 8)) -> Report:
    """N replicas behind a router with skewed ingress: per-replica VTC vs global VTC vs FCFS.

    N tenants, each at 1.5x one replica's capacity: tenant 0 is pinned to
    replica 0, the others are spread round-robin over all replicas, so the
    fair split is 1/N each.  ``global`` shares counters through
    :class:`vtc.distributed.SharedCounters` every ``opts.sync_interval`` steps
    (an in-process twin of the Redis script, or Redis itself with
    ``opts.redis_url``).  ``staleness`` is the largest lag of a local counter
    behind the global one, ``eps`` its bound ``2 (N-1) S mu``; ``drift_over_bound``
    divides the max drift by ``2 (N U + eps)`` (``docs/distributed.md``).
    """
    from vtc import distributed
    from vtc.sim.replicas import MODES, pinned_router, simulate_replicas

    steps, M, S = opts.steps or 10000, opts.M or 8192, opts.sync_interval
    table = Table(
        "replicas",
        f"Skewed ingress over N replicas: tenant 0 pinned to replica 0, the rest spread "
        f"(M={M:,} each, {steps:,} steps, sync every {S} steps); shares in %",
        [
            "replicas",
            "scheduler",
            "pinned_share",
            "fair_share",
            "shares",
            "max_drift",
            "drift_over_2U",
            "drift_over_bound",
            "staleness",
            "eps",
            "throughput",
            "syncs",
        ],
    )
    panels = []
    for n in sizes:
        reqs = workloads.overloaded([1.5] * n, steps, M, seed=opts.seed)
        for mode in MODES:
            store = None
            if mode == "global" and opts.redis_url:
                store = distributed.RedisStore.from_url(
                    opts.redis_url, f"sim-{os.getpid()}-{n}", timeout_ms=2000
                )
                store.clear()
            run = simulate_replicas(
                reqs,
                steps,
                replicas=n,
                mode=mode,
                route=pinned_router(n),
                M=M,
                wp=opts.wp,
                wq=opts.wq,
                sync_interval=S,
                store=store,
            )
            if isinstance(store, distributed.RedisStore):
                store.clear()
            res = run.result
            share = metrics.shares(res)
            drift = metrics.max_pair_drift(res)
            u = metrics.result_u(res)
            glob = mode == "global"
            table.rows.append(
                {
                    "replicas": n,
                    "scheduler": mode,
                    "pinned_share": share[0],
                    "fair_share": 1 / n,
                    "shares": [share[c] for c in res.clients],
                    "max_drift": drift,
                    "drift_over_2U": drift / (2 * u),
                    "drift_over_bound": drift / distributed.drift_bound(n, S, run.rate, u),
                    "staleness": run.staleness if glob else None,
                    "eps": run.staleness_bound if glob else None,
                    "throughput": metrics.throughput(res),
                    "syncs": run.syncs,
                }
            )
            panels.append(Panel(f"N={n} {mode}", res))
    return Report([table], panels)


# ------------------------------------------------------------------ accounting

CONTEXT_BETA = 1.0 / 512.0
CAPS = (None, 0.5, 0.25)


def _delivered(result: SimResult) -> SimResult:
    """``result`` with ``service`` replaced by the harness-measured delivered service."""
    return dataclasses.replace(result, service=result.delivered)


def _metered(result: SimResult, metric: str, cached: Sequence[int] | None = None) -> dict:
    """Per-client service actually computed over the run, metered by ``metric``.

    Every request admitted at least once counts its computed prompt
    ``n = prompt - cached`` and the ``g`` tokens it generated: ``tokens`` is
    ``wp*n + wq*g``; ``context`` adds ``beta * (g*prompt + g*(g-1)/2)`` (the
    KV reads of decoding, :data:`CONTEXT_BETA`); ``quadratic`` is the paper's
    ``2.1*n + g + 0.04*prompt*g + 0.032*g**2 + 11.46``.
    """
    hit = cached if cached is not None else (result.cached or [0] * len(result.requests))
    out = {c: 0.0 for c in result.clients}
    for i, r in enumerate(result.requests):
        if result.first_admit[i] < 0:
            continue
        p, n, g = r.prompt_len, r.prompt_len - hit[i], result.generated[i]
        if metric == "tokens":
            v = result.wp * n + result.wq * g
        elif metric == "context":
            v = result.wp * n + result.wq * g + CONTEXT_BETA * (g * p + g * (g - 1) / 2)
        else:
            v = 2.1 * n + g + 0.04 * p * g + 0.032 * g * g + 11.46
        out[r.client] += v
    return out


def _share(values: dict, client) -> float:
    total = sum(values.values())
    return values[client] / total if total else 0.0


def _two(steps: int, M: int, seed: int, a: tuple, b: tuple, load: float = 2.0) -> list[Request]:
    """Two clients ``a`` and ``b`` = (name, prompt range, output range), each at
    ``load`` times what the engine could serve of that client alone."""
    specs = [
        workloads.ClientSpec(name, load * workloads.service_rate(M, pr, out), prompt=pr, output=out)
        for name, pr, out in (a, b)
    ]
    return workloads.generate(specs, steps, seed=seed)


def accounting(opts: Options) -> Report:
    """Accounting beyond tokens (docs/accounting.md): one table per variant vs plain VTC.

    * ``accounting-cost``: a long-context and a short-context client, both
      overloaded, under the linear, the paper's quadratic and the
      context-aware cost; each client's share of the service actually
      computed, metered three ways.  Each cost equalises its own metric.
    * ``accounting-prefix``: prompt-heavy clients, one whose prompts are 75%
      prefix-cache hits; computed service with and without ``cached_len``.
    * ``accounting-preemption``: long outputs in a small ``M``, so
      ``decode()`` preempts; recomputed tokens and the gap between what was
      charged and what was computed (VTC never charges recomputation).
    * ``accounting-cap``: one heavy client and three light bursty ones under
      per-client caps; the utilisation the cap costs.
    * ``accounting-predict``: long- and short-output clients with no, oracle,
      noisy (user-supplied) and moving-average length predictions; drift of
      the delivered service.
    """
    from vtc import ContextCost, QuadraticCost

    steps, M, seed = opts.steps or 20000, opts.M or 8192, opts.seed
    tables, panels = [], []

    # 1. cost functions
    reqs = _two(
        steps, M, seed, ("long-ctx", (2048, 3072), (256, 512)), ("short-ctx", (64, 256), (256, 512))
    )
    t = Table(
        "accounting-cost",
        f"Cost functions: long- vs short-context client, both overloaded (M={M:,}, "
        f"{steps:,} steps); long-ctx share of computed service, metered three ways",
        [
            "cost",
            "tokens_share",
            "context_share",
            "quadratic_share",
            "long-ctx_done",
            "short-ctx_done",
            "throughput",
        ],
    )
    for name, cost in (
        ("linear (plain vtc)", None),
        ("quadratic", QuadraticCost()),
        ("context", ContextCost(opts.wp, opts.wq, CONTEXT_BETA)),
    ):
        o = None if cost is None else {"cost": cost}
        res = opts.run(f"cost {name}", reqs, steps, M=M, policy="vtc", options=o)
        t.rows.append(
            {
                "cost": name,
                **{
                    f"{m}_share": _share(_metered(res, m), "long-ctx")
                    for m in ("tokens", "context", "quadratic")
                },
                **{
                    f"{c}_done": sum(
                        1
                        for i, r in enumerate(res.requests)
                        if r.client == c and res.finish[i] >= 0
                    )
                    for c in ("long-ctx", "short-ctx")
                },
                "throughput": metrics.throughput(res),
            }
        )
        panels.append(Panel(f"cost: {name}", res))
    tables.append(t)

    # 2. prefix caching
    reqs = _two(
        steps, M, seed, ("shared", (1024, 2048), (16, 64)), ("miss", (1024, 2048), (16, 64))
    )
    hit = [int(0.75 * r.prompt_len) if r.client == "shared" else 0 for r in reqs]
    t = Table(
        "accounting-prefix",
        f"Prefix caching: 'shared' hits the cache on 75% of each prompt, 'miss' never "
        f"(M={M:,}, {steps:,} steps); shares of computed service (wp/token computed, wq/output)",
        ["scheduler", "shared_share", "miss_share", "shared_requests", "miss_requests"],
    )
    for name, cached in (("vtc, charges cached tokens", None), ("vtc + cached_len", hit)):
        res = opts.run(f"prefix {name}", reqs, steps, M=M, policy="vtc", cached=cached)
        got = _metered(res, "tokens", hit)
        done = {
            c: sum(
                1 for i, r in enumerate(res.requests) if r.client == c and res.first_admit[i] >= 0
            )
            for c in ("shared", "miss")
        }
        t.rows.append(
            {
                "scheduler": name,
                "shared_share": _share(got, "shared"),
                "miss_share": _share(got, "miss"),
                "shared_requests": done["shared"],
                "miss_requests": done["miss"],
            }
        )
    tables.append(t)

    # 3. preemption
    small = max(M // 4, 1024)
    reqs = _two(steps, small, seed, ("a", (64, 256), (256, 768)), ("b", (64, 256), (256, 768)))
    t = Table(
        "accounting-preemption",
        f"Preemption: long outputs in M={small:,} ({steps:,} steps); decode() evicts when "
        "the batch outgrows M",
        [
            "scheduler",
            "preemptions",
            "recomputed_tokens",
            "max_overcharge",
            "max_drift",
            "throughput",
        ],
    )
    for policy in ("fcfs", "vtc"):
        res = opts.run(f"preempt {policy}", reqs, steps, M=small, policy=policy)
        over = max(abs(res.service[c][-1] - res.delivered[c][-1]) for c in res.clients)
        t.rows.append(
            {
                "scheduler": policy,
                "preemptions": res.preemptions,
                "recomputed_tokens": sum(res.recomputed),
                "max_overcharge": over,
                "max_drift": metrics.max_drift(_delivered(res), "a", "b"),
                "throughput": metrics.throughput(res),
            }
        )
    tables.append(t)

    # 4. per-client memory cap
    specs = [workloads.ClientSpec("heavy", 3 * workloads.service_rate(M), prompt=(256, 1024))]
    specs += [
        workloads.ClientSpec(f"light{k}", 0.1 * workloads.service_rate(M), arrival="gamma", cv=4.0)
        for k in range(3)
    ]
    reqs = workloads.generate(specs, steps, seed=seed)
    lights = [f"light{k}" for k in range(3)]
    t = Table(
        "accounting-cap",
        f"Per-client cap: one heavy client (3x capacity) and three bursty light ones "
        f"(0.1x each) (M={M:,}, {steps:,} steps)",
        [
            "client_cap",
            "utilization",
            "throughput",
            "heavy_share",
            "light_ttft_p50",
            "light_ttft_p99",
            "heavy_ttft_p50",
        ],
    )
    for cap in CAPS:
        o = None if cap is None else {"client_cap": cap}
        res = opts.run(f"cap {cap}", reqs, steps, M=M, policy="vtc", options=o)
        light = metrics.ttft(res, lights)
        t.rows.append(
            {
                "client_cap": "none (plain vtc)" if cap is None else f"{cap:g} M",
                "utilization": res.utilization,
                "throughput": metrics.throughput(res),
                "heavy_share": metrics.shares(res)["heavy"],
                "light_ttft_p50": metrics.percentile(light, 50),
                "light_ttft_p99": metrics.percentile(light, 99),
                "heavy_ttft_p50": metrics.percentile(metrics.ttft(res, ["heavy"]), 50),
            }
        )
    tables.append(t)

    # 5. length prediction
    reqs = _two(
        steps, M, seed, ("long-out", (64, 512), (256, 768)), ("short-out", (64, 512), (16, 64))
    )
    rng = np.random.default_rng(seed)
    noisy = [
        max(0, int(round(r.output_len * f)))
        for r, f in zip(reqs, rng.lognormal(0.0, 0.5, len(reqs)))
    ]
    oracle = [min(r.output_len, M - r.prompt_len) for r in reqs]
    t = Table(
        "accounting-predict",
        f"Length prediction: long- vs short-output client, both overloaded (M={M:,}, "
        f"{steps:,} steps); drift of the delivered service",
        ["prediction", "max_drift", "drift_over_2U", "long_share", "throughput"],
    )
    for name, predicted, o in (
        ("none (plain vtc)", None, None),
        ("oracle", oracle, None),
        ("user, lognormal noise", noisy, None),
        ("per-client mean", None, {"predictor": "mean"}),
    ):
        res = opts.run(
            f"predict {name}", reqs, steps, M=M, policy="vtc", options=o, predicted=predicted
        )
        d = _delivered(res)
        drift = metrics.max_drift(d, "long-out", "short-out")
        t.rows.append(
            {
                "prediction": name,
                "max_drift": drift,
                "drift_over_2U": drift / (2 * metrics.result_u(res)),
                "long_share": _share({c: d.service[c][-1] for c in res.clients}, "long-out"),
                "throughput": metrics.throughput(res),
            }
        )
    tables.append(t)
    return Report(tables, panels)


# ------------------------------------------------------------------ locality

PREFILL_TIME = 1.0 / 256.0  # time units per computed prompt token: 256 of them cost one step


def locality(
    opts: Options, prefill_time: float = PREFILL_TIME, capacity: int | None = None
) -> Report:
    """Locality against fairness with a prefix cache (issue 19, item 2; docs/locality.md).

    Two workloads of the same arrivals and lengths: ``prefix-heavy`` (8
    tenants, each with 2-4 shared prefixes of 1-4k tokens, suffixes of
    20-200 tokens, outputs of 8-64, arrival rates 1:1:1:1:2:2:4:4, together
    overloading the engine) and ``no-sharing`` (every prompt unique).  The
    engine has a prefix cache of ``capacity`` tokens (default ``M``, the KV
    pool of a real engine; the prefixes take ~54k tokens, so it evicts) and a
    step lasts ``1 + prefill_time * computed prompt tokens``.  Schedulers:
    FCFS, longest-prefix-match (SGLang's ``lpm``, :mod:`vtc.sim.baselines`)
    and VTC, charged only uncached prompt tokens.  Throughput is per unit of
    time (one decode step without prefill): finished requests per 1000 and
    weighted tokens served (cached prompt tokens included); ``prefill`` the
    prompt tokens computed; ``hit_rate`` the fraction of the prompt tokens
    admissions needed that the cache gave; drift the largest gap of charged
    service between two tenants while both were backlogged, over ``2U``.
    A second table, ``locality-window``, has locality VTC at several ``Q``
    (:func:`_locality_window`).
    """
    from vtc.sim.baselines import lpm_scheduler

    steps, M, seed = opts.steps or 20000, opts.M or 16384, opts.seed
    capacity = M if capacity is None else capacity
    # arrivals over 4x the steps: a step lasts 1-3 time units here, so the
    # engine never runs out of work before the last step
    shared = workloads.prefix_heavy(4 * steps, M, seed=seed)
    gens = {
        "prefix-heavy": shared,
        "no-sharing": [dataclasses.replace(r, prefix=()) for r in shared],
    }
    runs = [("fcfs", "fcfs", None), ("lpm", "lpm", lpm_scheduler), ("vtc", "vtc", None)]
    table = Table(
        "locality",
        f"Prefix cache of {capacity:,} tokens, LRU (M={M:,}, {steps:,} steps, a computed "
        f"prompt token costs 1/{1 / prefill_time:g} step); shares in % of charged service",
        [
            "workload",
            "scheduler",
            "requests_per_kt",
            "tokens_per_t",
            "prefill",
            "prefill_per_request",
            "hit_rate",
            "evicted",
            "max_drift",
            "drift_over_2U",
            "shares",
        ],
    )
    panels = []
    for name, reqs in gens.items():
        for label, policy, factory in runs:
            cache = PrefixCache(capacity)
            res = opts.run(
                f"locality {name} {label}",
                reqs,
                steps,
                M=M,
                policy=policy,
                cache=cache,
                prefill_time=prefill_time,
                factory=factory,
            )
            done = sum(1 for f in res.finish if f >= 0)
            admitted = sum(1 for a in res.first_admit if a >= 0)
            drift = metrics.max_pair_drift(res)
            share = metrics.shares(res)
            table.rows.append(
                {
                    "workload": name,
                    "scheduler": label,
                    "requests_per_kt": 1000 * done / res.elapsed,
                    "tokens_per_t": res.work[-1] / res.elapsed,
                    "prefill": sum(res.prefilled),
                    "prefill_per_request": sum(res.prefilled) / admitted,
                    "hit_rate": res.hit_rate,
                    "evicted": cache.evicted,
                    "max_drift": drift,
                    "drift_over_2U": drift / (2 * metrics.result_u(res)),
                    "shares": [share[c] for c in res.clients],
                }
            )
            panels.append(Panel(f"{name}: {label}", res))
    window = _locality_window(opts, gens, table, steps, M, capacity, prefill_time)
    return Report([table, window], panels)


LOCALITY_QUANTA = ((0.25, "U/4"), (0.5, "U/2"), (1.0, "U"), (2.0, "2U"))


def _locality_window(
    opts: Options, gens: dict, plain: Table, steps: int, M: int, capacity: int, prefill_time: float
) -> Table:
    """Locality VTC (issue 19, item 1): VTC with a quantum ``Q`` of the counters
    within which the longest cached prefix wins, at ``Q`` = U/4 .. 2U, driven
    through the run's scheduler (``vtc.Scheduler``, or ``vtc.reference`` with
    ``--impl reference``: both choose the same requests) built with
    ``locality_quantum=Q``, with the engine's cache lookup as its
    ``set_prefix_lookup``.  The bound is ``2 (U + Q)``
    (docs/locality.md); ``Q = 0`` is the plain VTC row of the ``locality`` table."""
    from functools import partial

    from vtc.sim.engine import rust_scheduler

    table = Table(
        "locality-window",
        "Locality VTC: a tenant within Q of the least counter may be served, longest cached "
        "prefix first; bound 2(U + Q); speedup "
        "in requests per unit of time over VTC",
        [
            "workload",
            "scheduler",
            "Q",
            "requests_per_kt",
            "speedup",
            "tokens_per_t",
            "prefill",
            "hit_rate",
            "max_drift",
            "drift_over_2U",
            "bound_over_2U",
            "drift_over_bound",
            "shares",
        ],
    )
    vtc_rows = {r["workload"]: r for r in plain.rows if r["scheduler"] == "vtc"}
    for name, reqs in gens.items():
        base = vtc_rows[name]
        U = metrics.bound_u(opts.wp, opts.wq, M, max(r.prompt_len for r in reqs))
        table.rows.append(
            {
                "workload": name,
                "scheduler": "vtc",
                "Q": 0.0,
                "requests_per_kt": base["requests_per_kt"],
                "speedup": 1.0,
                "tokens_per_t": base["tokens_per_t"],
                "prefill": base["prefill"],
                "hit_rate": base["hit_rate"],
                "max_drift": base["max_drift"],
                "drift_over_2U": base["drift_over_2U"],
                "bound_over_2U": 1.0,
                "drift_over_bound": base["drift_over_2U"],
                "shares": base["shares"],
            }
        )
        for frac, label in LOCALITY_QUANTA:
            Q = frac * U
            res = opts.run(
                f"locality {name} vtc Q={label}",
                reqs,
                steps,
                M=M,
                policy="vtc",
                cache=PrefixCache(capacity),
                prefill_time=prefill_time,
                factory=partial(opts.factory or rust_scheduler, locality_quantum=Q),
            )
            done = sum(1 for f in res.finish if f >= 0)
            drift = metrics.max_pair_drift(res)
            share = metrics.shares(res)
            bound = 2 * (metrics.result_u(res) + Q)
            table.rows.append(
                {
                    "workload": name,
                    "scheduler": f"vtc Q={label}",
                    "Q": Q,
                    "requests_per_kt": 1000 * done / res.elapsed,
                    "speedup": 1000 * done / res.elapsed / base["requests_per_kt"],
                    "tokens_per_t": res.work[-1] / res.elapsed,
                    "prefill": sum(res.prefilled),
                    "hit_rate": res.hit_rate,
                    "max_drift": drift,
                    "drift_over_2U": drift / (2 * metrics.result_u(res)),
                    "bound_over_2U": bound / (2 * metrics.result_u(res)),
                    "drift_over_bound": drift / bound,
                    "shares": [share[c] for c in res.clients],
                }
            )
    return table


EXPERIMENTS: dict[str, Callable[[Options], Report]] = {
    "drift": drift,
    "returning": returning,
    "kv-sweep": kv_sweep,
    "rpm-sweep": rpm_sweep,
    "trace": trace,
    "weighted": weighted,
    "priority": priority,
    "scenarios": scenarios,
    "replicas": replicas,
    "accounting": accounting,
    "locality": locality,
}
