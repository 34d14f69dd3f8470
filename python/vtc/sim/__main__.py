"""Command line: ``python -m vtc.sim <experiment> [options]`` (also installed as ``vtc-sim``)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from vtc.sim.engine import reference_scheduler, rust_scheduler
from vtc.sim.experiments import EXPERIMENTS, Options
from vtc.sim.report import PLOT_EXTRA_HINT, Report, can_plot, plot, write_json

EXAMPLES = """\
experiments:
  drift       table 1: FCFS vs LCF (no lift) vs VTC, two permanently overloaded clients
  returning   table 2: a client under its share goes silent, then returns overloaded
  kv-sweep    table 3: VTC max drift vs KV budget M = 2048..32768 (ignores --M)
  rpm-sweep   table 4: requests-per-minute limits vs VTC, drift and throughput
  trace       the Chatbot Arena trace under FCFS / LCF / VTC / RPM 5 / RPM 20
  weighted    weighted VTC, 4 clients with weights 1:2:3:4
  priority    urgent (priority 0) and batch tenants: FCFS, stock priority, VTC, bands, 1:1, 1:3
  scenarios   the paper's other workloads (gamma, short/long, ramp, phases, ...)
  replicas    N = 2, 4, 8 replicas, skewed ingress: FCFS vs per-replica VTC vs global VTC
  accounting  cost functions, prefix caching, preemption, per-client caps, length prediction
  locality    a prefix cache (LRU): FCFS vs longest prefix match vs VTC, prefix-heavy and unique;
              locality VTC (a quantum Q of the counters) at Q = U/4 .. 2U
  all         every experiment above; writes JSON per table and a PNG per experiment to --out

examples:
  python -m vtc.sim drift
  python -m vtc.sim returning --plot returning.png --json returning.json
  python -m vtc.sim kv-sweep --steps 5000 --seed 3
  python -m vtc.sim all --out results
  python -m vtc.sim replicas --plot replicas.png --redis-url redis://127.0.0.1:6379/0
"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="vtc-sim",
        description="Simulate fair scheduling for LLM serving on top of vtc.Scheduler.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("experiment", choices=[*EXPERIMENTS, "all"])
    p.add_argument("--steps", type=int, help="engine steps to simulate (default: per experiment)")
    p.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    p.add_argument(
        "--M", type=int, help="KV budget in tokens (default 8192; 10000 trace, 16384 locality)"
    )
    p.add_argument("--wp", type=float, default=1.0, help="weight of a prompt token (default 1)")
    p.add_argument("--wq", type=float, default=2.0, help="weight of an output token (default 2)")
    p.add_argument(
        "--minute",
        type=int,
        default=2000,
        help="steps in an RPM minute (default 2000; trace uses 60 s of trace time)",
    )
    p.add_argument(
        "--trace",
        help="trace CSV (default: $VTC_TRACE, else "
        "<repo>/../shared/traces/chatbot_arena_27clients.csv)",
    )
    p.add_argument(
        "--steps-per-second",
        type=float,
        default=18.0,
        help="trace replay speed: engine steps per second of trace time (default 18)",
    )
    p.add_argument(
        "--impl",
        choices=["rust", "reference"],
        default="rust",
        help="scheduler to drive: vtc.Scheduler (default) or the pure-Python vtc.reference",
    )
    p.add_argument("--json", metavar="PATH", help="write the tables as JSON: {table: [rows]}")
    p.add_argument(
        "--plot", metavar="PATH", help="write a PNG of cumulative service per client over time"
    )
    p.add_argument("--out", default="results", help="results folder for 'all' (default results/)")
    p.add_argument("--no-progress", action="store_true", help="never draw progress bars")
    p.add_argument(
        "--sync-interval",
        type=int,
        default=10,
        help="replicas: steps between syncs of the shared counters (default 10)",
    )
    p.add_argument(
        "--redis-url",
        help="replicas: share counters through this Redis (default: the in-process twin)",
    )
    return p


def _show(name: str, report: Report, elapsed: float) -> None:
    for table in report.tables:
        print(table.render())
        print()
    print(f"[{name}: {elapsed:.1f}s]\n", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one experiment (or ``all``) and print its tables; returns the exit status."""
    args = _parser().parse_args(argv)
    opts = Options(
        steps=args.steps,
        seed=args.seed,
        M=args.M,
        wp=args.wp,
        wq=args.wq,
        minute=args.minute,
        trace=args.trace,
        steps_per_second=args.steps_per_second,
        factory=reference_scheduler if args.impl == "reference" else rust_scheduler,
        progress=False if args.no_progress else None,
        sync_interval=args.sync_interval,
        redis_url=args.redis_url,
    )
    names = list(EXPERIMENTS) if args.experiment == "all" else [args.experiment]
    out = Path(args.out) if args.experiment == "all" else None
    # Checked before anything runs: an experiment can take minutes.
    plots = can_plot()
    if args.plot and not plots:
        print(f"vtc-sim: --plot: {PLOT_EXTRA_HINT}", file=sys.stderr)
        return 2
    if out is not None and not plots:
        print(f"vtc-sim: writing JSON only, no PNGs ({PLOT_EXTRA_HINT})", file=sys.stderr)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    tables = []
    for name in names:
        start = time.monotonic()
        try:
            report = EXPERIMENTS[name](opts)
        except (ValueError, FileNotFoundError) as e:
            print(f"vtc-sim {name}: {e}", file=sys.stderr)
            return 2
        _show(name, report, time.monotonic() - start)
        tables += report.tables
        if out is not None:
            for table in report.tables:
                write_json([table], out / f"{table.name}.json")
            if plots:
                plot(report.panels, out / f"{name}.png", title=report.tables[0].title)
        elif args.plot:
            plot(report.panels, args.plot, title=report.tables[0].title)
    if args.json:
        write_json(tables, args.json)
    if out is not None:
        pngs = ", one PNG per experiment" if plots else ""
        print(f"wrote {out}/: one JSON per table{pngs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
