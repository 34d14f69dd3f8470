"""vtc.top: the live view reads a real /metrics endpoint served over HTTP."""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from prometheus_client import CollectorRegistry, generate_latest

import vtc
from vtc import top
from vtc.adapter import Adapter
from vtc.config import EngineConfig
from vtc.metrics import TenantMetrics


@pytest.fixture
def served() -> Iterator[tuple[str, CollectorRegistry, dict]]:
    """A /metrics endpoint on loopback serving a registry (and a body override)."""
    registry = CollectorRegistry()
    override: dict = {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            body = override.get("body") or generate_latest(registry)
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", registry, override
    finally:
        server.shutdown()
        server.server_close()


def engine(registry: CollectorRegistry) -> Adapter:
    metrics = TenantMetrics(registry, interval=0.0)
    return Adapter(vtc.Scheduler(M=10_000), EngineConfig(), observers=[metrics])


def test_one_frame_shows_each_tenant_with_its_share_counter_and_requests(served):
    url, registry, _ = served
    adapter = engine(registry)
    a = adapter.arrive("a1", None, ["acme"], 30)
    adapter.arrive("b1", None, ["beta"], 10)
    adapter.arrive("b2", None, ["beta"], 10)
    adapter.requests.admit(adapter.requests.head(), 0)  # acme: 30 prompt tokens
    adapter.requests.charge([(a, 10)])  # and 10 decode
    adapter.requests.admit(adapter.requests.head(), 0)  # beta: 10
    adapter.step_done()
    out = io.StringIO()
    assert top.main([url, "--once"], out=out) == 0
    text = out.getvalue()
    rows = {line.split()[0]: line.split() for line in text.splitlines()[4:]}
    assert rows["acme"][1:2] == ["80.0%"] and rows["beta"][1:2] == ["20.0%"]  # 40 : 10
    assert rows["acme"][3] == f"{adapter.core.counter('acme'):.0f}"
    assert rows["beta"][4:6] == ["1", "1"]  # one waiting, one running
    assert "tenants active 2" in text and "Jain's index" in text
    assert list(rows) == ["acme", "beta"]  # most served first


def test_the_live_view_redraws_with_shares_over_the_last_interval(served):
    url, registry, _ = served
    adapter = engine(registry)
    a = adapter.arrive("a1", None, ["acme"], 10)
    adapter.requests.admit(adapter.requests.head(), 0)
    b = adapter.arrive("b1", None, ["beta"], 10)
    adapter.requests.admit(adapter.requests.head(), 0)
    adapter.step_done()
    sleeps = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 1:  # between the two frames only beta is served
            adapter.requests.charge([(b, 30)])
            adapter.step_done()
        else:
            raise KeyboardInterrupt  # Ctrl-C: a clean exit

    out = io.StringIO()
    assert top.main([url, "--interval", "0.5"], out=out, sleep=sleep) == 0
    frames = out.getvalue().split(top.CLEAR)[1:]
    assert len(frames) == 2 and sleeps == [0.5, 0.5]
    second = {ln.split()[0]: ln.split() for ln in frames[1].splitlines()[4:] if ln.strip()}
    assert second["beta"][1] == "100.0%" and second["acme"][1] == "0.0%"
    del a


def test_a_tenant_whose_series_came_back_shows_what_it_was_served_since(served):
    """A tenant's series gone from one scrape (forgotten by the core) and back, going on
    from its old total: its share is what it was served since it was last seen, not
    its whole total; a series below its last total (a restarted server) counts whole."""
    url, registry, override = served
    adapter = engine(registry)
    adapter.arrive("a1", None, ["gone"], 40)
    adapter.requests.admit(adapter.requests.head(), 0)  # gone: 40 prompt tokens
    adapter.requests.release("a1", finished=True)
    s = adapter.arrive("s1", None, ["stays"], 10)
    adapter.requests.admit(adapter.requests.head(), 0)
    adapter.step_done()
    frames_at: list[str] = []

    def sleep(seconds: float) -> None:
        frames_at.append("")
        if len(frames_at) == 1:  # gone forgotten: absent from the second scrape
            adapter.requests.charge([(s, 10)])
            assert adapter.tenancy.forget_idle() == 1
            adapter.step_done()
        elif len(frames_at) == 2:  # back: its series goes on from 40
            adapter.arrive("a2", None, ["gone"], 30)
            adapter.requests.admit(adapter.requests.head(), 0)
            adapter.requests.charge([(s, 30)])
            adapter.step_done()
        elif len(frames_at) == 3:  # a restarted server: every total from 0
            override["body"] = (
                b"# TYPE vtc_tenant_service_tokens counter\n"
                b'vtc_tenant_service_tokens_total{tenant="gone",kind="prompt"} 5.0\n'
                b'vtc_tenant_service_tokens_total{tenant="stays",kind="prompt"} 15.0\n'
            )
        else:
            raise KeyboardInterrupt

    out = io.StringIO()
    assert top.main([url, "--interval", "0.5"], out=out, sleep=sleep) == 0
    frames = out.getvalue().split(top.CLEAR)[1:]
    assert len(frames) == 4
    rows = [{ln.split()[0]: ln.split() for ln in f.splitlines()[4:] if ln.strip()} for f in frames]
    assert "gone" not in rows[1]
    assert rows[2]["gone"][1] == "50.0%" and rows[2]["stays"][1] == "50.0%"  # 30 : 30
    assert rows[3]["gone"][1] == "25.0%" and rows[3]["stays"][1] == "75.0%"  # 5 : 15


def test_a_url_without_vtc_series_or_unreachable_is_a_clear_error(served, capsys):
    url, _, override = served
    override["body"] = b"# HELP other_total x\n# TYPE other_total counter\nother_total 1.0\n"
    assert top.main([url, "--once"]) == 2
    assert "has no vtc_* series" in capsys.readouterr().err
    assert top.main(["http://127.0.0.1:9/metrics", "--once"]) == 1
    assert "cannot read" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        top.main([url, "--interval", "0"])


def test_odd_tenant_names_cannot_break_the_table():
    text = (
        "# TYPE vtc_tenant_requests gauge\n"
        'vtc_tenant_requests{tenant="a\\nb",state="waiting"} 2.0\n'
    )
    sample = top.parse(text)
    assert sample.waiting == {"a\nb": 2.0}
    screen = top.frame(sample, None, 0.0, "x")
    assert "a\\nb" in screen and len(screen.splitlines()) == 5
