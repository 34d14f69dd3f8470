"""A live view of an engine's per-tenant VTC series: ``python -m vtc.top URL``.

Polls a Prometheus ``/metrics`` endpoint (a vLLM or SGLang server with VTC's
metrics on: ``docs/metrics.md``) every ``--interval`` seconds and redraws, in
place, one line per tenant: its share of the tokens charged over the last
interval, its tokens per second, its virtual counter, its waiting and running
requests and its preemptions; above them Jain's index, the counter spread
against its bound and the number of active tenants. Plain text and ANSI
escapes only, so it works over ssh; Ctrl-C ends it. ``--once`` prints one
frame (the shares since the server started) and exits.

Exit status: 0, or 1 when the URL cannot be read, 2 when it has no vtc series.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TextIO

__all__ = ["Sample", "frame", "main", "parse", "scrape"]

CLEAR = "\x1b[H\x1b[2J"  # cursor home, clear screen


@dataclass
class Sample:
    """The vtc series of one scrape, by tenant."""

    tokens: dict[str, float] = field(default_factory=dict)  # prompt + decode
    counter: dict[str, float] = field(default_factory=dict)
    waiting: dict[str, float] = field(default_factory=dict)
    running: dict[str, float] = field(default_factory=dict)
    preemptions: dict[str, float] = field(default_factory=dict)
    jain: float = math.nan
    spread: float = math.nan
    bound: float = math.nan
    active: float = 0.0
    found: bool = False  # any vtc series at all

    def tenants(self) -> list[str]:
        names = set(self.tokens) | set(self.counter) | set(self.waiting) | set(self.running)
        return sorted(names)


def _add(into: dict[str, float], tenant: str, value: float) -> None:
    into[tenant] = into.get(tenant, 0.0) + value


def parse(text: str) -> Sample:
    """The vtc series of a Prometheus text exposition (replicas' series add up)."""
    from prometheus_client.parser import text_string_to_metric_families

    s = Sample()
    scalars: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        for name, labels, value in ((x.name, x.labels, x.value) for x in family.samples):
            if not name.startswith("vtc_"):
                continue
            s.found = True
            tenant = labels.get("tenant", "")
            if name == "vtc_tenant_service_tokens_total":
                _add(s.tokens, tenant, value)
            elif name == "vtc_tenant_counter":
                s.counter[tenant] = max(value, s.counter.get(tenant, -math.inf))
            elif name == "vtc_tenant_requests":
                _add(s.waiting if labels.get("state") == "waiting" else s.running, tenant, value)
            elif name == "vtc_tenant_preemptions_total":
                _add(s.preemptions, tenant, value)
            else:
                scalars.setdefault(name, []).append(value)

    def one(name: str, pick: Callable[[list[float]], float]) -> float:
        values = [v for v in scalars.get(name, []) if not math.isnan(v)]
        return pick(values) if values else math.nan

    s.jain = one("vtc_fairness_jain_index", min)
    s.spread = one("vtc_counter_spread", max)
    s.bound = one("vtc_fairness_bound", max)
    active = one("vtc_tenants_active", sum)
    s.active = 0.0 if math.isnan(active) else active
    return s


def scrape(url: str, timeout: float = 5.0) -> Sample:
    """Read and parse ``url`` (``/metrics`` is added to a bare server URL)."""
    if not url.rstrip("/").endswith("/metrics"):
        url = url.rstrip("/") + "/metrics"
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return parse(response.read().decode("utf-8", errors="replace"))


def _fmt(x: float, spec: str = ".0f") -> str:
    return "-" if math.isnan(x) else format(x, spec)


#: tenants whose last token totals the live view remembers (:func:`remember`)
SEEN_TENANTS = 10_000


def remember(seen: dict[str, float], now: Sample) -> dict[str, float]:
    """``seen`` (each tenant's token total as last scraped) brought up to ``now``. A
    tenant's series may be absent from a scrape (it lost its label, or the core forgot
    it) and come back going on from its old total (docs/metrics.md): its share is
    then what it was served since it was last seen. At most ``SEEN_TENANTS`` kept (past
    that, only the tenants of ``now``)."""
    seen = {**seen, **now.tokens}
    return seen if len(seen) <= SEEN_TENANTS else dict(now.tokens)


def frame(now: Sample, before: Sample | None, seconds: float, url: str) -> str:
    """One screen: the tenants' shares of the tokens charged since ``before``
    (since the server started if None), most served first. ``before.tokens`` may
    hold tenants absent from its scrape (:func:`remember`)."""
    base = before.tokens if before is not None else {}
    delta = {}
    for t in now.tenants():
        tokens = now.tokens.get(t, 0.0)
        d = tokens - base.get(t, 0.0)
        # below its last total: a series started again from 0 (a restarted server),
        # as Prometheus reads a counter reset: served since, its whole total
        delta[t] = d if d >= 0 else tokens
    total = sum(delta.values())
    since = f"last {seconds:.1f}s" if before is not None else "since start"
    lines = [
        f"vtc top  {url}  {time.strftime('%H:%M:%S')}  shares {since}",
        f"tenants active {now.active:.0f}   Jain's index {_fmt(now.jain, '.3f')}   "
        f"counter spread {_fmt(now.spread)} / bound {_fmt(now.bound)}",
        "",
        f"{'tenant':<32} {'share':>7} {'tok/s':>9} {'counter':>12} {'wait':>6} {'run':>5} "
        f"{'preempt':>8}",
    ]
    order = sorted(now.tenants(), key=lambda t: (-delta.get(t, 0.0), t))
    for t in order:
        share = delta[t] / total if total > 0 else 0.0
        rate = delta[t] / seconds if before is not None and seconds > 0 else math.nan
        name = t if len(t) <= 32 else t[:31] + "…"
        name = name.encode("unicode_escape").decode("ascii") if not name.isprintable() else name
        lines.append(
            f"{name:<32} {share:>7.1%} {_fmt(rate, '.1f'):>9} "
            f"{_fmt(now.counter.get(t, math.nan)):>12} {now.waiting.get(t, 0):>6.0f} "
            f"{now.running.get(t, 0):>5.0f} {now.preemptions.get(t, 0):>8.0f}"
        )
    return "\n".join(lines) + "\n"


def main(
    argv: Sequence[str] | None = None,
    *,
    out: TextIO | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    parser = argparse.ArgumentParser(prog="python -m vtc.top", description=__doc__.split("\n")[0])
    parser.add_argument("url", help="a /metrics URL, or the server's base URL")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes")
    parser.add_argument("--once", action="store_true", help="print one frame and exit")
    args = parser.parse_args(argv)
    if not args.interval > 0:
        parser.error(f"--interval must be > 0, got {args.interval}")
    out = sys.stdout if out is None else out
    before: Sample | None = None
    seen: dict[str, float] = {}
    last = time.monotonic()
    try:
        while True:
            try:
                now = scrape(args.url)
            except (urllib.error.URLError, OSError, ValueError) as e:
                print(f"vtc top: cannot read {args.url}: {e}", file=sys.stderr)
                return 1
            if not now.found:
                print(
                    f"vtc top: {args.url} has no vtc_* series: is VTC serving metrics "
                    "there? (docs/metrics.md: PROMETHEUS_MULTIPROC_DIR for vLLM, "
                    "--enable-metrics for SGLang)",
                    file=sys.stderr,
                )
                return 2
            t = time.monotonic()
            text = frame(now, before, t - last, args.url)
            out.write(text if args.once else CLEAR + text)
            out.flush()
            if args.once:
                return 0
            seen = remember(seen, now)
            before, last = replace(now, tokens=seen), t
            sleep(args.interval)
    except KeyboardInterrupt:
        out.write("\n")
        return 0


if __name__ == "__main__":
    sys.exit(main())
