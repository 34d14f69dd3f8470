"""Behaviour of the public Python API: the contract engines and tools drive."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import vtc
from helpers import run_engine, state
from vtc import reference


def test_import_and_defaults():
    s = vtc.Scheduler(M=8192)
    assert (s.M, s.wp, s.wq, s.policy) == (8192, 1.0, 2.0, "vtc")
    assert repr(s) == "Scheduler(M=8192, wp=1.0, wq=2.0, policy='vtc')"
    assert isinstance(vtc.__version__, str) and vtc.__version__.count(".") == 2
    assert (s.occupancy, s.num_waiting, s.num_running) == (0, 0, 0)
    assert s.counter("never-seen") == 0.0 and s.service(12345) == 0.0
    assert s.schedule() == [] and s.peek() is None and s.pop() is None


def test_version_is_single_sourced_from_cargo():
    # One version: the workspace's Cargo.toml; maturin gives it to the package metadata and
    # the extension reports it as vtc.__version__ (env!("CARGO_PKG_VERSION")).
    import importlib.metadata
    import pathlib
    import re

    cargo = pathlib.Path(__file__).resolve().parent.parent / "Cargo.toml"
    section = cargo.read_text().split("[workspace.package]", 1)[1]
    declared = re.search(r'^version = "([^"]+)"', section, re.M).group(1)
    assert vtc.__version__ == declared
    assert importlib.metadata.version("vtc") == declared


def test_prefill_charged_at_admission_and_decode_as_generated():
    s = vtc.Scheduler(M=1000, wp=1.0, wq=2.0)
    s.submit(1, "a", 100)
    assert s.counter("a") == 0.0  # nothing charged while waiting
    assert s.schedule() == [1]
    assert s.counter("a") == 100.0 and s.occupancy == 100
    s.decode()
    s.decode()
    assert s.counter("a") == 104.0 and s.service("a") == 104.0
    assert s.occupancy == 102 and s.generated(1) == 2
    s.finish(1)
    assert s.occupancy == 0 and s.num_running == 0 and s.status(1) is None


def test_least_counter_first_with_fifo_within_client_and_seq_tiebreak():
    s = vtc.Scheduler(M=10_000)
    s.submit(1, "a", 10)
    s.submit(2, "a", 10)
    s.submit(3, "b", 10)
    s.submit(4, "c", 10)
    # all counters 0: ties go to the client whose head was submitted first; after
    # a's first admission a is the most served, so b and c come before a's second.
    assert s.schedule() == [1, 3, 4, 2]


def test_admission_stops_at_first_request_that_does_not_fit():
    s = vtc.Scheduler(M=100)
    s.submit(1, "a", 60)
    s.submit(2, "b", 50)  # does not fit after 1
    s.submit(3, "c", 10)  # would fit, but no skipping
    assert s.schedule() == [1]
    assert s.num_waiting == 2 and s.occupancy == 60


def test_fcfs_is_global_submit_order_and_lcf_has_no_lift():
    f = vtc.Scheduler(M=10_000, policy="fcfs")
    for rid, c in enumerate(["a", "a", "b", "a", "c"]):
        f.submit(rid, c, 5)
    assert f.schedule() == [0, 1, 2, 3, 4]

    for policy, expected_b in (("vtc", 500.0), ("lcf", 0.0)):
        s = vtc.Scheduler(M=10_000, policy=policy)
        s.submit(1, "a", 500)
        s.schedule()
        s.submit(2, "a", 500)  # a is backlogged with counter 500
        s.submit(3, "b", 10)  # b returns: lifted to 500 under vtc only
        assert s.counter("b") == expected_b


def test_weights_divide_every_charge():
    s = vtc.Scheduler(M=10_000, wp=1.0, wq=2.0)
    s.set_weight("gold", 4.0)
    assert s.weight("gold") == 4.0 and s.weight("other") == 1.0
    s.submit(1, "gold", 400)
    s.submit(2, "other", 400)
    s.schedule()
    s.decode(np.array([1, 2]), np.array([10, 10]))
    assert s.counter("gold") == pytest.approx((400 + 20) / 4)
    assert s.counter("other") == pytest.approx(420)


def test_idle_client_does_not_monopolize_after_returning():
    """The ``returning`` experiment (docs/simulation.md, table 2), in miniature.

    a and b are both overloaded; a goes quiet for a long time and comes back.
    Under VTC a is placed at the floor of the active clients and then shares
    the machine about evenly; without the lift (lcf) a's stale counter is a
    bank of credit and it takes nearly everything.
    """
    results = {}
    for policy in ("vtc", "lcf"):
        s = vtc.Scheduler(M=400, wp=1.0, wq=2.0, policy=policy)
        outputs = {}
        rid = 0

        def submit(client, n, s=s, outputs=outputs):
            nonlocal rid
            for _ in range(n):
                rid += 1
                s.submit(rid, client, 20)
                outputs[rid] = 10

        submit("a", 5)
        submit("b", 5000)
        run_engine(s, 20, outputs)
        # a's 5 requests are done: a is idle while b keeps the machine busy.
        run_engine(s, 1000, outputs)
        assert s.service("b") > 20 * s.service("a")
        b_counter = s.counter("b")
        submit("a", 2000)  # a returns, overloaded
        if policy == "vtc":
            # placed at the minimum counter of the backlogged clients: b's
            assert s.counter("a") == b_counter
        before = {c: s.service(c) for c in ("a", "b")}
        run_engine(s, 300, outputs)
        assert s.num_waiting > 1000  # both stayed backlogged throughout
        got = {c: s.service(c) - before[c] for c in ("a", "b")}
        results[policy] = got["a"] / (got["a"] + got["b"])
    assert 0.40 <= results["vtc"] <= 0.60, results
    assert results["lcf"] > 0.95, results


def test_peek_pop_engine_mode_has_no_kv_check():
    s = vtc.Scheduler(M=100)
    s.submit(1, "a", 80)
    s.submit(2, "b", 80)
    assert s.peek() == 1
    assert s.pop() == 1
    assert s.peek() == 2 and s.schedule() == []  # schedule() respects M
    assert s.pop() == 2  # pop() does not
    assert s.occupancy == 160


def test_prefix_cache_hits_are_not_charged_but_hold_kv():
    s = vtc.Scheduler(M=1000, wp=1.0, wq=2.0)
    s.submit(1, "a", 300, cached_len=200)
    s.submit(2, "b", 300)
    s.submit(3, "c", 300)
    assert s.schedule() == [1, 2, 3]
    assert s.counters() == {"a": 100.0, "b": 300.0, "c": 300.0}
    assert s.occupancy == 900  # the cached prefix still occupies the KV budget
    # engine mode: the hit is known at admission
    s.submit(4, "d", 50)
    assert s.pop(cached_len=50) == 4
    assert s.service("d") == 0.0  # (its counter was lifted to the floor at submit)
    s.submit(5, "d", 50)
    before = state(s, [5])
    with pytest.raises(
        vtc.InvalidArgumentError, match="cached_len must be between 0 and prompt_len=50, got 51"
    ):
        s.pop(cached_len=51)
    assert state(s, [5]) == before
    with pytest.raises(ValueError, match="got -1"):
        s.submit(6, "e", 10, cached_len=-1)


def test_preempt_returns_to_head_without_charging_again():
    s = vtc.Scheduler(M=1000, wp=1.0, wq=1.0)
    s.submit(1, "a", 100)
    s.submit(2, "a", 100)
    s.schedule()
    s.decode([1, 2], [5, 5])
    assert s.counter("a") == 210
    s.preempt(2)
    assert s.status(2) == "waiting" and s.occupancy == 105
    assert s.peek() == 2
    assert s.schedule() == [2]
    assert s.counter("a") == 210  # prompt not charged again
    assert s.occupancy == 210  # footprint on re-admission is prompt + generated


def test_decode_preempts_latest_admitted_when_batch_would_outgrow_M():
    s = vtc.Scheduler(M=30)
    for rid in range(3):
        s.submit(rid, rid, 10)
    assert s.schedule() == [0, 1, 2]
    assert s.occupancy == 30
    assert s.decode() == [2]  # 30 + 3 > 30: the latest admission goes back
    assert s.running() == [0, 1] and s.occupancy == 22
    assert s.status(2) == "waiting"


def test_capacity_error_when_lone_request_cannot_grow():
    s = vtc.Scheduler(M=10)
    s.submit(1, "a", 10)
    s.schedule()
    before = state(s, [1])
    with pytest.raises(vtc.CapacityError, match="request 1 holds 10 tokens"):
        s.decode()
    assert state(s, [1]) == before


def test_cancel_waiting_and_running():
    s = vtc.Scheduler(M=100)
    s.submit(1, "a", 50)
    s.submit(2, "a", 50)
    s.submit(3, "a", 50)
    assert s.schedule() == [1, 2]
    s.cancel(3)  # waiting
    s.cancel(1)  # running (an abort)
    assert s.occupancy == 50 and s.running() == [2] and s.num_waiting == 0
    assert s.status(1) is None and s.status(3) is None
    s.submit(3, "a", 10)  # a cancelled id may be reused
    assert s.status(3) == "waiting"


BAD_CALLS = [
    ("submit", (10, "a", 0), vtc.InvalidArgumentError, "prompt_len must be >= 1, got 0"),
    ("submit", (10, "a", -4), ValueError, "-4"),
    ("submit", (10, "a", 101), ValueError, "prompt_len 101 exceeds the KV budget M=100"),
    ("submit", (1, "b", 5), vtc.DuplicateRequestError, "request 1 is already live"),
    ("submit", (2, "b", 5), ValueError, "request 2 is already live"),
    ("submit", (-1, "b", 5), ValueError, "-1"),
    ("submit", (10, 1.5, 5), TypeError, "1.5"),
    ("submit", (10, None, 5), TypeError, "None"),
    ("submit", (10, "a", "5"), TypeError, "'5'"),
    ("submit", (10, "a", 2.0), TypeError, "2.0"),
    ("finish", (77,), KeyError, "unknown request 77"),
    ("finish", (2,), vtc.RequestStateError, "cannot finish request 2: it is waiting"),
    ("cancel", (77,), vtc.UnknownRequestError, "77"),
    ("preempt", (2,), vtc.RequestStateError, "2"),
    (
        "set_weight",
        ("a", 0.0),
        ValueError,
        "weight must be a finite number in [1e-6, 1e6], got 0.0",
    ),
    ("set_weight", ("new", -1), ValueError, "-1"),
    ("set_weight", ("a", float("nan")), ValueError, "NaN"),
    ("set_weight", ("a", float("inf")), ValueError, "inf"),
    ("set_weight", ("a", "heavy"), TypeError, "heavy"),
    ("decode", ([1], [-1]), ValueError, "tokens must be >= 0, got -1"),
    ("decode", ([1, 2], [1, 1]), vtc.RequestStateError, "cannot decode request 2"),
    ("decode", ([1, 1], [1, 1]), ValueError, "request 1 appears twice"),
    ("decode", ([1], [1, 2]), ValueError, "differ in length: 1 != 2"),
    ("decode", ([1, 99], 1), KeyError, "99"),
    ("decode", (np.zeros((2, 2), dtype=np.int64), 1), TypeError, "1-d integer array"),
]


@pytest.mark.parametrize("op,args,exc,msg", BAD_CALLS, ids=[f"{b[0]}{b[1]!r}" for b in BAD_CALLS])
def test_bad_input_raises_and_leaves_state_untouched(op, args, exc, msg):
    s = vtc.Scheduler(M=100)
    s.set_weight("a", 2.0)
    s.submit(1, "a", 40)
    s.schedule()
    s.decode()
    s.submit(2, "a", 70)  # waiting: does not fit
    before = state(s, [1, 2, 10])
    clients_before = s.num_clients
    with pytest.raises(exc) as info:
        getattr(s, op)(*args)
    assert isinstance(info.value, (vtc.SchedulerError, TypeError))
    assert msg in str(info.value)
    assert state(s, [1, 2, 10]) == before
    assert s.num_clients == clients_before
    s._check_invariants()


@pytest.mark.parametrize(
    "kwargs,exc,msg",
    [
        ({"M": 0}, vtc.InvalidArgumentError, "M must be"),
        ({"M": -5}, ValueError, "-5"),
        ({"M": 10, "policy": "wfq"}, ValueError, 'unknown policy "wfq"'),
        ({"M": 10, "wp": -1.0}, ValueError, "wp must be a finite number in [0, 1e9], got -1"),
        ({"M": 10, "wq": float("nan")}, ValueError, "wq"),
        ({"M": "big"}, TypeError, "'big'"),
        ({"M": 10, "policy": 3}, TypeError, "policy must be a str"),
    ],
)
def test_bad_constructor_arguments(kwargs, exc, msg):
    with pytest.raises(exc, match=None) as info:
        vtc.Scheduler(**kwargs)
    assert msg in str(info.value)


def test_client_keys_int_and_str_are_distinct():
    s = vtc.Scheduler(M=1000)
    s.submit(1, 1, 10)
    s.submit(2, "1", 20)
    s.schedule()
    assert s.counters() == {1: 10.0, "1": 20.0}
    assert s.clients() == [1, "1"]


def test_numpy_integer_arguments_are_accepted():
    s = vtc.Scheduler(M=np.int64(1000))
    s.submit(np.int64(5), "a", np.int32(10))
    assert s.schedule() == [5]


@pytest.mark.parametrize(
    "as_array",
    [
        lambda ids: np.asarray(ids, dtype=np.uint64),
        lambda ids: np.asarray(ids, dtype=np.int64),
        lambda ids: np.asarray(ids, dtype=np.int32),
        lambda ids: np.repeat(np.asarray(ids, dtype=np.int64), 2)[::2],  # strided view
        list,
    ],
    ids=["uint64", "int64", "int32", "strided", "list"],
)
def test_decode_batch_arguments_of_every_form_charge_the_same(as_array):
    def run(ids_form, tokens_form):
        s = vtc.Scheduler(M=100_000)
        for rid in range(300):
            s.submit(rid, rid % 7, 10)
        s.schedule()
        ids = list(range(0, 300, 2))
        s.decode(ids_form(ids))
        s.decode(ids_form(ids), tokens_form([1 + i % 3 for i in range(len(ids))]))
        return s.counters(), [s.generated(r) for r in range(300)]

    assert run(as_array, as_array) == run(list, list)


def test_decode_rejects_a_bad_value_in_an_array_and_changes_nothing():
    s = vtc.Scheduler(M=100_000)
    for rid in range(200):
        s.submit(rid, rid % 5, 10)
    s.schedule()
    before = s.counters()
    ids = np.arange(200, dtype=np.int64)
    ids[150] = -3
    with pytest.raises(vtc.InvalidArgumentError, match="got -3"):
        s.decode(ids)
    tokens = np.ones(200, dtype=np.int64)
    tokens[7] = -2
    with pytest.raises(vtc.InvalidArgumentError, match="-2"):
        s.decode(np.arange(200, dtype=np.uint64), tokens)
    with pytest.raises(vtc.InvalidArgumentError, match="appears twice"):
        s.decode(np.array([1, 2, 1], dtype=np.uint64))
    assert s.counters() == before
    assert all(s.generated(r) == 0 for r in range(200))
    s.decode(np.arange(200, dtype=np.uint64))  # still usable
    assert s.counters() != before


def test_threads_submitting_while_engine_schedules():
    s = vtc.Scheduler(M=5_000)
    n_threads, per_thread = 4, 2_000
    done = threading.Event()

    def api(t):
        for i in range(per_thread):
            s.submit(t * per_thread + i, f"tenant-{t}", 1 + i % 20)

    def engine():
        finished = 0
        while not done.is_set() or s.num_waiting or s.num_running:
            s.schedule()
            if s.num_running:
                s.decode()
                for rid in s.running()[:8]:
                    s.finish(rid)
                    finished += 1
        results.append(finished)

    results: list[int] = []
    threads = [threading.Thread(target=api, args=(t,)) for t in range(n_threads)]
    eng = threading.Thread(target=engine)
    eng.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    eng.join(timeout=120)
    assert not eng.is_alive()
    assert results == [n_threads * per_thread]  # nothing lost or duplicated
    s._check_invariants()


# -- set aside and put back (issue 26, step 2) -----------------------------------------


@pytest.mark.parametrize("cls", [vtc.Scheduler, reference.Scheduler])
def test_a_request_set_aside_and_put_back_changes_no_counter(cls):
    """An engine pops a request, skips it and puts it back: no charge, no lift,
    same place; admitted for real later, it is charged once."""
    s = cls(1000, wp=1.0, wq=2.0)
    s.submit(1, "a", 10)
    s.submit(2, "b", 20)
    s.schedule()  # counters a 10, b 20
    s.submit(3, "a", 40)  # a returns, lifted to the floor (b last left: 20)
    s.submit(4, "b", 50)
    s.raise_counter("b", 100.0)
    before = s.counters()
    assert s.peek() == 3
    assert s.set_aside() == 3  # a has nothing else waiting: it leaves the backlog
    assert s.status(3) == "aside"
    assert (s.num_waiting, s.num_running, s.occupancy) == (1, 2, 30)
    assert s.peek() == 4
    s.submit(5, "c", 5)  # a tenant arriving meanwhile is lifted as usual (to b's 100)
    s.put_back(3)
    assert s.status(3) == "waiting"
    assert {k: v for k, v in s.counters().items() if k != "c"} == before  # a not lifted
    assert s.peek() == 3  # back in its place
    assert s.pop(cached_len=10) == 3  # admitted for real: its prompt minus the hit
    assert s.counter("a") == before["a"] + 30.0


@pytest.mark.parametrize("cls", [vtc.Scheduler, reference.Scheduler])
def test_put_back_restores_order_and_checks_state(cls):
    s = cls(1000)
    for rid in (1, 2, 3):
        s.submit(rid, "a", 5)
    assert [s.set_aside() for _ in range(2)] == [1, 2]
    with pytest.raises(vtc.RequestStateError, match="cannot finish request 1: it is set aside"):
        s.finish(1)
    for rid in (2, 1):  # latest first: the order is restored
        s.put_back(rid)
    assert [s.pop() for _ in range(3)] == [1, 2, 3]
    assert s.service("a") == 15.0
    with pytest.raises(vtc.RequestStateError, match="put back request 1: it is running"):
        s.put_back(1)
    s.submit(9, "a", 5)
    with pytest.raises(vtc.RequestStateError, match="put back request 9: it is waiting"):
        s.put_back(9)
    with pytest.raises(vtc.UnknownRequestError):
        s.put_back(77)
    assert s.set_aside() == 9
    s.cancel(9)  # a request set aside can be dropped
    assert s.status(9) is None and s.set_aside() is None
    assert s.num_waiting == 0


# -- many states in one call (issue 26, step 3) ----------------------------------------


@pytest.mark.parametrize("cls", [vtc.Scheduler, reference.Scheduler])
def test_statuses_answers_many_ids_at_once(cls):
    s = cls(100)
    for rid in (1, 2, 3, 4, 5):
        s.submit(rid, "a" if rid % 2 else "b", 10)
    assert s.pop() == 1
    assert s.set_aside() == 2
    assert s.pop() == 4  # b (0) before a (10)
    s.finish(4)
    s.cancel(5)
    ids = [1, 2, 3, 4, 5, 6, 1]
    want = [s.status(r) for r in ids]
    assert want == ["running", "aside", "waiting", None, None, None, "running"]
    assert s.statuses(ids) == want
    assert s.statuses(tuple(ids)) == want
    assert s.statuses(iter(ids)) == want
    assert s.statuses(np.array(ids, dtype=np.uint16)) == want
    assert s.statuses([]) == [] and s.statuses(np.array([], dtype=np.float64)) == []
    with pytest.raises(vtc.InvalidArgumentError, match="-1"):
        s.statuses([1, -1])
    with pytest.raises(TypeError):
        s.statuses([1, "x"])
    with pytest.raises(TypeError):
        s.statuses(np.zeros((2, 2), dtype=np.int64))
    with pytest.raises(TypeError):
        s.statuses(5)


@pytest.mark.parametrize(
    ("call", "name", "exc", "message"),
    [
        (lambda s: s.submit(1, True, 10), "client", TypeError, "client must be an int or a str"),
        (lambda s: s.submit(1, "a", "x"), "prompt_len", TypeError, "prompt_len must be an int"),
        (
            lambda s: s.submit(-1, "a", 10),
            "request_id",
            vtc.InvalidArgumentError,
            "request_id must be in",
        ),
        (
            lambda s: s.submit(1, "a", 10, 2**70),
            "cached_len",
            vtc.InvalidArgumentError,
            "cached_len",
        ),
        (
            lambda s: s.submit(1, "a", 10, priority=1.5),
            "priority",
            TypeError,
            "priority must be an int",
        ),
        (lambda s: s.set_weight("a", "w"), "weight", TypeError, "weight must be a number"),
        (lambda s: s.raise_counter(2**70, 1.0), "client", vtc.InvalidArgumentError, "does not fit"),
        (
            lambda s: s.decode_all(2**70),
            "tokens",
            vtc.InvalidArgumentError,
            "tokens 1180591620717411303424 exceeds",
        ),
        (lambda s: s.finish("1"), "request_id", TypeError, "request_id must be an int"),
    ],
)
def test_a_bad_argument_keeps_its_message_and_type_and_is_noted_by_name(call, name, exc, message):
    """Arguments are read by the binding's `FromPyObject` shapes (args.rs) before
    the method runs: the error is the reference's (same type, same message) and
    PyO3 notes which argument it was; nothing changes."""
    s = vtc.Scheduler(M=100)
    ref = reference.Scheduler(M=100)
    before = state(s)
    with pytest.raises(exc, match=message) as got:
        call(s)
    assert got.value.__notes__ == [f"while processing '{name}'"]
    with pytest.raises(exc, match=message):
        call(ref)
    assert state(s) == before
