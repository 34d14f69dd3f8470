"""Simulation harness: a continuous-batching engine model driven by ``vtc.Scheduler``.

>>> from vtc.sim import workloads, simulate, metrics
>>> reqs = workloads.overloaded([2.0, 1.0], steps=2000, M=8192, seed=1)
>>> res = simulate(reqs, 2000, M=8192, policy="vtc")
>>> metrics.max_drift(res, 0, 1) <= 2 * metrics.result_u(res)
True

Modules: :mod:`~vtc.sim.workloads` (seeded generators and trace replay),
:mod:`~vtc.sim.engine` (the engine model and the RPM gate),
:mod:`~vtc.sim.cache` (a prefix cache for it),
:mod:`~vtc.sim.baselines` (longest prefix match),
:mod:`~vtc.sim.replicas` (replicas of that engine, counters shared through
:mod:`vtc.distributed` or not),
:mod:`~vtc.sim.metrics` (drift, service difference, throughput, shares,
latency), :mod:`~vtc.sim.experiments` (the tables of ``docs/simulation.md``) and the
``python -m vtc.sim`` command line.
"""

from vtc.sim import metrics, workloads
from vtc.sim.engine import RpmGate, SimResult, reference_scheduler, rust_scheduler, simulate
from vtc.sim.experiments import EXPERIMENTS, Options
from vtc.sim.workloads import ClientSpec, Request

__all__ = [
    "EXPERIMENTS",
    "ClientSpec",
    "Options",
    "Request",
    "RpmGate",
    "SimResult",
    "metrics",
    "reference_scheduler",
    "rust_scheduler",
    "simulate",
    "workloads",
]
