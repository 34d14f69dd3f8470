"""``vllm_callgrind.py``'s counting engine, checked without valgrind (its toggle
recorded here instead). Needs vLLM, so it runs in .venv-vllm with the vLLM
benchmark (``make test-vllm``)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest

import vllm_callgrind

# (test_vllm_overhead puts tests/vllm, vllm_harness's folder, on the path)
from test_vllm_overhead import MAX_NUM_SEQS, vllm_config, vtc_engine, write_tiny_llama


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Any:
    model = write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"), weights=False)
    return vllm_config(
        str(model), max_num_seqs=MAX_NUM_SEQS, max_num_batched_tokens=8192, max_model_len=1024
    )


def step_both(counted: Any, plain: Any, steps: int) -> Iterator[None]:
    """Step the counting engine and a plain VTC engine alike, ``steps`` times; after
    each step the counting one has collection off. Yields after each step."""
    for _ in range(steps):
        counted.step()
        plain.step()
        assert not counted.counting["on"]
        yield


def test_callgrind_probe_counts_only_vtc_and_changes_nothing(config: Any) -> None:
    """``vllm_callgrind.py``'s engine (its toggle recorded here, not callgrind's)
    decides as a plain VTC engine does, toggles nothing until measuring, then
    switches collection on and off in pairs, off again inside vLLM's own methods,
    and is off between steps."""
    flips: list[int] = []
    counted = vllm_callgrind.build_engine(lambda: flips.append(1), config)
    plain = vtc_engine(config)
    for _ in step_both(counted, plain, 10):
        pass
    assert not flips
    counted.counting["measure"] = True
    for _ in step_both(counted, plain, 10):
        assert len(flips) % 2 == 0
    # schedule() and update_from_output() each: on, off around vLLM's own, on, off
    assert len(flips) >= 10 * 2 * 4
    assert counted.admissions == plain.admissions
    assert counted.s.vtc.counters() == plain.s.vtc.counters()


@pytest.mark.parametrize(
    "only", ["add_request", "__bool__", "record_step", vllm_callgrind.SCHEDULER]
)
def test_callgrind_probe_counts_one_entry_point_alone(config: Any, only: str) -> None:
    """``--only``: collection is switched on by that entry point's calls alone
    (recorded: the method whose wrapper calls the toggle), in pairs, off between
    steps; ``record_step``, which the mixin calls, is counted there too; the
    decisions are a plain VTC engine's."""
    callers: list[str] = []

    def toggle() -> None:
        callers.append(sys._getframe(1).f_locals["method"].__qualname__)

    counted = vllm_callgrind.build_engine(toggle, config, only=only)
    plain = vtc_engine(config)
    for _ in step_both(counted, plain, 40):  # (past the first finishes: arrivals from then on)
        pass
    assert not callers
    counted.counting["measure"] = True
    for _ in step_both(counted, plain, 20):
        assert len(callers) % 2 == 0
    if only == vllm_callgrind.SCHEDULER:
        # the mixin's two methods, and vLLM's inside them switching collection off
        mine = {f"_VTCMixin.{m}" for m in ("schedule", "update_from_output")}
        expected = mine | {f"Scheduler.{m}" for m in ("schedule", "update_from_output")}
        assert sum(c in mine for c in callers) == 20 * 2 * 2
    else:
        from vtc.vllm import VTCRequestQueue

        # (its own method, or its native base's: WaitingQueue.__bool__)
        expected = {getattr(VTCRequestQueue, only).__qualname__}
        if only == "record_step":  # (once a step, from the mixin)
            assert len(callers) == 20 * 2
    assert callers and set(callers) == expected, set(callers)
    assert counted.admissions == plain.admissions
    assert counted.s.vtc.counters() == plain.s.vtc.counters()


def test_callgrind_probe_refuses_an_unknown_entry_point(config: Any) -> None:
    with pytest.raises(SystemExit, match="peek_requests"):
        vllm_callgrind.build_engine(lambda: None, config, only="peek_requests")


@pytest.mark.parametrize("engine", ["floor", "stock"])
def test_callgrind_probe_counts_the_floor_and_stock_vllm_as_it_counts_vtc(
    config: Any, engine: str
) -> None:
    """``--engine floor``: stock vLLM's own queue and a pass-through mixin, toggled by
    the same wrappers as VTC's (the queue's entry points it has and the mixin's two
    methods, off again inside vLLM's); ``--engine stock``: stock vLLM's three step
    methods, counted whole. Both toggle in pairs, only while measuring, off between
    steps, and decide as a plain stock engine does (first come, first served)."""
    from test_vllm_overhead import NUM_BLOCKS, Engine, Scheduler, make_scheduler

    callers: list[str] = []

    def toggle() -> None:
        callers.append(sys._getframe(1).f_locals["method"].__qualname__)

    counted = vllm_callgrind.build_engine(toggle, config, engine=engine)
    plain = Engine(make_scheduler(Scheduler, config, num_blocks=NUM_BLOCKS))
    for _ in step_both(counted, plain, 40):
        pass
    assert not callers
    counted.counting["measure"] = True
    for _ in step_both(counted, plain, 20):
        assert len(callers) % 2 == 0
    step_methods = {f"Scheduler.{m}" for m in ("add_request", "schedule", "update_from_output")}
    if engine == "stock":
        assert set(callers) == step_methods
    else:
        mixin = {f"PassThrough.{m}" for m in ("schedule", "update_from_output")}
        # vLLM's own methods inside the mixin's switch it off and on again
        inside = {f"Scheduler.{m}" for m in ("schedule", "update_from_output")}
        queue = {c for c in callers if c not in mixin | inside}
        assert sum(c in mixin for c in callers) == 20 * 2 * 2
        assert queue and all(c.startswith(("FCFSRequestQueue.", "deque.")) for c in queue), queue
    assert counted.admissions == plain.admissions
    assert counted.steps == plain.steps and counted.min_batch == plain.min_batch


def test_callgrind_probe_refuses_an_unknown_engine_and_only_with_stock(config: Any) -> None:
    with pytest.raises(SystemExit, match="'fcfs'"):
        vllm_callgrind.build_engine(lambda: None, config, engine="fcfs")
    with pytest.raises(SystemExit, match="not stock's"):
        vllm_callgrind.build_engine(lambda: None, config, only="__bool__", engine="stock")
