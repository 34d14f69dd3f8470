"""The simulator's prefix cache (vtc.sim.cache), its engine wiring and the LPM baseline."""

from __future__ import annotations

import dataclasses
import math
import random

import numpy as np
import pytest

from vtc.sim import metrics, reference_scheduler, simulate, workloads
from vtc.sim.baselines import LpmScheduler, lpm_scheduler
from vtc.sim.cache import BLOCK, PrefixCache, chains
from vtc.sim.workloads import Request

B = BLOCK


# -- the cache -------------------------------------------------------------------


def test_chains_follow_block_boundaries():
    # a block belongs to the segment its last token is in
    assert chains((), 100, "own") == [("own", 6)]
    assert chains((("p", 64),), 100, "own") == [("p", 4), ("own", 2)]
    assert chains((("p", 40),), 100, "own") == [("p", 2), ("own", 4)]
    assert chains((("sys", 20), ("doc", 30)), 60, "own") == [("sys", 1), ("doc", 2)]
    assert chains((("p", 10),), 12, "own") == []
    with pytest.raises(ValueError, match="longer than the prompt"):
        chains((("p", 50),), 40, "own")


def test_hit_and_miss():
    c = PrefixCache(100 * B)
    a = [("p", 10), ("a", 3)]
    b = [("p", 10), ("b", 2)]
    assert c.lookup(a) == 0
    assert c.acquire(a) == 0  # miss: computes and inserts everything
    assert c.used == 13 * B
    assert c.lookup(b) == 10 * B  # the shared prefix hits, its own suffix does not
    assert c.acquire(b) == 10 * B
    assert c.lookup(a) == 13 * B  # a's own blocks too (a preempted a would reuse them)
    assert c.lookup([("q", 4)]) == 0
    assert (c.hits, c.lookups, c.inserted, c.evicted) == (10 * B, 25 * B, 15 * B, 0)
    c.check()


def test_lru_evicts_the_least_recently_used_unpinned_chain_tail_first():
    c = PrefixCache(20 * B)
    for key in ("x", "y"):
        c.acquire([(key, 10)])
        c.release([(key, 10)])
    c.acquire([("x", 10)])  # x is now more recent than y
    c.release([("x", 10)])
    c.acquire([("z", 4)])  # needs 4 blocks: y loses its last 4
    assert (c.cached("x"), c.cached("y"), c.cached("z")) == (10, 6, 4)
    assert c.lookup([("y", 10)]) == 6 * B  # what is left of a chain is still its prefix
    c.release([("z", 4)])
    c.acquire([("w", 8)])  # y (6 blocks, oldest) goes whole, then x loses 2
    assert (c.cached("x"), c.cached("y"), c.cached("w")) == (8, 0, 8)
    assert c.evicted == 12 * B
    c.check()


def test_own_suffix_is_evicted_before_the_shared_prefix():
    c = PrefixCache(16 * B)
    req = [("p", 10), ("own", 4)]
    c.acquire(req)
    c.release(req)  # released tail first: "own" is older in the LRU order
    c.acquire([("q", 4)])
    assert c.cached("p") == 10 and c.cached("own") == 2
    c.check()


def test_pinned_blocks_are_never_evicted():
    c = PrefixCache(12 * B)
    c.acquire([("a", 10)])  # running: pinned
    assert c.acquire([("b", 6)]) == 0  # only 2 blocks free: b is cached in part
    assert (c.cached("a"), c.cached("b")) == (10, 2)
    assert c.pinned == 12 * B and c.used == 12 * B
    c.release([("a", 10)])
    c.acquire([("b", 6)])  # a is evictable now: b completes
    assert (c.cached("a"), c.cached("b")) == (6, 6)
    # b is used by the two requests that acquired it: pinned until both release it
    c.release([("b", 6)])
    c.acquire([("d", 12)])  # only a's blocks can go
    assert (c.cached("a"), c.cached("b"), c.cached("d")) == (0, 6, 6)
    c.release([("b", 6)])
    c.release([("d", 12)])
    c.acquire([("e", 12)])  # now b (released first) and d both go
    assert (c.cached("b"), c.cached("d"), c.cached("e")) == (0, 0, 12)
    c.check()


def test_a_gap_stops_insertion_of_the_later_chains():
    c = PrefixCache(10 * B)
    c.acquire([("pin", 6)])
    c.acquire([("p", 6), ("own", 3)])  # room for 4 blocks of p only
    assert (c.cached("p"), c.cached("own")) == (4, 0)
    c.check()


def test_capacity_is_never_exceeded_under_random_use():
    rng = random.Random(5)
    c = PrefixCache(50 * B + 7)
    assert c.capacity == 50 * B
    running: list[list] = []
    for step in range(3000):
        if running and rng.random() < 0.45:
            c.release(running.pop(rng.randrange(len(running))))
        else:
            p = rng.randrange(6)
            req = [(("p", p), 4 + 3 * p), (("own", step), rng.randint(0, 5))]
            hit = c.lookup(req)
            assert c.acquire(req) == hit
            running.append(req)
        c.check()
        assert c.used <= c.capacity and c.peak <= c.capacity
    for req in running:
        c.release(req)
    c.check()
    assert c.pinned == 0


# -- the engine with a cache -------------------------------------------------------


def _shared(n: int, M: int = 4096) -> list[Request]:
    """``n`` requests of one client on one 1024-token prefix, one every 5 steps."""
    return [Request(5 * i, i % 2, 1024 + 50, 20, prefix=(("doc", 1024),)) for i in range(n)]


def test_cache_hits_are_charged_only_for_uncached_tokens():
    reqs = _shared(40)
    cache = PrefixCache(8192)
    res = simulate(reqs, 400, M=4096, policy="vtc", cache=cache)
    admitted = [i for i, a in enumerate(res.first_admit) if a >= 0]
    assert res.cached[admitted[0]] == 0
    assert all(res.cached[i] == 1024 for i in admitted[1:])
    assert all(res.prefilled[i] == 1074 - res.cached[i] for i in admitted)
    assert res.hit_rate == pytest.approx(1024 * (len(admitted) - 1) / (1074 * len(admitted)))
    # the scheduler charged wp * (prompt - hit) + wq * generated
    charged = sum(res.service[c][-1] for c in res.clients)
    expect = sum(res.prefilled[i] for i in admitted) + 2.0 * sum(res.generated)
    assert math.isclose(charged, expect)
    # the harness's delivered service agrees with what the scheduler charged
    for c in res.clients:
        assert math.isclose(res.delivered[c][-1], res.service[c][-1])
    cache.check()
    assert all(f >= 0 for f in res.finish)
    assert cache.pinned == 0 and cache.used == (1024 // B + 40 * (1074 // B - 1024 // B)) * B


def test_prefill_time_stretches_steps_and_arrivals_follow_the_clock():
    reqs = _shared(40)
    res = simulate(reqs, 300, M=4096, policy="fcfs", cache=PrefixCache(8192), prefill_time=0.01)
    assert res.elapsed == pytest.approx(300 + 0.01 * sum(res.prefilled))
    clock = np.frombuffer(res.clock, dtype=np.float64)
    assert len(clock) == 301 and np.all(np.diff(clock) >= 1.0)
    for r, a in zip(reqs, res.first_admit):
        if a >= 0:  # admitted no earlier than the step whose start the arrival preceded
            assert clock[a] >= r.arrival
    # without prefill time the clock is the step count
    res0 = simulate(reqs, 300, M=4096, policy="fcfs", cache=PrefixCache(8192))
    assert list(res0.clock) == [float(t) for t in range(301)] and res0.elapsed == 300


@pytest.mark.parametrize("policy", ["vtc", "fcfs", "lcf"])
def test_an_empty_cache_admits_exactly_as_schedule_does(policy):
    # peek()/pop(cached_len=0) under the engine's KV check is schedule()
    reqs = workloads.overloaded([1.5, 1.0], 3000, 2048, seed=3)
    a = simulate(reqs, 3000, M=2048, policy=policy)
    b = simulate(reqs, 3000, M=2048, policy=policy, cache=PrefixCache(0))
    assert a.preemptions > 0
    assert a.first_admit == b.first_admit and a.finish == b.finish
    assert a.preemptions == b.preemptions
    for c in a.clients:
        assert np.array_equal(metrics.service(a, c), metrics.service(b, c))
    assert sum(b.reused) == 0


def test_rust_core_and_reference_agree_with_a_cache():
    reqs = workloads.prefix_heavy(3000, 8192, seed=2)
    kw = dict(M=8192, policy="vtc", prefill_time=1 / 256)
    a = simulate(reqs, 1500, cache=PrefixCache(8192), **kw)
    b = simulate(reqs, 1500, cache=PrefixCache(8192), factory=reference_scheduler, **kw)
    assert a.first_admit == b.first_admit and a.cached == b.cached
    assert sum(a.reused) > 0
    for c in a.clients:
        assert np.array_equal(metrics.service(a, c), metrics.service(b, c))


def test_cache_and_fixed_hits_are_exclusive():
    with pytest.raises(ValueError, match="not both"):
        simulate(_shared(2), 10, M=4096, cache=PrefixCache(100), cached=[0, 0])
    with pytest.raises(ValueError, match="prefill_time"):
        simulate(_shared(2), 10, M=4096, prefill_time=-1.0)


# -- longest prefix match ----------------------------------------------------------


def test_lpm_takes_the_longest_cached_prefix_then_the_earliest():
    hits = {0: 0, 1: 64, 2: 128, 3: 128}
    s = LpmScheduler(M=10_000)
    s.use_prefix_lookup(hits.__getitem__, lambda rid: rid)  # every request its own queue
    for rid in range(4):
        s.submit(rid, "a", 500)
    assert s.peek() == 2
    assert s.pop(cached_len=128) == 2 and s.service("a") == 500 - 128
    assert s.schedule() == [3, 1, 0]  # schedule() knows no hit: charged in full
    s.decode()
    assert s.service("a") == 500 - 128 + 3 * 500 + 2.0 * 4
    assert s.occupancy == 4 * 501


def test_lpm_without_a_cache_is_fcfs():
    reqs = workloads.overloaded([1.5, 1.0], 3000, 2048, seed=4)
    a = simulate(reqs, 3000, M=2048, policy="fcfs")
    b = simulate(reqs, 3000, M=2048, policy="lpm", factory=lpm_scheduler)
    assert a.preemptions > 0
    assert a.first_admit == b.first_admit and a.finish == b.finish
    for c in a.clients:
        assert np.allclose(metrics.service(a, c), metrics.service(b, c))


def test_lpm_with_nothing_shared_is_fcfs_and_with_sharing_reuses_more():
    M, steps = 8192, 2000
    shared = workloads.prefix_heavy(3 * steps, M, seed=1)
    unique = [dataclasses.replace(r, prefix=()) for r in shared]
    assert unique == workloads.no_sharing(3 * steps, M, seed=1)
    kw = dict(M=M, prefill_time=1 / 256)
    f = simulate(unique, steps, policy="fcfs", cache=PrefixCache(M), **kw)
    g = simulate(unique, steps, policy="lpm", factory=lpm_scheduler, cache=PrefixCache(M), **kw)
    assert f.first_admit == g.first_admit and f.prefilled == g.prefilled
    fs = simulate(shared, steps, policy="fcfs", cache=PrefixCache(M), **kw)
    ls = simulate(shared, steps, policy="lpm", factory=lpm_scheduler, cache=PrefixCache(M), **kw)
    assert ls.hit_rate > fs.hit_rate + 0.2
    assert ls.work[-1] / ls.elapsed > fs.work[-1] / fs.elapsed
