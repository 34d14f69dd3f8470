"""VTC_LOCALITY_QUANTUM in the SGLang plugin: the core's locality window fed by
SGLang's real radix cache (``RadixCache.match_prefix``), against SGLang 0.5.23's
real scheduler classes (see conftest.py)."""

from __future__ import annotations

import array

import pytest
import torch
from conftest import arrive, make_req, make_scheduler, prefill_pass, step
from sglang.srt.mem_cache.base_prefix_cache import InsertParams
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey

import vtc.config as vc
import vtc.sglang as vs

SYSTEM = list(range(100, 132))  # a 32-token prefix shared by tenant b's requests
WP, WQ = 1.0, 2.0


def cache_with_system_prompt() -> RadixCache:
    """A real radix tree holding SYSTEM (as if a request with it had run)."""
    tc = RadixCache.create_simulated()
    key = RadixKey(token_ids=array.array("q", SYSTEM))
    tc.insert(InsertParams(key=key, value=torch.arange(len(SYSTEM))))
    return tc


def with_quantum(q: float) -> vs.VtcState:
    state = vs.VtcState.from_env({"VTC_LOCALITY_QUANTUM": str(q)})
    vs.reset_state(state)
    return state


def b_req() -> object:
    """A request of tenant b: SYSTEM, then 8 tokens of its own (40 in all)."""
    return make_req("b", tokens=SYSTEM + [9000 + i for i in range(8)])


@pytest.mark.parametrize("q", [0.0, 100.0])
def test_a_cached_prefix_goes_first_within_the_window(q: float) -> None:
    """Tenant a is the least served (8 against b's 16) with nothing cached; b's waiting
    request starts with a prefix the radix tree holds. Plain VTC (Q = 0) admits a's
    request first; with Q = 100 b is within the window and its 32 cached tokens win.
    Either way b is charged only the 8 tokens SGLang computes. (b1 arrives after
    the first pass: waiting beside b0 it would be offered too, and go first, as
    the next test shows.)"""
    state = with_quantum(q)
    s = make_scheduler(cache_with_system_prompt())
    a0, b0, a1, b1 = make_req("a", 8), make_req("b", 16), make_req("a", 40), b_req()
    arrive(s, a0, b0, a1)  # SGLang's FCFS order, and VTC's tie-break: a first
    s.max_prefill_tokens = 30  # room for a0 and b0 only
    assert prefill_pass(s) == [a0, b0]
    arrive(s, b1)  # b is lifted to no less than a's 8: it stays at 16
    assert state.core.counters() == {"a": 8.0, "b": 16.0}  # a is the least served
    s.max_prefill_tokens = 41  # room for one 40-token prompt per pass
    assert prefill_pass(s) == ([b1] if q > 0 else [a1])
    assert prefill_pass(s) == ([a1] if q > 0 else [b1])
    assert b1.prefix_len == len(SYSTEM)  # SGLang's own match agrees with the lookup's
    assert state.core.counters() == {"a": 48.0, "b": 16.0 + 8.0}  # the cached 32 are free
    lookup = state.adapter.prefix_lookup
    if q == 0:
        assert lookup is None and state.core.locality_quantum == 0.0
    else:
        assert lookup is not None and lookup.failures == 0 and lookup.calls >= 2
        assert state.core.locality_quantum == q


@pytest.mark.parametrize("q", [0.0, 100.0])
def test_a_later_request_with_a_cached_prefix_goes_before_its_tenants_head(q: float) -> None:
    """b's head b0 has nothing cached, its next request b1 starts with the cached
    prefix: with Q = 100 the window offers both and b1 goes first (SGLang admits the
    core's choice, not b's head), then a0 and b0 by their counters; plain VTC keeps
    submit order within each tenant."""
    state = with_quantum(q)
    s = make_scheduler(cache_with_system_prompt())
    a0, b0, b1 = make_req("a", 8), make_req("b", 16), b_req()
    arrive(s, a0, b0, b1)
    s.max_prefill_tokens = 41  # room for all three (b1 computes 8)
    assert prefill_pass(s) == ([b1, a0, b0] if q > 0 else [a0, b0, b1])
    assert b1.prefix_len == len(SYSTEM)
    assert state.core.counters() == {"a": 8.0, "b": 16.0 + 8.0}  # the cached 32 are free


def test_the_lookup_answers_the_radix_match_without_touching_the_request() -> None:
    """cached_prefix is SGLang's lpm match (up to the prompt less its last token) and
    leaves the request's own prefix fields to SGLang; nothing is locked."""
    tc = cache_with_system_prompt()
    req = b_req()
    before = (req.prefix_len, req.last_node)
    assert vs.cached_prefix(tc, req) == len(SYSTEM)
    assert (req.prefix_len, req.last_node) == before
    assert tc.protected_size() == 0 and tc.evictable_size() == len(SYSTEM)
    whole = make_req("b", tokens=list(SYSTEM))  # all cached: the last token is computed
    assert vs.cached_prefix(tc, whole) == len(SYSTEM) - 1
    assert vs.cached_prefix(tc, make_req("a", 40)) == 0
    off = RadixCache.create_simulated(disable=True)
    assert vs.cached_prefix(off, req) == 0


def test_no_lookup_without_the_radix_cache(caplog) -> None:
    """--disable-radix-cache: nothing is ever cached, so the window is not fed (logged)
    and the order is plain VTC."""
    state = with_quantum(100.0)
    s = make_scheduler(RadixCache.create_simulated(disable=True))
    a1, b1 = make_req("a", 40), b_req()
    arrive(s, a1, b1)
    assert prefill_pass(s) == [a1, b1]
    assert state.adapter.prefix_lookup is None
    assert "VTC_LOCALITY_QUANTUM=100 is unused" in caplog.text


def test_a_failing_lookup_is_logged_and_sglang_carries_on(monkeypatch, caplog) -> None:
    """SGLang's match raising counts as nothing cached (logged once): the pass admits
    in plain VTC order, charged as usual, and the next pass works again."""
    state = with_quantum(100.0)
    tc = cache_with_system_prompt()
    s = make_scheduler(tc)
    s.max_prefill_tokens = 41
    real = RadixCache.match_prefix
    broken = [True]

    def match_prefix(self, params):
        if broken[0] and params.req is None:  # the lookup's match, not SGLang's own
            raise RuntimeError("injected match fault")
        return real(self, params)

    monkeypatch.setattr(RadixCache, "match_prefix", match_prefix)
    a1, a2, b1 = make_req("a", 40), make_req("a", 40), b_req()
    arrive(s, a1, a2, b1)
    assert prefill_pass(s) == [a1]  # tie at 0, a's head is older: plain VTC
    assert "injected match fault" in caplog.text
    lookup = state.adapter.prefix_lookup
    assert lookup is not None and lookup.failures >= 1
    broken[0] = False
    assert prefill_pass(s) == [b1]  # a is 40 ahead, within Q: b's cached prefix wins
    assert prefill_pass(s) == [a2]
    assert state.core.counters() == {"a": 80.0, "b": 8.0}


@pytest.mark.parametrize("q", [0.0, 60.0, 150.0])
def test_counters_stay_within_the_window_bound(q: float) -> None:
    """Two tenants backlogged, b's prefixes cached, a's not; one request admitted per
    pass, each finishing after two tokens, so at most one runs. docs/locality.md's
    bound, in this engine: a tenant admitted at t0 was within Q of the other then, and
    is charged at most one request's cost C after it, so |c_a - c_b| <= Q + C at every
    step. With Q > C the window is used (b gets ahead by more than plain VTC's C)."""
    state = with_quantum(q)
    s = make_scheduler(cache_with_system_prompt())
    s.get_num_allocatable_reqs = lambda *_a, **_k: 1  # one request per pass
    a = [make_req("a", 40) for _ in range(12)]
    b = [b_req() for _ in range(12)]
    arrive(s, *a, *b)
    cost = WP * 40 + WQ * 2  # the dearest request: a's, nothing cached
    gaps = []
    order = []
    for _ in range(24):
        running = prefill_pass(s)
        assert len(running) == 1
        order.append(state.tenant(running[0]))
        s.model.finish.add(running[0].rid)
        s.model.tokens = {running[0].rid: 2}
        step(s, running)
        waiting = {t for t, (w, _) in state.core.active_clients().items() if w}
        if waiting == {"a", "b"}:  # the bound is for tenants both backlogged
            c = state.core.counters()
            gaps.append(c["b"] - c["a"])
    assert order.count("a") == order.count("b") == 12 and len(gaps) >= 8
    assert max(abs(g) for g in gaps) <= q + cost, (gaps, order)
    if q > cost:
        assert max(gaps) > cost  # b served ahead of its turn: the window at work
    assert vc.EngineConfig.from_env({"VTC_LOCALITY_QUANTUM": str(q)}).locality_quantum == q


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "abc"])
def test_a_malformed_quantum_stops_the_plugin(value: str, monkeypatch) -> None:
    """Named with its value, at start-up (register() builds the state first)."""
    monkeypatch.setenv("VTC_LOCALITY_QUANTUM", value)
    vs.reset_state(None)
    with pytest.raises(vc.ConfigError, match=f"VTC_LOCALITY_QUANTUM='{value}'"):
        vs.get_state()
    vs.reset_state(vs.VtcState())
