"""VTC's code in vLLM's scheduler step, counted by callgrind: instructions and
(simulated) cache misses per step, with vLLM's own work left out.

The wall-clock measure (``test_vllm_overhead.py::test_interleaved_overhead``) is
the one issue 20 item 4 is judged by, but a change of a few per cent of VTC's
~45 µs a step is inside its noise: trials land in modes ~30% apart, and the
machine's level drifts. This probe counts the same code the clocks there time,
exactly and repeatably: the VTC queue's entry points (outermost calls) and the
scheduler mixin's own code around vLLM's ``schedule()`` and
``update_from_output()``, with callgrind's collection switched on inside them and
off inside vLLM's code (``CALLGRIND_TOGGLE_COLLECT``, through a small C helper
built on first use with ``cc`` and valgrind's ``callgrind.h``). Cache misses are
callgrind's simulation of this machine's L1 (the cold caches vLLM's own work
leaves are the cost that dominates VTC's code in the engine).

Run it in the vLLM virtualenv with the build to measure on ``PYTHONPATH``;
``--run`` starts valgrind itself and prints the figures per step::

    PYTHONPATH=python .venv-vllm/bin/python bench/vllm_callgrind.py --run

(~9 minutes: vLLM under valgrind). Each figure includes the probe's own toggles
(a ctypes call and a flag per edge, the same in every build): compare builds, not
absolute values. Without valgrind the script just steps the engine (the toggles
are no-ops), a quick check that it runs.

``--only NAME`` counts one entry point alone, with what it calls (never vLLM's own
methods): a queue method (``add_request``, ``__bool__``, ...) or ``(scheduler)``, the
mixin's own code. The mixin calls into the queue itself (``scheduled``,
``record_step``), so ``(scheduler)`` includes those calls, and ``--only record_step``
counts the step's charge and finishes alone; the other entry points are called by
vLLM, and their counts add up with ``(scheduler)``'s to the whole step's.

``--engine`` picks what is counted, on the same workload:

* ``vtc`` (the default): VTC's code, as above;
* ``floor``: the probe's floor: stock vLLM's own first-come queue and a mixin that only
  calls vLLM's methods, counted exactly as VTC's queue and mixin are (the same
  wrappers, toggles and entry points). It reads what the probe's own frames and toggles
  cost, with what the queue VTC replaces does: ``vtc`` less ``floor`` is VTC's code
  net of the probe and of the queue any engine has (what the clocks report net of
  their floor, ``test_vllm_overhead.py``);
* ``stock``: stock vLLM's whole scheduler step (``add_request``, ``schedule()``,
  ``update_from_output()``, vLLM's own code included): the step VTC's share is of.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HELPER_C = r"""
#include <valgrind/callgrind.h>
void vtc_cg_toggle(void) { CALLGRIND_TOGGLE_COLLECT; }
"""


def toggle_function() -> Any:
    """The C helper's toggle, built into a cache directory on first use. A
    ``PyDLL``: the GIL is kept across the call (no GIL traffic in the figures)."""
    cache = Path(tempfile.gettempdir()) / "vtc-callgrind-helper"
    lib = cache / "libvtccg.so"
    if not lib.exists():
        cache.mkdir(exist_ok=True)
        src = cache / "vtccg.c"
        src.write_text(HELPER_C)
        built = subprocess.run(
            ["cc", "-O2", "-shared", "-fPIC", "-o", str(lib), str(src)],
            capture_output=True,
            text=True,
        )
        if built.returncode != 0:
            raise SystemExit(
                "the callgrind toggle needs a C compiler and valgrind's headers "
                f"(apt-get install valgrind gcc): {built.stderr.strip()}"
            )
    toggle = ctypes.PyDLL(str(lib)).vtc_cg_toggle
    toggle.argtypes, toggle.restype = [], None  # (no return value to convert)
    return toggle


#: ``--only``'s name for the scheduler mixin's own code
SCHEDULER = "(scheduler)"

#: what ``--engine`` counts (see the module's doc)
ENGINES = ("vtc", "floor", "stock")


class PassThrough:
    """The floor's scheduler mixin: it adds nothing, its ``schedule()`` and
    ``update_from_output()`` only call vLLM's (``super()``)."""

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        return super().schedule(*args, **kwargs)  # type: ignore[misc]

    def update_from_output(self, *args: Any, **kwargs: Any) -> Any:
        return super().update_from_output(*args, **kwargs)  # type: ignore[misc]


def build_engine(
    toggle: Any, config: Any = None, only: str | None = None, engine: str = "vtc"
) -> Any:
    """A seeded engine (``test_vllm_overhead.Engine``) that toggles collection.
    ``engine="vtc"``: VTC's code toggles it, on at each outermost queue entry point
    and around the mixin's own code, off again around vLLM's ``schedule()``/
    ``update_from_output()`` inside; ``"floor"``: the same toggles around stock
    vLLM's own queue and a pass-through mixin (:class:`PassThrough`); ``"stock"``:
    stock vLLM's whole ``add_request``, ``schedule()`` and ``update_from_output()``.
    ``config``: vLLM's (the bench's tiny model if None). ``only``: the one entry
    point counted (a queue method's name, or :data:`SCHEDULER`), with what it
    calls. Its ``counting`` dict's ``measure`` switches the toggles on."""
    if engine not in ENGINES:
        raise SystemExit(f"--engine {engine!r}: not one of {ENGINES}")
    if engine == "stock" and only is not None:
        raise SystemExit("--only counts an entry point of VTC's or the floor's, not stock's")
    bench = Path(__file__).resolve().parent
    sys.path[:0] = [str(bench), str(bench.parent / "tests" / "vllm")]
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm_harness import make_scheduler, vllm_config, write_tiny_llama

    import test_vllm_overhead as B
    from vtc.vllm import VTCRequestQueue, VTCScheduler

    if only is not None and only != SCHEDULER and only not in B.TIMED_ENTRY_POINTS:
        raise SystemExit(f"--only {only!r}: not {SCHEDULER} nor one of {B.TIMED_ENTRY_POINTS}")
    state = {"measure": False, "on": False}

    def counted(method: Any, name: str) -> Any:
        """``method`` with collection on while it runs, unless it already is. With
        ``only``, for that entry point alone: each call of it that is not inside a
        counted call, with what it calls (the mixin's calls into the queue too;
        never vLLM's own methods); other entry points are not counted."""
        mine = only is None or only == name

        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            if state["on"] or not mine or not state["measure"]:
                return method(self, *args, **kwargs)
            toggle()
            state["on"] = True
            try:
                return method(self, *args, **kwargs)
            finally:
                state["on"] = False
                toggle()

        call.__name__ = method.__name__
        return call

    def uncounted(method: Any) -> Any:
        """``method`` (vLLM's) with collection off while it runs."""

        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            was = state["on"]
            if was:
                state["on"] = False
                toggle()
            try:
                return method(self, *args, **kwargs)
            finally:
                if was:
                    toggle()
                    state["on"] = True

        call.__name__ = method.__name__
        return call

    if engine == "stock":

        class CountedStock(Scheduler):
            """Stock vLLM's step counted whole."""

        for name in ("add_request", "schedule", "update_from_output"):
            setattr(CountedStock, name, counted(getattr(Scheduler, name), SCHEDULER))
        base: type = Scheduler
        scheduler_cls: type = CountedStock
    else:
        from vllm.v1.core.sched.request_queue import FCFSRequestQueue

        queue_cls = VTCRequestQueue if engine == "vtc" else FCFSRequestQueue

        class CountedQueue(queue_cls):  # type: ignore[valid-type,misc]
            """The queue's entry points counted (those it has: the floor's queue has
            no ``record_step``, ...)."""

        for name in B.TIMED_ENTRY_POINTS:
            if hasattr(queue_cls, name):
                setattr(CountedQueue, name, counted(getattr(queue_cls, name), name))

        class VLLMOff(Scheduler):
            """vLLM's own methods as the mixin's ``super()`` calls them: not counted."""

        class FloorScheduler(PassThrough, Scheduler):
            """The floor's scheduler (as VTCScheduler is VTC's mixin over vLLM's)."""

        mixin = VTCScheduler if engine == "vtc" else FloorScheduler

        class CountedScheduler(mixin, VLLMOff):  # type: ignore[valid-type,misc]
            """The mixin's own code counted."""

        for name in ("schedule", "update_from_output"):
            setattr(VLLMOff, name, uncounted(getattr(Scheduler, name)))
            setattr(CountedScheduler, name, counted(getattr(mixin, name), SCHEDULER))
        base, scheduler_cls = mixin, CountedScheduler

    if config is None:
        model = write_tiny_llama(Path(tempfile.mkdtemp()), weights=False)
        config = vllm_config(
            str(model),
            max_num_seqs=B.MAX_NUM_SEQS,
            max_num_batched_tokens=8192,
            max_model_len=1024,
        )
    scheduler = make_scheduler(base, config, num_blocks=B.NUM_BLOCKS)
    scheduler.__class__ = scheduler_cls
    if engine != "stock":
        scheduler.waiting.__class__ = CountedQueue
    stepped = B.Engine(scheduler)
    stepped.counting = state  # type: ignore[attr-defined]
    return stepped


def step(warmup: int, steps: int, only: str | None = None, engine: str = "vtc") -> None:
    """Warm the engine up uncounted, then count ``steps`` steps."""
    stepped = build_engine(toggle_function(), only=only, engine=engine)
    for _ in range(warmup):
        stepped.step()
    stepped.counting["measure"] = True
    for _ in range(steps):
        stepped.step()
    stepped.counting["measure"] = False
    waiting = len(stepped.s.waiting)
    print(f"{engine}: counted {steps} steps after {warmup} ({waiting} waiting)")


def summary(path: Path) -> dict[str, int]:
    """The event totals of a callgrind output file."""
    events: list[str] = []
    totals: list[int] = []
    for line in path.read_text().splitlines():
        if line.startswith("events:"):
            events = line.split()[1:]
        elif line.startswith(("summary:", "totals:")):
            totals = [int(v) for v in line.split()[1:]]
    return dict(zip(events, totals))


def run(warmup: int, steps: int, out: Path, only: str | None = None, engine: str = "vtc") -> None:
    """This script under valgrind (callgrind, cache simulation, collection off at
    start), then the totals per counted step."""
    # (a step under valgrind is ~100x slower: the tenant log line, every 10 s, would
    # come every few dozen steps; a long interval keeps its per-step check only)
    env = dict(os.environ, PYTHONHASHSEED="0", OMP_NUM_THREADS="1", VTC_LOG_INTERVAL="1e6")
    cmd = [
        "valgrind", "--tool=callgrind", "--collect-atstart=no", "--cache-sim=yes",
        f"--callgrind-out-file={out}", sys.executable, __file__,
        "--warmup", str(warmup), "--steps", str(steps), "--engine", engine,
    ] + (["--only", only] if only is not None else [])  # fmt: skip
    subprocess.run(cmd, env=env, check=True, stderr=subprocess.DEVNULL)
    totals = summary(out)
    names = {"Ir": "instructions", "I1mr": "L1i misses", "D1mr": "L1d read misses",
             "D1mw": "L1d write misses"}  # fmt: skip
    for event, name in names.items():
        if event in totals:
            print(f"{name:18s} {totals[event] / steps:12,.0f} per step")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--run", action="store_true", help="start valgrind and print per step")
    parser.add_argument("--out", type=Path, default=Path("callgrind.vtc-step.out"))
    parser.add_argument("--only", help=f"count one entry point: a queue method or {SCHEDULER}")
    parser.add_argument("--engine", choices=ENGINES, default="vtc", help="what is counted")
    args = parser.parse_args()
    if args.run:
        run(args.warmup, args.steps, args.out, args.only, args.engine)
    else:
        step(args.warmup, args.steps, args.only, args.engine)


if __name__ == "__main__":
    main()
