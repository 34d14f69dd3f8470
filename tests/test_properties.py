"""Property tests of the paper's guarantees (hypothesis).

* Two clients backlogged over an interval receive weight-normalised service
  within ``2 * max(wp * L_input, wq * M) / min weight`` of each other (when
  ``wp <= wq``; see below for ``wp > wq``), however long the interval.
* Counters never decrease; occupancy never exceeds M under schedule()/decode().

The bound is Theorem 4.4 of Sheng et al. for the paper's engine, whose batch
never outgrows ``M``: admission reserves room for a request's whole output
(S-LoRA's router does this with each request's ``max_new_tokens``), so nothing
is ever preempted. The test drives the core exactly that way, in engine mode:
``peek()`` names the next request by VTC order, the engine admits it with
``pop()`` while ``reserved + prompt + max_new_tokens <= M`` (stopping at the
first that does not fit, as the core does) and reports tokens with
``decode(ids, 1)``.

The core's own ``schedule()``/``decode()`` loop admits on prompt size and
preempts on decode growth instead. There the theorem's premise fails: a
preempted request whose footprint is large blocks its client's queue (no
skipping) while the other clients' running requests keep decoding, and
hypothesis finds drifts above 2U (e.g. M=512, prompts <= 3 tokens, outputs
<= 63). The simulator reports drift/2U for that model (``vtc.sim``).
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

import vtc


@st.composite
def overload(draw):
    M = draw(st.sampled_from([64, 128, 512, 2048]))
    wp = draw(st.sampled_from([1.0, 0.5, 2.0]))
    wq = draw(st.sampled_from([2.0, 1.0, 4.0]))
    n_clients = draw(st.integers(2, 5))
    weights = draw(
        st.lists(st.sampled_from([1.0, 1.0, 2.0, 0.5, 3.0]), min_size=n_clients, max_size=n_clients)
    )
    max_prompt = draw(st.integers(1, M // 2))
    max_output = draw(st.integers(1, M - max_prompt))
    seed = draw(st.integers(0, 2**32 - 1))
    policy = draw(st.sampled_from(["vtc", "lcf"]))
    return M, wp, wq, weights, max_prompt, max_output, seed, policy


@settings(max_examples=150, deadline=None)
@given(overload())
def test_backlogged_clients_stay_within_the_bound(params):
    """Every client is permanently backlogged; for every pair and every
    interval [t1, t2], |W_f(t1,t2) - W_g(t1,t2)| <= 2U, i.e. the spread of
    D(t) = W_f(0,t) - W_g(0,t) over time is at most 2U."""
    M, wp, wq, weights, max_prompt, max_output, seed, policy = params
    rng = random.Random(seed)
    s = vtc.Scheduler(M, wp, wq, policy)
    clients = list(range(len(weights)))
    for c, w in zip(clients, weights):
        s.set_weight(c, w)
    outputs: dict[int, int] = {}
    prompts: dict[int, int] = {}
    waiting = dict.fromkeys(clients, 0)
    owner: dict[int, int] = {}
    rid = 0
    L_input = 0
    # deep enough that one admission round can never drain a client's queue
    depth = M + 2

    def top_up():
        nonlocal rid, L_input
        for c in clients:
            while waiting[c] < depth:
                rid += 1
                p = rng.randint(1, max_prompt)
                L_input = max(L_input, p)
                s.submit(rid, c, p)
                prompts[rid] = p
                outputs[rid] = rng.randint(1, max_output)  # max_new_tokens, reserved
                owner[rid] = c
                waiting[c] += 1

    top_up()
    lo = {(f, g): 0.0 for f in clients for g in clients if f < g}
    hi = dict(lo)
    running: list[int] = []
    generated: dict[int, int] = {}
    reserved = 0
    for _ in range(400):
        while (nxt := s.peek()) is not None and reserved + prompts[nxt] + outputs[nxt] <= M:
            assert s.pop() == nxt
            reserved += prompts[nxt] + outputs[nxt]
            running.append(nxt)
            generated[nxt] = 0
            waiting[owner[nxt]] -= 1
        assert min(waiting.values()) > 0  # every client stayed backlogged
        s.decode(running, 1)
        for r in running:
            generated[r] += 1
        for r in [r for r in running if generated[r] == outputs[r]]:
            s.finish(r)
            running.remove(r)
            reserved -= prompts[r] + outputs[r]
        assert s.occupancy <= M
        top_up()
        W = s.services()
        for f, g in lo:
            d = W[f] - W[g]
            lo[f, g] = min(lo[f, g], d)
            hi[f, g] = max(hi[f, g], d)
    # The bound, for this engine: let f be admitted last at t0, when its counter
    # was the least, c_f <= c_g. Afterwards f is charged its prompt p <= L_input
    # and at most the outputs reserved by its running requests, <= M - p. So
    # c_f(t) - c_g(t) <= G = max over p of wp*p + wq*(M - p)
    #                      = max(wq*M, wp*L_input + wq*(M - L_input)),
    # and D(t) stays in [-G, G]. G is the paper's U = max(wp*L_input, wq*M)
    # whenever wp <= wq (prefill priced at most like decode, as in the paper);
    # with wp > wq hypothesis finds gaps above the paper's 2U (e.g. M=64,
    # wp=2, wq=1, L_input=24: 132 > 128), within 2G = 176.
    # Service is normalised by weight, so the per-client quantum is G / w.
    G = max(wq * M, wp * L_input + wq * (M - L_input)) / min(weights)
    if wp <= wq:
        assert G == max(wp * L_input, wq * M) / min(weights)
    U = G
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
