"""vtc.adapter's locality window plumbing (VTC_LOCALITY_QUANTUM), engine-agnostic:
the core built with the configured quantum, the engine's prefix lookup kept within
the core's contract (PrefixLookup), one answer per request within a pass."""

from __future__ import annotations

import logging

import pytest

from vtc.adapter import LOOKUP_LOG_EVERY, Adapter, PrefixLookup, engine_core
from vtc.config import ConfigError, EngineConfig


class Req:
    """An engine's request object: its prompt and what the engine holds cached."""

    def __init__(self, prompt: int, hit=0) -> None:
        self.prompt, self.hit = prompt, hit


def adapter(q: float, hits=None) -> tuple[Adapter, list]:
    """An adapter over ``engine_core`` with quantum ``q``; the engine's lookup reads
    ``request.hit`` and records every request it is asked about."""
    config = EngineConfig(locality_quantum=q)
    ad = Adapter(engine_core(config, 10_000), config)
    asked: list = []

    def cached(req: Req) -> int:
        asked.append(req)
        if isinstance(req.hit, Exception):
            raise req.hit
        return req.hit

    ad.set_prefix_lookup(cached)
    return ad, asked


def arrive(ad: Adapter, key: str, tenant: str, req: Req):
    return ad.enqueue(key, req, (tenant,), req.prompt)


def test_the_core_gets_the_quantum_and_a_cached_head_goes_first() -> None:
    ad, asked = adapter(50.0)
    assert ad.core.locality_quantum == 50.0 and ad.prefix_lookup is not None
    a, b = Req(40), Req(40, hit=32)
    ta, tb = arrive(ad, "a", "a", a), arrive(ad, "b", "b", b)
    assert ad.requests.head() is tb  # a's head is older (plain VTC's choice)
    assert set(asked) == {a, b}
    ad.requests.admit(tb, 32)
    assert ad.core.counters() == {"a": 0.0, "b": 8.0}
    assert ad.requests.head() is ta  # one candidate left: not asked
    assert "locality window Q=50 weighted tokens over the engine's prefix cache" in ad.describe()


def test_at_quantum_zero_nothing_is_installed_and_nothing_asked() -> None:
    ad, asked = adapter(0.0)
    assert ad.core.locality_quantum == 0.0 and ad.prefix_lookup is None
    ta = arrive(ad, "a", "a", Req(40))
    arrive(ad, "b", "b", Req(40, hit=32))
    assert ad.requests.head() is ta and asked == []
    assert "locality" not in ad.describe()


def test_a_quantum_without_a_lookup_says_so() -> None:
    config = EngineConfig(locality_quantum=8.0)
    ad = Adapter(engine_core(config, 10_000), config)
    assert "locality window Q=8 weighted tokens unused (no prefix-cache lookup" in ad.describe()
    ad.set_prefix_lookup(lambda r: 0)
    assert ad.prefix_lookup is not None
    ad.set_prefix_lookup(None)
    assert ad.prefix_lookup is None and "unused" in ad.describe()


def test_an_engine_that_cannot_answer_says_why_once_and_installs_nothing(caplog) -> None:
    """``unused``: the engine's own reason (its cache is off) is logged with the
    variable, the lookup in force is removed, and at quantum 0 nothing is said."""
    ad, asked = adapter(100.0)
    assert ad.prefix_lookup is not None
    with caplog.at_level(logging.WARNING):
        assert ad.set_prefix_lookup(lambda r: 1, unused="the cache is off (--no-cache)") is None
    assert ad.prefix_lookup is None
    assert "VTC_LOCALITY_QUANTUM=100 is unused: the cache is off (--no-cache)" in caplog.text
    assert caplog.text.count("is unused") == 1
    ta = arrive(ad, "a", "a", Req(40))
    arrive(ad, "b", "b", Req(40, hit=32))
    assert ad.requests.head() is ta and asked == []  # plain VTC: nothing asked
    caplog.clear()
    plain, _ = adapter(0.0)
    with caplog.at_level(logging.WARNING):
        plain.set_prefix_lookup(None, unused="the cache is off")
    assert "unused" not in caplog.text


@pytest.mark.parametrize(
    ("hit", "answer"),
    [(7, 7), (-3, 0), (10**9, 40), (True, 0), (2.5, 0), ("12", 0), (None, 0)],
)
def test_answers_are_kept_within_the_cores_contract(hit, answer) -> None:
    """An int in [0, prompt]: larger is cut to the prompt, negative to 0, and anything
    that is not an int counts as nothing cached (the core would raise TypeError)."""
    ad, _ = adapter(50.0)
    t = arrive(ad, "a", "a", Req(40, hit=hit))
    assert ad.prefix_lookup(t.rid) == answer
    assert ad.prefix_lookup(12345) == 0  # an id the adapter does not track


def test_a_failing_lookup_answers_zero_and_is_logged_once_a_minute(caplog) -> None:
    ad, _ = adapter(50.0)
    lookup = ad.prefix_lookup
    now = [100.0]
    lookup._clock = lambda: now[0]
    a, b = Req(40), Req(40, hit=RuntimeError("cache gone"))
    ta = arrive(ad, "a", "a", a)
    arrive(ad, "b", "b", b)
    with caplog.at_level(logging.ERROR):
        assert ad.requests.head() is ta  # b counts as uncached: plain order
        assert ad.requests.head() is ta
    assert lookup.failures == 2 and caplog.text.count("prefix-cache lookup failed") == 1
    assert "cache gone" in caplog.text
    b.hit = 32
    assert ad.requests.head().request is b  # it answers again
    b.hit = RuntimeError("gone again")
    now[0] += LOOKUP_LOG_EVERY
    caplog.clear()
    with caplog.at_level(logging.ERROR):
        ad.requests.head()
    assert "gone again" in caplog.text and "(3 failures so far)" in caplog.text


def test_within_a_pass_each_request_is_asked_once_and_peek_and_pop_agree() -> None:
    """The engine's cache changes between the peek and the pop (an admission may
    evict): within ``selecting()`` the first answers stand, so the pop admits the
    request the peek named."""
    ad, asked = adapter(50.0)
    a, b = Req(40), Req(40, hit=32)
    ta, tb = arrive(ad, "a", "a", a), arrive(ad, "b", "b", b)
    with ad.selecting():
        assert ad.requests.head() is tb
        b.hit, a.hit = 0, 39  # evicted meanwhile
        assert ad.requests.head() is tb
        ad.requests.admit(tb, 0)  # would raise if the core popped another request
    assert asked == [a, b] or asked == [b, a]
    assert ad.requests.head() is ta  # alone now
    assert ad.core.status(tb.rid) == "running"


def test_a_pass_guards_the_order_only_with_an_installed_lookup_or_shared_counters() -> None:
    """``pass_guards_order``: what lets vLLM's shell skip a pass. A lookup the core
    never asks (quantum 0) or one removed guards nothing; an installed lookup, or
    shared counters, does."""
    ad, _ = adapter(0.0)
    assert ad.prefix_lookup is None and not ad.pass_guards_order
    ad, _ = adapter(50.0)
    assert ad.pass_guards_order
    ad.set_prefix_lookup(None)
    assert not ad.pass_guards_order
    ad.sharing = object()  # (a stand-in: only its presence is read)
    assert ad.pass_guards_order
    ad.sharing = None
    assert not ad.pass_guards_order


def test_a_bad_quantum_is_a_config_error() -> None:
    for q in (-1.0, float("nan"), float("inf"), True, "1"):
        with pytest.raises(ConfigError, match="locality_quantum="):
            EngineConfig(locality_quantum=q)


def test_a_lookup_is_a_prefix_lookup_of_the_core() -> None:
    ad, _ = adapter(50.0)
    assert isinstance(ad.prefix_lookup, PrefixLookup)
