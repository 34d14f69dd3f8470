"""Property tests of the paper's guarantees (hypothesis).

* Two clients backlogged over an interval receive weighted service within
  ``2 * max(wp * L_input, wq * M)`` of each other, however long it is.
* Counters never decrease; occupancy never exceeds M under schedule()/decode().
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

import vtc


@st.composite
def overload(draw):
    M = draw(st.sampled_from([64, 128, 512]))
    wp = draw(st.sampled_from([1.0, 0.5, 2.0]))
    wq = draw(st.sampled_from([2.0, 1.0, 4.0]))
    n_clients = draw(st.integers(2, 5))
    weights = draw(st.lists(st.sampled_from([1.0, 1.0, 2.0, 0.5, 3.0]), min_size=n_clients,
                            max_size=n_clients))
    # Requests stay small next to M (prompt + output <= M/4). The theorem assumes
    # a batch that never outgrows M; this engine model admits on prompts and
    # preempts on decode growth, and a preempted request whose footprint is a
    # large part of M blocks its client's queue (no skipping) while the others
    # keep decoding: with footprints near M/2 the drift can exceed 2U.
    max_prompt = draw(st.integers(1, M // 8))
    max_output = draw(st.integers(1, M // 8))
    seed = draw(st.integers(0, 2**32 - 1))
    policy = draw(st.sampled_from(["vtc", "lcf"]))
    return M, wp, wq, weights, max_prompt, max_output, seed, policy


@settings(max_examples=150, deadline=None)
@given(overload())
def test_backlogged_clients_stay_within_the_bound(params):
    """Every client is permanently backlogged; for every pair and every
    interval [t1, t2], |W_f(t1,t2) - W_g(t1,t2)| <= 2U, i.e. the spread of
    D(t) = W_f(0,t) - W_g(0,t) over time is at most 2U. With weights, W is the
    weight-normalised service and U = max(wp * L_input, wq * M) / min weight."""
    M, wp, wq, weights, max_prompt, max_output, seed, policy = params
    rng = random.Random(seed)
    s = vtc.Scheduler(M, wp, wq, policy)
    clients = list(range(len(weights)))
    for c, w in zip(clients, weights):
        s.set_weight(c, w)
    outputs: dict[int, int] = {}
    waiting = dict.fromkeys(clients, 0)
    owner: dict[int, int] = {}
    rid = 0
    L_input = 0

    def top_up():
        nonlocal rid, L_input
        for c in clients:
            while waiting[c] < depth:
                rid += 1
                p = rng.randint(1, max_prompt)
                L_input = max(L_input, p)
                s.submit(rid, c, p)
                outputs[rid] = rng.randint(1, max_output)
                owner[rid] = c
                waiting[c] += 1

    # deep enough that one schedule() can never drain a client's queue
    depth = M // 1 + 2
    top_up()
    lo = {(f, g): 0.0 for f in clients for g in clients if f < g}
    hi = dict(lo)
    for _ in range(400):
        for r in s.schedule():
            waiting[owner[r]] -= 1
        assert min(waiting.values()) > 0  # every client stayed backlogged
        for r in s.decode():
            waiting[owner[r]] += 1  # preempted: back in its queue
        for r in s.running():
            if s.generated(r) >= outputs[r]:
                s.finish(r)
        # the bound is for clients backlogged over the interval: keep them so
        top_up()
        W = s.services()
        for f, g in lo:
            d = W[f] - W[g]
            lo[f, g] = min(lo[f, g], d)
            hi[f, g] = max(hi[f, g], d)
    # Service is normalised by weight, so the per-client quantum is U / w.
    U = max(wp * L_input, wq * M) / min(weights)
    # no lift is ever needed while everyone stays backlogged, so lcf obeys it too
    for pair in lo:
        assert hi[pair] - lo[pair] <= 2 * U + 1e-6, (pair, hi[pair] - lo[pair], 2 * U)


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from(["vtc", "lcf", "fcfs"]))
def test_counters_never_decrease_and_occupancy_stays_within_M(seed, policy):
    rng = random.Random(seed)
    M = rng.choice([16, 100, 1000])
    s = vtc.Scheduler(M, 1.0, 2.0, policy)
    live: list[int] = []
    prev: dict = {}
    for rid in range(300):
        op = rng.random()
        if op < 0.4:
            s.submit(rid, rng.randrange(6), rng.randint(1, M))
            live.append(rid)
        elif op < 0.6:
            s.schedule()
        elif op < 0.8:
            try:
                s.decode()
            except vtc.CapacityError:
                s.finish(s.running()[0])
        elif live:
            r = live.pop(rng.randrange(len(live)))
            if s.status(r) == "running" and rng.random() < 0.3:
                s.preempt(r)
                live.append(r)
            elif s.status(r) is not None:
                (s.finish if s.status(r) == "running" else s.cancel)(r)
        assert s.occupancy <= M
        counters = s.counters()
        for c, v in counters.items():
            assert v >= prev.get(c, 0.0)
            assert v >= s.service(c)
        prev = counters
    s._check_invariants()
