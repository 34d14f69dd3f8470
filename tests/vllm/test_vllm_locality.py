"""VTC_LOCALITY_QUANTUM in the vLLM drop-in: the core's locality window fed by vLLM's
real prefix cache (:func:`vtc.vllm.cached_prompt_tokens`), on vLLM's real V1
scheduler (see vllm_harness.py)."""

from __future__ import annotations

import logging
from collections import deque

import pytest
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm_harness import make_request, make_scheduler, model_output, step, vllm_config

import vtc.vllm as vv
from vtc.vllm import AsyncVTCScheduler, VTCScheduler

WP, WQ = 1.0, 2.0
PREFIX = [11 + (7 * j) % 400 for j in range(80)]  # tenant b's prompt: 5 full blocks


def scheduler(model_dir: str, monkeypatch, q: float, caching: bool = True, seqs: int = 3):
    monkeypatch.setenv("VTC_LOCALITY_QUANTUM", str(q))
    config = vllm_config(model_dir, max_num_seqs=seqs, enable_prefix_caching=caching)
    return make_scheduler(VTCScheduler, config)


def warm(s: VTCScheduler) -> None:
    """Run one request of PREFIX (tenant w) to the end: vLLM's cache holds it."""
    s.add_request(make_request("w", prompt=PREFIX, max_tokens=1))
    while s.has_requests():
        step(s)


def admit_one_of_two(s: VTCScheduler) -> tuple[list[str], object, object, dict]:
    """a and b each have one request running (a the less served: 8 prompt tokens
    against 16); then a's uncached 80-token request and b's cached one wait, with
    room (max_num_seqs = 3) for one. Returns the ids the next step admits, the two
    requests and the counters the choice was made on."""
    s.add_request(make_request("a", prompt_len=8, max_tokens=100))
    s.add_request(make_request("b", prompt_len=16, max_tokens=100))
    step(s)
    counters = s.tenant_counters()
    a1 = make_request("a", prompt_len=80, max_tokens=4)
    b1 = make_request("b", prompt=PREFIX, max_tokens=4)
    s.add_request(a1)
    s.add_request(b1)
    output, _ = step(s)
    return [r.req_id for r in output.scheduled_new_reqs], a1, b1, counters


def drain(s: VTCScheduler) -> None:
    while s.has_requests():
        step(s)
    assert not s.requests and s.vtc.num_waiting == 0 and s.vtc.occupancy == 0
    s.vtc._check_invariants()


@pytest.mark.parametrize("q", [0.0, 100.0])
def test_a_cached_prefix_goes_first_within_the_window(model_dir: str, monkeypatch, q) -> None:
    """Plain VTC (Q = 0) admits the less served tenant a; with Q = 100, b is within
    the window and its 64 cached tokens win. b is charged only what vLLM computed."""
    s = scheduler(model_dir, monkeypatch, q)
    warm(s)
    admitted, a1, b1, at = admit_one_of_two(s)
    assert at["a"] + WP * 8 == at["b"]  # a is the less served, b within 100 of it
    assert admitted == ([b1.request_id] if q > 0 else [a1.request_id])
    lookup = s.vtc_adapter.prefix_lookup
    if q > 0:
        assert lookup is not None and lookup.failures == 0 and lookup.calls >= 2
        assert s.vtc.locality_quantum == q
    else:
        assert lookup is None and s.vtc.locality_quantum == 0.0
    drain(s)
    services = s.tenant_services()
    # b1 is charged the 16 prompt tokens vLLM computed past its 64-token hit, whenever
    # it ran; a1 all 80
    assert services["b"] == WP * 16 + WQ * 100 + WP * (80 - 64) + WQ * 4
    assert services["a"] == WP * 8 + WQ * 100 + WP * 80 + WQ * 4


def test_no_lookup_without_prefix_caching(model_dir: str, monkeypatch, caplog) -> None:
    """--no-enable-prefix-caching: nothing is ever cached, so the window is not fed
    (logged) and the order is plain VTC."""
    with caplog.at_level(logging.WARNING):
        s = scheduler(model_dir, monkeypatch, 100.0, caching=False)
    assert "VTC_LOCALITY_QUANTUM=100 is unused" in caplog.text
    assert s.vtc_adapter.prefix_lookup is None
    admitted, a1, _, _ = admit_one_of_two(s)
    assert admitted == [a1.request_id]
    drain(s)


def test_a_failing_lookup_is_logged_and_vllm_carries_on(model_dir: str, monkeypatch, caplog):
    """The cache lookup raising counts as nothing cached (logged): the step admits
    in plain VTC order; every request is still served and charged what vLLM computed,
    and once the lookup works again it fails no more."""
    s = scheduler(model_dir, monkeypatch, 100.0)
    warm(s)
    real = vv.cached_prompt_tokens
    broken = [True]

    def cached_prompt_tokens(*args, **kwargs):
        if broken[0]:
            raise RuntimeError("injected cache-lookup fault")
        return real(*args, **kwargs)

    # the lookup's call only: vLLM's own admission path keeps its cache
    monkeypatch.setattr(vv, "cached_prompt_tokens", cached_prompt_tokens)
    with caplog.at_level(logging.ERROR):
        admitted, a1, b1, _ = admit_one_of_two(s)
    assert admitted == [a1.request_id]  # plain VTC: a is the less served
    assert "injected cache-lookup fault" in caplog.text
    lookup = s.vtc_adapter.prefix_lookup
    assert lookup is not None and lookup.failures >= 1
    broken[0] = False
    failures, calls = lookup.failures, lookup.calls
    s.add_request(make_request("b", prompt=PREFIX, max_tokens=4))
    s.add_request(make_request("a", prompt_len=80, max_tokens=4))
    drain(s)
    assert lookup.failures == failures and lookup.calls > calls
    services = s.tenant_services()
    assert services["b"] == WP * 16 + WQ * 100 + 2 * (WP * (80 - 64) + WQ * 4)
    assert services["a"] == WP * 8 + WQ * 100 + 2 * (WP * 80 + WQ * 4)


@pytest.mark.parametrize("q", [0.0, 60.0, 200.0])
def test_counters_stay_within_the_window_bound(model_dir: str, monkeypatch, q) -> None:
    """Two tenants backlogged, b's prompts cached, a's not; one request runs at a time
    (max_num_seqs = 1), each generating 2 tokens. docs/locality.md's bound: a tenant
    admitted was within Q of the other then and is charged at most one request's cost C
    after it, so |c_a - c_b| <= Q + C while both wait. With Q > C the window is used:
    b gets ahead by more than plain VTC's C."""
    s = scheduler(model_dir, monkeypatch, q, seqs=1)
    warm(s)
    for _ in range(10):
        s.add_request(make_request("a", prompt_len=80, max_tokens=2))
        s.add_request(make_request("b", prompt=PREFIX, max_tokens=2))
    cost = WP * 80 + WQ * 2  # the dearest request: a's, nothing cached
    admitted, gaps = 0, []
    while s.has_requests():
        output, _ = step(s)
        admitted += len(output.scheduled_new_reqs)
        waiting = {t for t, (w, _) in s.vtc.active_clients().items() if w}
        if waiting >= {"a", "b"}:
            c = s.tenant_counters()
            gaps.append(c["b"] - c["a"])
    assert admitted == 20 and len(gaps) >= 8
    assert max(abs(g) for g in gaps) <= q + cost, gaps
    if q > cost:
        assert max(gaps) > cost, gaps  # b served ahead of its turn: the window at work
    services = s.tenant_services()
    assert services["b"] == 10 * (WP * (80 - 64) + WQ * 2)  # every b request hit 64


def run_async(s, until_idle: bool = True, schedules: int = 2000) -> list[str]:
    """vLLM's async loop (schedule step N+1 before step N's output arrives) for at
    most ``schedules`` schedule() calls, or until idle; the ids admitted, in order."""
    in_flight: deque = deque()
    admitted = []
    for _ in range(schedules):
        if until_idle and not in_flight and not s.has_requests():
            break
        output = s.schedule()
        admitted += [r.req_id for r in output.scheduled_new_reqs]
        if output.num_scheduled_tokens:
            in_flight.append((output, model_output(s, output)))
        if len(in_flight) == 2 or (in_flight and not output.num_scheduled_tokens):
            done, result = in_flight.popleft()
            s.update_from_output(done, result)
    while in_flight:
        done, result = in_flight.popleft()
        s.update_from_output(done, result)
    return admitted


@pytest.mark.parametrize("q", [0.0, 100.0])
def test_the_async_scheduler_feeds_the_window_too(model_dir: str, monkeypatch, q) -> None:
    """AsyncVTCScheduler (vLLM's async scheduling) builds the same core and lookup:
    the same choice as the synchronous one, charged what vLLM computed."""
    monkeypatch.setenv("VTC_LOCALITY_QUANTUM", str(q))
    config = vllm_config(
        model_dir, max_num_seqs=3, enable_prefix_caching=True, async_scheduling=True
    )
    s = make_scheduler(AsyncVTCScheduler, config)
    assert isinstance(s, AsyncScheduler)
    s.add_request(make_request("w", prompt=PREFIX, max_tokens=1))
    run_async(s)
    a0 = make_request("a", prompt_len=8, max_tokens=100)
    b0 = make_request("b", prompt_len=16, max_tokens=100)
    a1 = make_request("a", prompt_len=80, max_tokens=4)
    b1 = make_request("b", prompt=PREFIX, max_tokens=4)
    s.add_request(a0)
    s.add_request(b0)
    assert run_async(s, until_idle=False, schedules=1) == [a0.request_id, b0.request_id]
    s.add_request(a1)
    s.add_request(b1)
    first = run_async(s, until_idle=False, schedules=1)
    assert first == ([b1.request_id] if q > 0 else [a1.request_id])
    run_async(s)
    assert not s.has_requests() and s.vtc.num_waiting == 0 and s.vtc.occupancy == 0
    services = s.tenant_services()
    assert services["b"] == WP * 16 + WQ * 100 + WP * (80 - 64) + WQ * 4
    assert services["a"] == WP * 8 + WQ * 100 + WP * 80 + WQ * 4
