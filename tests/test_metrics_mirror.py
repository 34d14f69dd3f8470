"""``vtc._core.MetricsMirror``, the metrics' mirror of every tenant in the core: its
answers, and its bad arguments.

(Its series and values were checked, when it replaced the Python mirror, against
that module over 212 random workloads, every sample after every refresh; the copy of
the old module is not kept. ``test_requests_stateful.MetricsMachine`` and
``test_metrics`` check what it exports, ``rust/core/tests/mirror.rs`` the mirror.)"""

from __future__ import annotations

import pytest

import vtc
from vtc._core import MetricsMirror


def test_bad_arguments_raise_specific_errors():
    m = MetricsMirror()
    core = vtc.Scheduler(M=100)
    with pytest.raises(TypeError, match="scheduler"):
        m.read(object())
    with pytest.raises(vtc.InvalidArgumentError, match="reader"):
        m.read(core, 99)
    with pytest.raises(TypeError, match="reader"):
        m.read(core, "0")
    with pytest.raises(TypeError):
        m.take([1.5], [])
    with pytest.raises(TypeError):
        m.take(["a"], [None])
    with pytest.raises(TypeError):
        m.drop([b"a"], True)
    with pytest.raises(TypeError):
        m.drop(["a"], "yes")
    with pytest.raises(TypeError):
        _ = 1.5 in m
    assert m.read(core) is True and m.read(core) is False
    core.submit(1, "a", 10)
    core.submit(2, 7, 5)
    core.schedule()
    assert m.read(core, 0) is False
    assert sorted(m.keys(), key=repr) == ["a", 7] and len(m) == 2 and "a" in m and "7" not in m
    assert m.totals() == (2, 0, 2)
    assert m.take(["a", "a", "nobody"], ["nobody"]) == (
        [(0, core.counter("a"), 0, 1), (2, None, 0, 0)],
        [(0, 10, 0)],
        5,
        0,
        0,
        1,
        2,
    )
    assert m.take(["a"], []) == ([], [], 0, 0, 0, 1, 2)  # nothing changed since
    assert repr(m) == "MetricsMirror(tenants=2)"
