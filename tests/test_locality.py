"""Locality VTC in the reference and the core (issue 19, item 1; docs/locality.md).

A quantum ``Q`` (``locality_quantum``) opens a window over the counters: any
client backlogged in the chosen band whose counter is within ``Q`` of the
least may be served, each offering its first ``LOCALITY_DEPTH`` waiting
requests (only its head once ``LOCALITY_DEPTH - 1`` later ones went before
it), and the request with the longest cached prefix (the engine's
``set_prefix_lookup``) is.  ``Q = 0`` is plain VTC.

Which of its requests a client is served with does not enter the bound below:
it is a bound on counters, and every request's charge after its admission is
within ``G`` whatever its prompt (``L_input`` is the longest prompt).

The bound (docs/locality.md): in the engine model of ``test_properties.py``
(admission reserves each request's whole output, nothing is preempted), two
clients ``f, g`` backlogged over an interval keep
``W_f - W_g`` within ``[-(G / w_g + Q), G / w_f + Q]``, where
``G = max(wq * M, wp * L_input + wq * (M - L_input))`` (the paper's ``U`` when
``wp <= wq``): ``f`` was last admitted with ``c_f <= c_min + Q <= c_g + Q``
and is charged at most ``G / w_f`` after that.  So ``|W_f(t1, t2) -
W_g(t1, t2)| <= 2 * (U / min(w_f, w_g) + Q)``, VTC's ``2U`` at ``Q = 0``.
"""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import vtc
from helpers import state
from vtc import reference

# every rule test runs against the reference and the core (vtc.Scheduler)
IMPLS = pytest.mark.parametrize("Sched", [reference.Scheduler, vtc.Scheduler], ids=["ref", "core"])


def _lookup_from(hits: dict):
    calls = []

    def lookup(rid):
        calls.append(rid)
        return hits.get(rid, 0)

    return lookup, calls


# -- configuration --------------------------------------------------------


@pytest.mark.parametrize("q", [-1, -0.5, math.nan, math.inf, -math.inf])
@IMPLS
def test_a_bad_quantum_is_an_invalid_argument_naming_it(Sched, q):
    with pytest.raises(vtc.InvalidArgumentError, match="locality_quantum") as e:
        Sched(100, locality_quantum=q)
    assert repr(float(q)) in str(e.value)


@pytest.mark.parametrize("q", ["1", None, True, [1]])
@IMPLS
def test_a_quantum_that_is_not_a_number_is_a_type_error(Sched, q):
    with pytest.raises(TypeError, match="locality_quantum"):
        Sched(100, locality_quantum=q)


@IMPLS
def test_the_quantum_needs_a_counter_policy(Sched):
    with pytest.raises(vtc.InvalidArgumentError, match="fcfs"):
        Sched(100, policy="fcfs", locality_quantum=5)
    Sched(100, policy="fcfs", locality_quantum=0)  # plain fcfs
    assert Sched(100, policy="lcf", locality_quantum=5).locality_quantum == 5.0


@IMPLS
def test_the_lookup_must_be_callable(Sched):
    s = Sched(100, locality_quantum=5)
    with pytest.raises(TypeError, match="callable"):
        s.set_prefix_lookup(3)
    s.set_prefix_lookup(None)


BAD_HITS = [(-1, vtc.InvalidArgumentError), (11, vtc.InvalidArgumentError),
            (1.5, TypeError), ("3", TypeError)]  # fmt: skip


@pytest.mark.parametrize("bad, err", BAD_HITS)
@IMPLS
def test_a_bad_hit_is_an_error_naming_the_request(Sched, bad, err):
    s = Sched(100, locality_quantum=50)
    s.submit(1, "a", 10)
    s.submit(2, "b", 10)
    s.set_prefix_lookup(lambda rid: bad if rid == 2 else 0)
    with pytest.raises(err):
        s.peek()
    s.set_prefix_lookup(lambda rid: 10)  # the whole prompt is in range
    assert s.peek() == 1


class _Broken(Exception):
    pass


@pytest.mark.parametrize("bad", [_Broken("cache down"), -1, "3"])
@IMPLS
def test_a_lookup_failing_inside_schedule_loses_no_admitted_request(Sched, bad):
    """The lookup fails at the third selection of one schedule() call: the two
    requests admitted before are returned (an engine that never learns of an
    admission would leave it running forever); the next call, which asks again
    and fails before anything changes, raises; once the lookup answers, it goes on."""
    s = Sched(100, locality_quantum=50)
    for rid, client in enumerate("ababab"):
        s.submit(rid, client, 10)
    failing = {"on": True}
    asked = []

    def lookup(rid):
        asked.append(rid)
        # 6 asks (a's and b's three), then 5 (a's 2 and 4, b's three): the third fails
        if failing["on"] and len(asked) >= 12:
            if isinstance(bad, Exception):
                raise bad
            return bad
        return 0

    s.set_prefix_lookup(lookup)
    assert s.schedule() == [0, 1]
    assert (s.num_running, s.num_waiting, s.occupancy) == (2, 4, 20)
    before = (s.counters(), s.services(), s.running(), s.active_clients())
    with pytest.raises((_Broken, vtc.InvalidArgumentError, TypeError)):
        s.schedule()
    assert (s.counters(), s.services(), s.running(), s.active_clients()) == before
    failing["on"] = False
    assert s.schedule() == [2, 3, 4, 5]


# A lookup that calls back into its own scheduler, run in a child process: were
# such a call to wait for the lock its selection holds, it would wait forever.
_CALLING_BACK = """
import json, vtc
back = {
    "repr": repr,
    "snapshot": lambda s: s.snapshot(),
    "counters": lambda s: s.counters(),
    "num_waiting": lambda s: s.num_waiting,
    "submit": lambda s: s.submit(9, "c", 5),
    "peek": lambda s: s.peek(),
}
other = vtc.Scheduler(1000, locality_quantum=50)
other.submit(1, "x", 10)
other.submit(2, "y", 10)
other.set_prefix_lookup(lambda rid: 0)
seen = {}
for name, call in [*back.items(), ("after another's lookup", lambda s: s.counters())]:
    s = vtc.Scheduler(1000, locality_quantum=50)
    s.submit(1, "a", 10)
    s.submit(2, "b", 10)

    def lookup(rid, s=s, name=name, call=call):
        if name == "after another's lookup" and not other.num_running:
            other.schedule()  # another scheduler, free: it runs (and asks its lookup)
        try:
            call(s)
        except RuntimeError as e:
            seen[name] = str(e)
        return 0

    s.set_prefix_lookup(lookup)
    twin = vtc.Scheduler.from_snapshot(s.snapshot())  # (the same state, no requests)
    twin.submit(1, "a", 10)
    twin.submit(2, "b", 10)
    twin.set_prefix_lookup(lambda rid: 0)
    seen[name + ": admitted"] = s.schedule()
    seen[name + ": as without the call"] = (
        twin.schedule() == seen[name + ": admitted"]
        and (s.counters(), s.services(), s.num_waiting) == (twin.counters(), twin.services(), 0)
    )
seen["other admitted"] = other.running()


class Dying:  # a lookup whose last reference goes as the scheduler replaces it
    def __call__(self, rid):
        return 0

    def __del__(self):
        seen["replaced lookup's finalizer"] = other.num_running


other.set_prefix_lookup(Dying())
other.set_prefix_lookup(None)
print(json.dumps(seen))
"""


def test_a_lookup_calling_back_into_its_scheduler_is_refused_not_deadlocked():
    """Inside a selection's prefix lookup, every call back into the same
    scheduler (``repr`` and ``snapshot`` too, which work even on a poisoned
    one) raises ``RuntimeError`` naming the cause instead of waiting for the
    lock its own selection holds, and changes nothing; the selection goes on
    with the lookup's answer. Another scheduler, not locked, can be called,
    its own lookup included, and the flag survives that nested lookup. A lookup
    replaced by ``set_prefix_lookup`` is dropped once the lock is released, so
    its finalizer may call the scheduler. (The child process turns a deadlock
    into a failure here, not a hung suite.)"""
    import json
    import subprocess
    import sys

    try:
        child = subprocess.run(
            [sys.executable, "-c", _CALLING_BACK], capture_output=True, text=True, timeout=120
        )
    except subprocess.TimeoutExpired:
        pytest.fail("a call waited for a lock its own thread held (deadlock)")
    assert child.returncode == 0, child.stderr
    seen = json.loads(child.stdout)
    for name in [
        "repr",
        "snapshot",
        "counters",
        "num_waiting",
        "submit",
        "peek",
        "after another's lookup",
    ]:
        assert "prefix lookup called back into a scheduler" in seen[name], name
        assert seen[name + ": admitted"] == [1, 2], name
        assert seen[name + ": as without the call"], name
    assert seen["other admitted"] == [1, 2]
    assert seen["replaced lookup's finalizer"] == 2  # (called after the lock was released)


# -- the rule ---------------------------------------------------------------


def _two_clients(Sched, Q, hits):
    """a at counter 0 and b at counter 30, one waiting request each."""
    s = Sched(1000, 1.0, 2.0, locality_quantum=Q)
    s.raise_counter("b", 30)
    s.submit(1, "a", 10)
    s.submit(2, "b", 10)
    lookup, calls = _lookup_from(hits)
    s.set_prefix_lookup(lookup)
    return s, calls


@IMPLS
def test_within_the_window_the_longest_cached_prefix_wins(Sched):
    s, calls = _two_clients(Sched, 30, {1: 0, 2: 8})
    assert s.peek() == 2
    assert sorted(calls) == [1, 2]  # every candidate head, once
    assert s.pop(8) == 2


@IMPLS
def test_outside_the_window_the_least_counter_wins_and_is_not_looked_up(Sched):
    s, calls = _two_clients(Sched, 29.5, {1: 0, 2: 8})
    assert s.peek() == 1
    assert calls == []  # one candidate: nothing to compare


@IMPLS
def test_equal_hits_fall_back_to_the_plain_key(Sched):
    s, _ = _two_clients(Sched, 100, {1: 4, 2: 4})
    assert s.peek() == 1
    s, _ = _two_clients(Sched, 100, {})
    assert s.peek() == 1


@IMPLS
def test_each_client_offers_its_first_requests_not_only_its_head(Sched):
    s = Sched(1000, locality_quantum=100)
    s.submit(1, "a", 10)
    s.submit(2, "a", 10)
    s.submit(3, "b", 10)
    lookup, calls = _lookup_from({2: 9, 3: 1})
    s.set_prefix_lookup(lookup)
    assert s.peek() == 2  # a's second request is a candidate, and the longest hit
    assert calls == [1, 2, 3]  # clients in order, each one's in queue order
    assert s.pop() == 2
    assert s.counter("a") > 0 and s.status(1) == "waiting"


@IMPLS
def test_only_the_first_locality_depth_requests_of_a_client_are_candidates(Sched):
    depth = reference.LOCALITY_DEPTH
    s = Sched(1000, locality_quantum=100)
    for rid in range(1, depth + 3):
        s.submit(rid, "a", 10)
    lookup, calls = _lookup_from({depth + 1: 9, depth + 2: 9})
    s.set_prefix_lookup(lookup)
    assert s.peek() == 1  # the hits lie past the depth; equal hits: queue order
    assert calls == list(range(1, depth + 1))


@IMPLS
def test_a_head_is_overtaken_at_most_depth_minus_one_times(Sched):
    """Later requests hit more: each selection takes the deepest candidate until
    the head has been overtaken LOCALITY_DEPTH - 1 times; then the head goes, and
    the next head starts its own count."""
    d = reference.LOCALITY_DEPTH
    s = Sched(1000, locality_quantum=100)
    for rid in range(1, 2 * d + 1):
        s.submit(rid, "a", 2 * d)
    s.set_prefix_lookup(lambda rid: rid)
    order = [s.pop() for _ in range(2 * d)]
    # d .. 2d-2 overtake 1 (d - 1 of them); 1; then 2d, 2d-1, d-1 .. 3 overtake 2; 2
    assert order == [*range(d, 2 * d - 1), 1, 2 * d, 2 * d - 1, *range(d - 1, 1, -1)]


@IMPLS
def test_a_cancelled_request_is_no_candidate_and_takes_no_place(Sched):
    d = reference.LOCALITY_DEPTH
    s = Sched(1000, locality_quantum=100)
    for rid in range(1, d + 3):
        s.submit(rid, "a", 10)
    s.cancel(2)
    lookup, calls = _lookup_from({d + 1: 9})  # the d-th live request
    s.set_prefix_lookup(lookup)
    assert s.peek() == d + 1
    assert calls == [1, *range(3, d + 2)]


@IMPLS
def test_a_request_set_aside_from_behind_the_head_is_put_back_at_the_head(Sched):
    s = Sched(1000, locality_quantum=100)
    for rid in (1, 2, 3):
        s.submit(rid, "a", 10)
    s.set_prefix_lookup(lambda rid: 9 if rid == 2 else 0)
    assert s.set_aside() == 2
    assert s.num_waiting == 2
    s.put_back(2)
    s.set_prefix_lookup(lambda rid: 0)  # equal hits: queue order, 2 is first now
    assert s.peek() == 2
    assert s.counter("a") == 0


def _recording(hits: dict):
    """A lookup answering from ``hits`` (read at call time), and its calls."""
    calls: list[int] = []

    def lookup(rid):
        calls.append(rid)
        return hits[rid]

    return lookup, calls


def test_overtakes_and_their_limit_run_in_the_core_as_in_the_reference():
    """Random engine calls (submits to a few clients, pops, set-asides put back,
    cancels, decodes, finishes, two bands) with hits that often favour a later
    request, so the window keeps taking from behind the heads and the overtake
    limit binds: the core chooses as the reference, asks the same lookups in the
    same order and ends in the same state."""
    depth = reference.LOCALITY_DEPTH
    limited = behind = 0
    for seed in range(30):
        rng = random.Random(seed)
        Q = rng.choice([5.0, 60.0, 1e6])
        core = vtc.Scheduler(400, locality_quantum=Q)
        ref = reference.Scheduler(400, locality_quantum=Q)
        hit: dict[int, int] = {}
        core_lookup, core_calls = _recording(hit)
        ref_lookup, ref_calls = _recording(hit)
        core.set_prefix_lookup(core_lookup)
        ref.set_prefix_lookup(ref_lookup)
        rid = 0
        aside: list[int] = []
        for _ in range(300):
            op = rng.random()
            if op < 0.4:
                rid += 1
                c, p, band = rng.choice("abc"), rng.randint(10, 30), rng.choice([0, 0, 0, 1])
                hit[rid] = min(rid % 7 + rng.randint(0, 4), 10)
                core.submit(rid, c, p, priority=band)
                ref.submit(rid, c, p, priority=band)
            elif op < 0.6:
                x = ref.pop()
                assert core.pop() == x
                if x is not None:  # an earlier request of its client still waits?
                    owner = ref._requests[x].client
                    behind += any(r.client == owner and r.rid < x and not r.running
                                  and not r.aside for r in ref._requests.values())  # fmt: skip
            elif op < 0.68:
                x = ref.set_aside()
                assert core.set_aside() == x
                if x is not None:
                    aside.append(x)
            elif op < 0.74 and aside:
                x = aside.pop(rng.randrange(len(aside)))
                core.put_back(x)
                ref.put_back(x)
            elif op < 0.78:
                waiting = [r for r in range(1, rid + 1) if ref.status(r) == "waiting"]
                if waiting:
                    x = rng.choice(waiting)
                    core.cancel(x)
                    ref.cancel(x)
            elif op < 0.9:
                running = ref.running()
                core.decode(running, 1)
                ref.decode(running, 1)
            else:
                running = ref.running()
                if running:
                    x = rng.choice(running)
                    core.finish(x)
                    ref.finish(x)
            assert core_calls == ref_calls, seed
            limited += any(n >= depth - 1 for _, n in ref._skips.values())
        core.set_prefix_lookup(None)  # state() peeks: plain VTC while reading
        ref.set_prefix_lookup(None)
        assert state(core, range(1, rid + 1)) == state(ref, range(1, rid + 1)), seed
    assert behind > 50 and limited > 0, (behind, limited)


@IMPLS
def test_zero_quantum_never_calls_the_lookup(Sched):
    s, calls = _two_clients(Sched, 0, {2: 8})
    s.raise_counter("a", 30)  # a tie at the least counter: plain VTC (seq)
    assert s.peek() == 1
    assert calls == []


@IMPLS
def test_strict_bands_keep_working_the_window_is_inside_the_urgent_band(Sched):
    s = Sched(1000, locality_quantum=1000)
    s.submit(1, "a", 10, priority=1)
    s.submit(2, "b", 10, priority=1)
    s.submit(3, "c", 10, priority=0)
    s.submit(4, "d", 10, priority=0)
    s.set_prefix_lookup({1: 9, 2: 9, 3: 0, 4: 5}.get)
    assert s.peek() == 4  # band 0 goes first; in it, d's longer hit
    s.pop(5)
    assert s.peek() == 3
    s.pop()
    assert s.peek() == 1  # then band 1: equal hits, the plain key


@IMPLS
def test_weighted_bands_keep_their_rule_and_the_window_applies_inside(Sched):
    s = Sched(1000, locality_quantum=1000, band_weights={0: 1, 1: 1})
    s.submit(1, "a", 10, priority=0)
    s.submit(4, "a", 10, priority=0)
    s.submit(2, "b", 10, priority=1)
    s.submit(3, "c", 10, priority=1)
    s.set_prefix_lookup({1: 0, 4: 0, 2: 0, 3: 9}.get)
    assert s.peek() == 1  # both band counters 0: priority 0 first, whatever the hits
    s.pop()
    assert s.peek() == 3  # band 1 now has the least band counter; c's hit wins in it


@IMPLS
def test_the_per_client_cap_still_applies(Sched):
    s = Sched(1000, client_cap=15, locality_quantum=1000)
    for rid, c in ((1, "a"), (2, "a"), (3, "b")):
        s.submit(rid, c, 10)
    s.set_prefix_lookup({1: 9, 2: 9, 3: 0}.get)
    assert s.schedule() == [1, 3]  # a's second request is over its cap


# -- Q = 0 (and no lookup) is plain VTC, bit for bit ------------------------


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("mode", ["zero quantum", "no lookup"])
def test_without_a_window_the_reference_is_the_core(seed, mode):
    rng = random.Random(seed)
    M = rng.choice([64, 500])
    core = vtc.Scheduler(M, 1.0, 2.0, "vtc")
    if mode == "zero quantum":
        ref = reference.Scheduler(M, 1.0, 2.0, "vtc", locality_quantum=0.0)
        ref.set_prefix_lookup(lambda rid: pytest.fail("the lookup was called at Q = 0"))
    else:
        ref = reference.Scheduler(M, 1.0, 2.0, "vtc", locality_quantum=M)
    live: list[int] = []
    for rid in range(400):
        op = rng.random()
        if op < 0.45:
            p = rng.randint(1, M // 2)
            args = (rid, rng.randrange(5), p, None, None, rng.choice([0, 0, 1]))
            for s in (core, ref):
                s.submit(*args)
            live.append(rid)
        elif op < 0.65:
            assert core.schedule() == ref.schedule()
        elif op < 0.85:
            try:
                v = core.decode()
            except vtc.CapacityError:
                with pytest.raises(vtc.CapacityError):
                    ref.decode()
                r = core.running()[0]
                core.finish(r)
                ref.finish(r)
            else:
                assert ref.decode() == v
        elif live:
            r = live.pop(rng.randrange(len(live)))
            st_ = core.status(r)
            if st_ == "running":
                core.finish(r)
                ref.finish(r)
            elif st_ is not None:
                core.cancel(r)
                ref.cancel(r)
        assert state(core) == state(ref)


# -- the bound --------------------------------------------------------------


@st.composite
def overload(draw):
    M = draw(st.sampled_from([64, 128, 256, 512]))
    wp = draw(st.sampled_from([1.0, 0.5, 2.0]))
    wq = draw(st.sampled_from([2.0, 1.0, 4.0]))
    n_clients = draw(st.integers(2, 4))
    weights = draw(
        st.lists(st.sampled_from([1.0, 1.0, 2.0, 0.5]), min_size=n_clients, max_size=n_clients)
    )
    max_prompt = draw(st.integers(1, M // 2))
    max_output = draw(st.integers(1, M - max_prompt))
    q_over_u = draw(st.sampled_from([0.0, 0.25, 0.5, 1.0, 2.0, 4.0]))
    hits = draw(st.sampled_from(["random", "favourite", "per request"]))
    period = draw(st.sampled_from([5, 20, 60, 150]))
    seed = draw(st.integers(0, 2**32 - 1))
    policy = draw(st.sampled_from(["vtc", "lcf"]))
    return M, wp, wq, weights, max_prompt, max_output, q_over_u, hits, period, seed, policy


def _run_backlogged(M, wp, wq, weights, max_prompt, max_output, Q, hits, period, seed, policy,
                    steps=300, Sched=reference.Scheduler):  # fmt: skip
    """Every client permanently backlogged, the engine model of test_properties.py
    (peek, pop while the whole reserved output fits, decode(ids, 1)); the engine's
    hits as ``hits`` says. Returns the spread (hi - lo) of W_f - W_g per pair, L_input
    and how many admissions overtook an earlier waiting request of their client."""
    rng = random.Random(seed)
    s = Sched(M, wp, wq, policy, locality_quantum=Q)
    clients = list(range(len(weights)))
    for c, w in zip(clients, weights):
        s.set_weight(c, w)
    prompts: dict[int, int] = {}
    outputs: dict[int, int] = {}
    owner: dict[int, int] = {}
    fixed: dict[int, int] = {}
    waiting = dict.fromkeys(clients, 0)
    queued: dict[int, list[int]] = {c: [] for c in clients}  # waiting rids, submit order
    overtakes = 0
    now: dict[int, int] = {}  # this round's answers: peek and pop must agree
    step = [0]

    def lookup(rid):
        if hits == "per request":
            return fixed[rid]
        if hits == "favourite":  # one client's prefixes are cached, in turn
            fav = clients[(step[0] // period) % len(clients)]
            return prompts[rid] if owner[rid] == fav else 0
        if rid not in now:
            now[rid] = rng.randint(0, prompts[rid])
        return now[rid]

    s.set_prefix_lookup(lookup)
    rid = 0
    L_input = 0
    depth = M + 2  # one admission round can never drain a client's queue

    def top_up():
        nonlocal rid, L_input
        for c in clients:
            while waiting[c] < depth:
                rid += 1
                p = rng.randint(1, max_prompt)
                L_input = max(L_input, p)
                s.submit(rid, c, p)
                prompts[rid], outputs[rid], owner[rid] = p, rng.randint(1, max_output), c
                fixed[rid] = rng.randint(0, p)
                waiting[c] += 1
                queued[c].append(rid)

    top_up()
    lo = {(f, g): 0.0 for f in clients for g in clients if f < g}
    hi = dict(lo)
    running: list[int] = []
    generated: dict[int, int] = {}
    reserved = 0
    for step[0] in range(steps):
        now.clear()
        while (nxt := s.peek()) is not None and reserved + prompts[nxt] + outputs[nxt] <= M:
            assert s.pop(lookup(nxt)) == nxt
            reserved += prompts[nxt] + outputs[nxt]
            running.append(nxt)
            generated[nxt] = 0
            waiting[owner[nxt]] -= 1
            overtakes += queued[owner[nxt]][0] != nxt
            queued[owner[nxt]].remove(nxt)
        assert min(waiting.values()) > 0  # every client stayed backlogged
        s.decode(running, 1)
        for r in running:
            generated[r] += 1
        for r in [r for r in running if generated[r] == outputs[r]]:
            s.finish(r)
            running.remove(r)
            reserved -= prompts[r] + outputs[r]
        top_up()
        W = s.services()
        assert W == s.counters()  # no lift, no credit: service is the counter
        for f, g in lo:
            d = W[f] - W[g]
            lo[f, g] = min(lo[f, g], d)
            hi[f, g] = max(hi[f, g], d)
    return lo, hi, L_input, overtakes


def _g(wp, wq, M, L_input):
    """The charge a client can take after its last admission (test_properties.py):
    the paper's U = max(wp * L_input, wq * M) when wp <= wq."""
    return max(wq * M, wp * L_input + wq * (M - L_input))


@IMPLS
@settings(max_examples=120, deadline=None)
@given(overload())
def test_backlogged_clients_stay_within_the_locality_bound(Sched, params):
    """For every pair, W_f - W_g stays in [-(G/w_g + Q), G/w_f + Q] at every step,
    so over any interval |W_f - W_g| <= G/w_f + G/w_g + 2Q <= 2 (U / min w + Q)."""
    M, wp, wq, weights, max_prompt, max_output, q_over_u, hits, period, seed, policy = params
    U = _g(wp, wq, M, max_prompt) / min(weights)
    Q = q_over_u * U
    lo, hi, L_input, overtakes = _run_backlogged(
        M, wp, wq, weights, max_prompt, max_output, Q, hits, period, seed, policy, Sched=Sched
    )
    assert Q > 0 or overtakes == 0  # Q = 0: each client's requests in submit order
    G = _g(wp, wq, M, L_input)
    for (f, g), top in hi.items():
        assert top <= G / weights[f] + Q + 1e-6, ((f, g), top, G / weights[f] + Q)
        assert -lo[f, g] <= G / weights[g] + Q + 1e-6, ((f, g), lo[f, g], G / weights[g] + Q)
        assert top - lo[f, g] <= 2 * (G / min(weights[f], weights[g]) + Q) + 1e-6


@IMPLS
@pytest.mark.parametrize("hits", ["random", "per request"])
def test_the_bound_holds_while_the_window_serves_requests_behind_the_heads(Sched, hits):
    """The bound is on counters, so which of its requests a client is served with
    does not enter it: with many admissions from behind the heads, it still holds."""
    M, wp, wq, weights = 256, 1.0, 2.0, [1.0, 2.0, 0.5]
    U = _g(wp, wq, M, 128) / min(weights)
    for Q in (0.25 * U, U):
        lo, hi, L_input, overtakes = _run_backlogged(
            M, wp, wq, weights, 128, 64, Q, hits, 20, 7, "vtc", steps=400, Sched=Sched
        )
        assert overtakes > 10
        G = _g(wp, wq, M, L_input)
        for (f, g), top in hi.items():
            assert top <= G / weights[f] + Q + 1e-6
            assert -lo[f, g] <= G / weights[g] + Q + 1e-6


@IMPLS
def test_the_quantum_term_is_needed(Sched):
    """A cache that favours each client in turn drives the gap to about 2Q: past
    VTC's 2U, and past 2U + Q too, so the bound needs 2Q and 2 (U + Q) is tight
    in Q. (This engine's G is the paper's U: wp <= wq.)"""
    M, wp, wq = 128, 1.0, 2.0
    U = _g(wp, wq, M, 32)
    spread = {}
    for q_over_u in (0.0, 1.0, 4.0):
        Q = q_over_u * U
        lo, hi, L_input, _ = _run_backlogged(
            M, wp, wq, [1.0, 1.0], 32, 8, Q, "favourite", 400, 1, "vtc", steps=800, Sched=Sched
        )
        assert hi[0, 1] - lo[0, 1] <= 2 * (_g(wp, wq, M, L_input) + Q) + 1e-6
        spread[q_over_u] = hi[0, 1] - lo[0, 1]
    assert spread[0.0] <= 2 * U
    assert spread[1.0] > 2 * U
    assert spread[4.0] > 2 * U + 4 * U


@settings(max_examples=40, deadline=None)
@given(overload())
def test_the_core_runs_the_bound_engine_model_exactly_as_the_reference(params):
    """The engine model above, driven through both: the same spreads, bit for bit."""
    M, wp, wq, weights, max_prompt, max_output, q_over_u, hits, period, seed, policy = params
    Q = q_over_u * _g(wp, wq, M, max_prompt) / min(weights)
    args = (M, wp, wq, weights, max_prompt, max_output, Q, hits, period, seed, policy)
    core = _run_backlogged(*args, steps=150, Sched=vtc.Scheduler)
    assert core == _run_backlogged(*args, steps=150)
