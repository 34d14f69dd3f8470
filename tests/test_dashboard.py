"""docs/grafana/vtc.json: valid JSON that Grafana imports, whose queries name only
series vtc.metrics exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import CollectorRegistry

from vtc.metrics import TenantMetrics

DASHBOARD = Path(__file__).resolve().parents[1] / "docs" / "grafana" / "vtc.json"


def exported_series() -> set[str]:
    registry = CollectorRegistry()
    TenantMetrics(registry)
    names = set()
    for family in registry.collect():
        names.add(family.name)
        names.update(s.name for s in family.samples)
    names.update(f"{f.name}_total" for f in registry.collect() if f.type == "counter")
    return names


def test_the_dashboard_is_importable_and_queries_only_exported_series():
    dash = json.loads(DASHBOARD.read_text())
    assert dash["schemaVersion"] >= 36 and dash["uid"] and dash["title"]
    assert [i["pluginId"] for i in dash["__inputs"]] == ["prometheus"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    exported = exported_series()
    named = set()
    for p in dash["panels"]:
        assert p["title"] and p["targets"], p
        grid = p["gridPos"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24
        for target in p["targets"]:
            expr = target["expr"]
            assert expr.count("(") == expr.count(")") and expr.count("{") == expr.count("}")
            named.update(re.findall(r"\b(vtc_[a-z_]+)\b", expr))
    assert named and named <= exported, named - exported
    # every series the issue asks a panel for is on the dashboard
    assert {
        "vtc_tenant_service_tokens_total",
        "vtc_counter_spread",
        "vtc_fairness_bound",
        "vtc_fairness_jain_index",
        "vtc_tenant_requests",
        "vtc_tenant_preemptions_total",
        "vtc_sync_seconds_bucket",
        "vtc_sync_degraded",
    } <= named
