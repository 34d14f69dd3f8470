"""Weights change without a restart: VTC_WEIGHTS_FILE is re-read when it changes
(issue 17, item 3), through the adapter both engine shells drive."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

import vtc
from vtc.adapter import Adapter, describe_weight_changes
from vtc.config import EngineConfig
from vtc.metrics import TenantMetrics


def write(path: Path, weights: dict | str) -> None:
    """Replace the file as editors and config management do (a new inode)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(weights if isinstance(weights, str) else json.dumps(weights))
    os.replace(tmp, path)


def make(tmp_path: Path, weights: dict | str, **env: str) -> tuple[Adapter, Path]:
    path = tmp_path / "weights.json"
    write(path, weights)
    config = EngineConfig.from_env(
        {"VTC_WEIGHTS_FILE": str(path), "VTC_WEIGHTS_RELOAD": "1e-9", **env}
    )
    return Adapter(vtc.Scheduler(M=100_000), config), path


def running(adapter: Adapter, key: str, tenant: str, prompt: int):
    t = adapter.arrive(key, None, [tenant], prompt)
    assert adapter.requests.head() is t
    adapter.requests.admit(t, 0)
    return t


def test_a_changed_file_applies_to_the_next_charge_and_is_logged(tmp_path, caplog):
    adapter, path = make(tmp_path, {"gold": 2, "free": 0.5}, VTC_WEIGHTS="silver=3")
    core = adapter.core
    gold = running(adapter, "g", "gold", 100)
    assert core.counter("gold") == 100 / 2
    adapter.requests.charge([(gold, 1)])
    assert core.counter("gold") == 50 + 2.0 / 2

    write(path, {"gold": 4, "bronze": 0.25, "silver": 9})
    with caplog.at_level(logging.INFO, logger="vtc"):
        adapter.step_done()
    assert (core.weight("gold"), core.weight("bronze"), core.weight("free")) == (4.0, 0.25, 1.0)
    assert core.weight("silver") == 3.0  # VTC_WEIGHTS still wins over the file
    assert dict(adapter.config.weights) == {"gold": 4.0, "bronze": 0.25, "silver": 3.0}
    assert adapter.tenancy.config is adapter.config
    assert "weights {'gold': 4.0, 'bronze': 0.25, 'silver': 3.0}" in adapter.describe()
    (message,) = [r.getMessage() for r in caplog.records if "reloaded" in r.getMessage()]
    assert message == (
        f"VTC: weights reloaded from VTC_WEIGHTS_FILE {str(path)!r}: "
        "bronze 1 -> 0.25, free 0.5 -> 1 (removed), gold 2 -> 4"
    )
    # What was charged stays; the next token of gold costs wq / 4.
    adapter.requests.charge([(gold, 1)])
    assert core.counter("gold") == 51 + 2.0 / 4

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="vtc"):
        adapter.step_done()  # the file did not change: nothing re-read, nothing logged
    assert not [r for r in caplog.records if "weights" in r.getMessage()]


def test_a_bad_file_keeps_the_weights_in_force_and_says_why_once_per_version(tmp_path, caplog):
    adapter, path = make(tmp_path, {"gold": 2})
    core = adapter.core
    bad = [
        ('{"gold": 2,', "is not valid JSON (line 1, column 12"),
        ('{"gold": 1e-300}', "weight of tenant 'gold' is 1e-300"),
        ('{"gold": 2, "gold": 3}', "tenant 'gold' is given twice"),
        ("[1, 2]", "holds a JSON list"),
    ]
    for text, why in bad:
        write(path, text)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="vtc"):
            adapter.step_done()
            adapter.step_done()  # the same version of the file: said once
        messages = [r.getMessage() for r in caplog.records]
        assert len(messages) == 1 and why in messages[0], messages
        assert messages[0].startswith("VTC: weights not reloaded, the ones in force stay: ")
        assert str(path) in messages[0]
        assert core.weight("gold") == 2.0 and dict(adapter.config.weights) == {"gold": 2.0}

    path.unlink()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="vtc"):
        adapter.step_done()
        adapter.step_done()
    assert [
        r.getMessage().endswith("cannot be read: No such file or directory") for r in caplog.records
    ] == [True]
    assert core.weight("gold") == 2.0

    write(path, {"gold": 5})  # repaired: read again
    adapter.step_done()
    assert core.weight("gold") == 5.0


def test_the_file_is_checked_at_most_every_interval_and_0_never(tmp_path):
    adapter, path = make(tmp_path, {"gold": 2}, VTC_WEIGHTS_RELOAD="5")
    tenancy = adapter.tenancy
    start = tenancy._next_check - 5
    write(path, {"gold": 3})
    assert not tenancy.reload_weights(now=start + 4.9)
    assert adapter.core.weight("gold") == 2.0
    assert tenancy.reload_weights(now=start + 5)
    assert adapter.core.weight("gold") == 3.0
    write(path, {"gold": 4})
    assert not tenancy.reload_weights(now=start + 9.9)  # the next check: 5 s after the last
    assert tenancy.reload_weights(now=start + 10)

    (tmp_path / "never").mkdir()
    never, path = make(tmp_path / "never", {"gold": 2}, VTC_WEIGHTS_RELOAD="0")
    write(path, {"gold": 3})
    assert not never.tenancy.reload_weights(now=1e12)
    never.step_done()
    assert never.core.weight("gold") == 2.0
    assert never.tenancy.reload_weights(force=True)  # an explicit reload still reads it
    assert never.core.weight("gold") == 3.0


def test_without_a_file_nothing_is_watched():
    adapter = Adapter(vtc.Scheduler(M=100), EngineConfig(weights={"gold": 2.0}))
    assert not adapter.tenancy.reload_weights(force=True)
    adapter.step_done()
    assert adapter.core.weight("gold") == 2.0


def test_a_tenant_dropped_from_the_file_can_be_forgotten_again(tmp_path):
    # Weighted tenants are never forgotten (their weight is state): gold stays through
    # a sweep while the file names it, and goes with the next sweep once it does not.
    adapter, path = make(tmp_path, {"gold": 3})
    core, tenancy = adapter.core, adapter.tenancy

    def serve(key: str, tenant: str) -> None:
        t = running(adapter, key, tenant, 10)
        core.finish(t.rid)
        adapter.requests.release(key)

    serve("g", "gold")
    serve("x", "x")
    tenancy.forget_idle()
    assert "gold" in core.clients() and core.weight("gold") == 3.0
    write(path, {"other": 2})
    adapter.step_done()
    serve("y", "y")
    tenancy.forget_idle()
    assert "gold" not in core.clients() and "other" in core.clients()
    assert core.weight("gold") == 1.0


def test_the_weight_series_follows_a_reload(tmp_path):
    adapter, path = make(tmp_path, {"gold": 2})
    registry = CollectorRegistry()
    metrics = TenantMetrics(registry, interval=0.0)
    adapter.observers.append(metrics)
    running(adapter, "g", "gold", 10)
    running(adapter, "f", "free", 10)
    adapter.step_done()

    def weight(tenant: str) -> float | None:
        return registry.get_sample_value("vtc_tenant_weight", {"tenant": tenant})

    assert (weight("gold"), weight("free")) == (2.0, 1.0)
    write(path, {"gold": 0.5, "free": 4})
    adapter.step_done()
    assert (weight("gold"), weight("free")) == (0.5, 4.0)


@pytest.mark.parametrize(
    "old, new, said",
    [
        ({}, {"a": 2.0}, "a 1 -> 2"),
        ({"a": 2.0}, {}, "a 2 -> 1 (removed)"),
        ({"x, y": 2.0}, {"x, y": 3.0}, '"x, y" 2 -> 3'),
        ({}, {f"t{i:02}": 2.0 for i in range(25)}, "(+5 more)"),
    ],
)
def test_describe_weight_changes(old, new, said):
    assert said in describe_weight_changes(old, new)


def test_step_done_rereads_the_file_and_logs_each_on_its_own_interval(
    tmp_path, monkeypatch, caplog
):
    """``step_done``'s periodic work has one deadline for both of its parts: the file
    is still checked every ``weights_reload`` seconds and the log line written every
    ``log_interval`` seconds, each on time and neither before (a clock moved by
    hand; the file is replaced before every step, so each check reads it)."""
    now = [1000.0]
    monkeypatch.setattr(vtc.adapter.time, "monotonic", lambda: now[0])
    adapter, path = make(tmp_path, {"gold": 2}, VTC_WEIGHTS_RELOAD="5", VTC_LOG_INTERVAL="7")
    adapter.arrive("r1", None, ["gold"], 10)
    events = []
    for weight, t in enumerate(
        (1001, 1004.9, 1005, 1006.9, 1007, 1009.9, 1010, 1013.9, 1014, 1015)
    ):
        now[0] = t
        write(path, {"gold": weight + 3})
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="vtc"):
            adapter.step_done()
        if adapter.core.weight("gold") == weight + 3:
            events.append(("read", t))
        if any("tenant counter" in r.getMessage() for r in caplog.records):
            events.append(("log", t))
    assert events == [
        ("read", 1005),
        ("log", 1007),
        ("read", 1010),
        ("log", 1014),
        ("read", 1015),
    ]
