"""An internal failure (a Rust panic) becomes a Python exception, never an
abort, and the scheduler refuses to go on with state it cannot trust."""

from __future__ import annotations

import subprocess
import sys

import pytest

import vtc


def test_panic_becomes_an_exception_and_disables_the_scheduler():
    s = vtc.Scheduler(M=100)
    s.set_weight("a", 2.0)
    s.submit(1, "a", 10)
    s.schedule()
    with pytest.raises(BaseException, match="deliberate internal panic") as info:
        s._panic_for_tests()
    assert type(info.value).__name__ == "PanicException"
    # every later call refuses, with a message that says what to do
    for call in (
        lambda: s.submit(2, "a", 5),
        s.schedule,
        lambda: s.counter("a"),
        lambda: s.num_running,
        s.forget_idle,
    ):
        with pytest.raises(vtc.InternalError, match="from_snapshot"):
            call()
    assert isinstance(vtc.InternalError("x"), vtc.SchedulerError)
    assert repr(s).startswith("Scheduler(M=100")
    # the way out: the fairness state survives
    fresh = vtc.Scheduler.from_snapshot(s.snapshot())
    assert fresh.counter("a") == 5.0 and fresh.weight("a") == 2.0
    fresh.submit(2, "a", 5)
    assert fresh.schedule() == [2]


def test_other_schedulers_are_unaffected():
    a, b = vtc.Scheduler(M=100), vtc.Scheduler(M=100)
    with pytest.raises(BaseException, match="deliberate"):
        a._panic_for_tests()
    b.submit(1, "x", 10)
    assert b.schedule() == [1]


def test_the_interpreter_survives_and_exits_cleanly():
    code = (
        "import vtc\n"
        "s = vtc.Scheduler(M=10)\n"
        "try:\n"
        "    s._panic_for_tests()\n"
        "except BaseException as e:\n"
        "    print('caught', type(e).__name__)\n"
        "try:\n"
        "    s.schedule()\n"
        "except vtc.InternalError:\n"
        "    print('disabled')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["caught", "PanicException", "disabled"]
