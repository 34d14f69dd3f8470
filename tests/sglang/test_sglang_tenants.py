"""Many tenants on a real SGLang server with the plugin (issue 18, item 1): one-off
tenants far beyond what the plugin tracks (``VTC_MAX_TENANTS``). Idle ones are
forgotten, so each new one gets a counter of its own, every request is served, and
a burst of more simultaneously active tenants than the cap bills the surplus to the
default tenant (logged once) instead of growing.

The series on ``/metrics`` stay bounded: SGLang serves them through
prometheus_client's multiprocess directory, which cannot remove a series; the
plugin's own files there can (``vtc.multiproc``), so at most
``VTC_METRICS_MAX_TENANTS`` tenants (and ``_other``) have series, however many
came and went (before: every tenant ever labelled stayed until a restart).

Read from the server's records: responses' ``meta_info``, the plugin's series on
``/metrics`` (``--enable-metrics``), and the server log.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from test_sglang_server import DEADLINE, Server, _wait_until_queued, running
from tiny_model import make_tiny_llama

MAX_TENANTS = 6
LABELLED = 3


@pytest.fixture(scope="module")
def tenants_server(tmp_path_factory) -> Iterator[Server]:
    model_dir = make_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))
    log = tmp_path_factory.mktemp("sglang-tenants") / "server.log"
    env = {
        "VTC_LOG_INTERVAL": "0",
        "VTC_METRICS_INTERVAL": "0",
        "VTC_MAX_TENANTS": str(MAX_TENANTS),
        "VTC_METRICS_MAX_TENANTS": str(LABELLED),
    }
    args = ("--max-running-requests", "1", "--enable-metrics")
    s = Server(model_dir, log, plugin=True, env=env, args=args)
    yield from running(s)


def test_one_off_tenants_beyond_the_cap_are_forgotten_and_all_served(tenants_server):
    """40 one-off tenants, one request each, one after another (each finished before the
    next arrives): idle ones are forgotten, so each new one gets its own counter and
    none is billed to the default tenant (that would be logged: with the cap at 6 and
    no forgetting, the seventh would be)."""
    server = tenants_server
    out: dict[str, Any] = {}
    for i in range(40):
        server.generate(f"one-off-{i:02d}", 4, out, f"O{i}").join(DEADLINE)
        assert isinstance(out[f"O{i}"], dict), out[f"O{i}"]
    assert all(out[f"O{i}"]["meta_info"]["completion_tokens"] == 4 for i in range(40))
    m = server.wait_for_metrics(
        "nothing active", lambda m: m[("vtc_tenants_active", frozenset())] == 0
    )
    assert "VTC_MAX_TENANTS" not in server.log.read_text()  # never more than the cap at once
    assert len(tenant_labels(m) - {"_other"}) <= LABELLED, tenant_labels(m)


def test_more_active_tenants_than_the_cap_bill_the_surplus_to_the_default_tenant(tenants_server):
    """A long request (``blocker``) of tenant ``blk`` holds the one running slot while
    MAX_TENANTS + 4 tenants each queue a request (all confirmed queued at once on
    /v1/loads, so all are active together however late this client is); then the
    blocker is aborted. The plugin tracks at most MAX_TENANTS active tenants, bills
    the surplus to the default tenant, says so once in the log, serves every request,
    and is idle again afterwards.

    The burst is sent at once, not one request at a time: on a fast machine the
    blocker (as long as the tiny model's context allows) could finish while a
    request-by-request burst was still being queued, and the first queued request
    would then run instead of waiting. Should the blocker still finish first, the
    wait ends then and the test says so, instead of waiting out DEADLINE."""
    server = tenants_server
    out: dict[str, Any] = {}
    threads = [server.generate("blk", 1800, out, "blocker")]
    server.wait_for("the blocker running", lambda load: load["num_running_reqs"] == 1)
    n = MAX_TENANTS + 4
    threads += [server.generate(f"burst-{i:02d}", 16, out, f"B{i}") for i in range(n)]
    _wait_until_queued(server, n, out)
    assert "blocker" not in out, f"the blocker finished before the burst was queued: {out}"
    assert server.load()["num_running_reqs"] == 1  # the blocker still runs: all were active
    server.post("/abort_request", {"rid": "blocker"})
    for t in threads:
        t.join(DEADLINE)
    assert out["blocker"]["meta_info"]["finish_reason"]["type"] == "abort", out["blocker"]
    assert all(out[f"B{i}"]["meta_info"]["completion_tokens"] == 16 for i in range(n)), out
    text = server.log.read_text()
    assert text.count("tenants active (VTC_MAX_TENANTS)") == 1, server.tail()
    m = server.wait_for_metrics(
        "the burst served and idle", lambda m: m[("vtc_tenants_active", frozenset())] == 0
    )
    assert len(tenant_labels(m) - {"_other"}) <= LABELLED, tenant_labels(m)


def tenant_labels(m: dict[tuple[str, frozenset], float]) -> set[str]:
    """The ``tenant`` label values of the vtc series on /metrics."""
    return {
        dict(labels)["tenant"]
        for name, labels in m
        if name.startswith("vtc_") and "tenant" in dict(labels)
    }
