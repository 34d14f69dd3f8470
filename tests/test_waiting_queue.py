"""``vtc._core.WaitingQueue``, the native half of vLLM's waiting queue, against
:class:`vtc.adapter.Requests`' own answers (no vLLM needed).

A hypothesis state machine drives a small queue shaped as ``vtc.vllm.VTCRequestQueue``
(its ``settle`` admits the pending pop or sets it aside) through every call an
engine makes, in random order: arrivals in several bands, peeks, provisional pops
decided either way at the next call, puts back, preemptions, releases (of the
pending pop too) and charges, inside and outside a scheduling pass, with the
locality window on or off. After each native answer it must equal the Python
table's: ``bool`` and ``len`` its ``num_waiting()`` (and the core's), ``peek_request``
and ``pop_request`` the request of its ``head()``, each once the pending pop is
settled.
"""

from __future__ import annotations

import gc
import weakref

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import vtc
from helpers import raised
from vtc._core import WaitingQueue
from vtc.adapter import ASIDE, RUNNING, WAITING, Adapter, Requests, engine_core
from vtc.config import EngineConfig

M = 200


class Req:
    """An engine's request: its id and the prefix it holds cached."""

    def __init__(self, rid: str, prompt: int, hit: int) -> None:
        self.rid, self.prompt, self.hit = rid, prompt, hit


class Queue(WaitingQueue):
    """The native half with ``vtc.vllm.VTCRequestQueue``'s settle: the pending pop is
    admitted if the engine says so (``admit_next``), else set aside."""

    def __new__(cls, requests: Requests):
        self = super().__new__(cls, requests)
        self.requests = requests
        self.admit_next: int | None = None  # the cached length to admit with, or skip
        self.settled = 0
        return self

    def settle(self) -> None:
        t = self._pending
        if t is None:
            return
        self._pending = None
        self.settled += 1
        if self.admit_next is None:
            self.requests.set_aside(t)
        else:
            self.requests.admit(t, self.admit_next)


class QueueMachine(RuleBasedStateMachine):
    @initialize(quantum=st.sampled_from([0.0, 0.0, 30.0]))
    def start(self, quantum):
        config = EngineConfig(locality_quantum=quantum)
        self.adapter = Adapter(engine_core(config, M), config)
        self.adapter.set_priority_order(1)
        if quantum:
            self.adapter.set_prefix_lookup(lambda req: req.hit)
        self.requests = self.adapter.requests
        self.queue = Queue(self.requests)
        self.serial = 0
        self.passing = None

    def expected_head(self):
        """The Python table's answer, once the pending pop is settled as the native
        call settles it."""
        self.queue.settle()
        return self.requests.head()

    @rule(
        tenant=st.sampled_from("abc"),
        prompt=st.integers(1, 40),
        hit=st.integers(0, 40),
        band=st.sampled_from([0, 0, 1, -1]),
    )
    def arrive(self, tenant, prompt, hit, band):
        self.serial += 1
        key = f"r{self.serial}"
        self.queue.settle()  # (vLLM's add_request settles first)
        self.requests.submit(key, Req(key, prompt, hit), tenant, prompt, band)

    @rule()
    def ask_bool_and_len(self):
        pending = self.queue._pending is not None
        settled = self.queue.settled
        got_bool, got_len = bool(self.queue), len(self.queue)
        assert self.queue._pending is None and self.queue.settled == settled + pending
        assert got_len == self.requests.num_waiting() == self.requests.core.num_waiting
        assert got_bool == (got_len > 0)

    @rule()
    def peek(self):
        if self.passing is None:
            # outside a pass the table asks its core each time: compare after
            try:
                got = self.queue.peek_request()
            except IndexError as e:
                assert str(e) == "peek from an empty VTC queue"
                got = None
            t = self.requests.head()
        else:
            t = self.expected_head()
            try:
                got = self.queue.peek_request()
            except IndexError:
                got = None
        assert got is (None if t is None else t.request)

    @rule(admit=st.booleans(), cached=st.integers(0, 45))
    def pop(self, admit, cached):
        t = self.expected_head()
        if t is None:
            with pytest.raises(IndexError, match="pop from an empty VTC queue"):
                self.queue.pop_request()
            assert self.queue._pending is None
            return
        assert self.queue.pop_request() is t.request
        assert self.queue._pending is t
        self.queue.admit_next = cached if admit else None

    @precondition(lambda self: len(self.requests) > 0)
    @rule(data=st.data())
    def put_back(self, data):
        self.queue.settle()
        keys = sorted(t.key for t in self.requests)
        key = data.draw(st.sampled_from(keys))
        self.requests.put_back(self.requests.get(key))

    @precondition(lambda self: len(self.requests) > 0)
    @rule(data=st.data(), finished=st.booleans())
    def release(self, data, finished):
        # (no settle: vLLM's finish_requests settles, but an abort of the pending pop
        # must leave the queue with nothing pending, as VTCRequestQueue.forget does)
        keys = sorted(t.key for t in self.requests)
        key = data.draw(st.sampled_from(keys))
        if self.queue._pending is self.requests.release(key, finished):
            self.queue._pending = None

    @rule(tokens=st.integers(1, 3))
    def charge(self, tokens):
        self.queue.settle()
        tracked = list(self.requests)
        states = self.requests.statuses(tracked)
        self.requests.charge((t, tokens) for t, s in zip(tracked, states) if s == RUNNING)

    @precondition(lambda self: self.passing is None)
    @rule()
    def enter_pass(self):
        self.passing = self.adapter.selecting()
        self.passing.__enter__()

    @precondition(lambda self: self.passing is not None)
    @rule()
    def leave_pass(self):
        self.queue.settle()
        self.passing.__exit__(None, None, None)
        self.passing = None

    @invariant()
    def states_are_the_tables(self):
        states = self.requests.statuses(list(self.requests))
        assert set(states) <= {WAITING, RUNNING, ASIDE}
        assert self.requests.num_waiting() == self.requests.core.num_waiting

    def teardown(self):
        if getattr(self, "passing", None) is not None:
            self.passing.__exit__(None, None, None)


QueueMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_the_native_queue_answers_as_the_table = QueueMachine.TestCase


def queue_of(M: int = 100) -> tuple[Queue, Requests]:
    requests = Requests(vtc.Scheduler(M=M))
    return Queue(requests), requests


def test_an_empty_queue_says_so_and_raises_index_errors() -> None:
    q, _ = queue_of()
    assert (bool(q), len(q), q._pending) == (False, 0, None)
    with pytest.raises(IndexError, match="peek from an empty VTC queue"):
        q.peek_request()
    with pytest.raises(IndexError, match="pop from an empty VTC queue"):
        q.pop_request()
    assert q._pending is None


def test_a_pending_pop_is_settled_before_each_answer() -> None:
    q, requests = queue_of()
    a = requests.submit("a", Req("a", 10, 0), "x", 10)
    b = requests.submit("b", Req("b", 10, 0), "y", 10)
    for ask in (bool, len, WaitingQueue.peek_request, WaitingQueue.pop_request):
        q._pending = None
        assert q.peek_request() is a.request
        assert q.pop_request() is a.request and q._pending is a
        q.admit_next = None  # skipped: set aside, b comes next
        before = q.settled
        answer = ask(q)
        assert q.settled == before + 1 and requests.status(a) == ASIDE
        # answered after the settle: b is the only request waiting now
        assert answer == {bool: True, len: 1}.get(ask, b.request)
        assert q._pending is (b if ask is WaitingQueue.pop_request else None)
        requests.put_back(a)
    assert requests.status(b) == WAITING


def test_a_settle_that_raises_leaves_the_pop_pending_and_the_error_raised() -> None:
    class Failing(Queue):
        def settle(self) -> None:
            raise RuntimeError("engine state unreadable")

    requests = Requests(vtc.Scheduler(M=100))
    q = Failing(requests)
    t = requests.submit("a", Req("a", 10, 0), "x", 10)
    assert q.pop_request() is t.request
    for ask in (bool, len, WaitingQueue.peek_request, WaitingQueue.pop_request):
        with pytest.raises(RuntimeError, match="unreadable"):
            ask(q)
        assert q._pending is t  # nothing decided, nothing lost


def test_a_core_id_without_a_record_is_a_key_error_naming_it() -> None:
    core = vtc.Scheduler(M=100)
    q = Queue.__new__(Queue, Requests(core))
    core.submit(7, "x", 5)  # (behind the table's back)
    with pytest.raises(KeyError, match="7"):
        q.peek_request()
    assert (len(q), q._pending) == (1, None)


def test_the_arguments_are_checked() -> None:
    class Table:
        def __init__(self, core, by_rid) -> None:
            self.core, self._by_rid = core, by_rid

    with pytest.raises(AttributeError, match="core"):
        WaitingQueue(object())
    with pytest.raises(TypeError, match="requests.core must be a vtc.Scheduler, got <class 'str'>"):
        WaitingQueue(Table("core", {}))
    with pytest.raises(TypeError, match="requests._by_rid must be a dict, got <class 'list'>"):
        WaitingQueue(Table(vtc.Scheduler(M=10), []))
    q = WaitingQueue(Table(vtc.Scheduler(M=10), {}))
    with pytest.raises(AttributeError):
        del q._pending


def test_a_cycle_through_the_pending_pop_is_collected() -> None:
    q, requests = queue_of()
    req = Req("a", 10, 0)
    requests.submit("a", req, "x", 10)
    q.pop_request()
    req.queue = q  # request -> queue -> pending record -> request
    dead = weakref.ref(q)
    del q, requests, req
    gc.collect()
    assert dead() is None


def test_the_locality_window_orders_the_native_peek_as_the_table() -> None:
    config = EngineConfig(locality_quantum=50.0)
    ad = Adapter(engine_core(config, 10_000), config)
    ad.set_prefix_lookup(lambda req: req.hit)
    q = Queue(ad.requests)
    ad.enqueue("a", Req("a", 40, 0), ("a",), 40)
    tb = ad.enqueue("b", Req("b", 40, 32), ("b",), 40)
    with ad.selecting():
        assert q.peek_request() is tb.request  # cached head first, as head() says
        assert q.pop_request() is tb.request and ad.requests.head() is tb
        q.admit_next = 32
        assert len(q) == 1 and ad.core.counters() == {"a": 0.0, "b": 8.0}


# -- record_outputs: a step's charge and finishes, against Requests' own -------------


class Out:
    """One request's output in a step (vLLM's ``EngineCoreOutput``)."""

    def __init__(self, request_id, n: int, finished: bool = False) -> None:
        self.request_id = request_id
        self.new_token_ids = list(range(n))
        self.finish_reason = "stop" if finished else None


class Group:
    """A step's outputs for one API-server client (vLLM's ``EngineCoreOutputs``)."""

    def __init__(self, outputs: list[Out]) -> None:
        self.outputs = outputs


class Done:
    """An engine request that says whether it finished (vLLM's ``is_finished()``)."""

    def __init__(self, key: str, finished: bool = True) -> None:
        self.key, self.finished = key, finished

    def is_finished(self) -> bool:
        return self.finished


class Shell(Queue):
    """:class:`Queue` with ``vtc.vllm.VTCRequestQueue``'s ``release_finished``."""

    def release_finished(self, finished) -> None:
        released = self.requests.release_finished(finished, lambda r: r.is_finished())
        if self._pending is not None and self._pending in released:
            self._pending = None


class Tokens(vtc.adapter.Observer):
    def __init__(self) -> None:
        self.got: list[tuple[str, int]] = []

    def charged(self, produced) -> None:
        self.got.extend((t.key, n) for t, n in produced)


def twin_tables(observed: bool):
    """Two tables over two cores with the same requests: 6 running (2 per tenant),
    2 waiting, one of which never finishes (a resumable request's turn)."""
    tables = []
    for _ in range(2):
        tally = Tokens()
        ad = Adapter(vtc.Scheduler(M=10_000), EngineConfig(), observers=[tally] if observed else [])
        r = ad.requests
        for i in range(8):
            r.submit(f"k{i}", Done(f"k{i}", finished=i != 3), "abc"[i % 3], 10)
        for _ in range(6):
            r.admit(r.head(), 0)
        tables.append((r, tally))
    return tables


@settings(max_examples=300, deadline=None)
@given(
    data=st.data(),
    observed=st.booleans(),
    split=st.booleans(),
    finished_given=st.booleans(),
    tokens_given=st.booleans(),
)
def test_record_outputs_charges_and_releases_as_requests_does(
    data, observed, split, finished_given, tokens_given
) -> None:
    (native, tally_n), (python, tally_p) = twin_tables(observed)
    running = [
        k for k, s in zip([t.key for t in native], native.statuses(list(native))) if s == RUNNING
    ]
    # a step: every running request once with one length (uniform), or any keys
    uniform = data.draw(st.booleans())
    if uniform:
        n = data.draw(st.integers(1, 3))
        keys = data.draw(st.permutations(running))
        counts = [n] * len(keys)
    else:
        keys = data.draw(st.lists(st.sampled_from([*running, "k6", "k7", "stranger"]), max_size=8))
        counts = data.draw(st.lists(st.integers(0, 3), min_size=len(keys), max_size=len(keys)))
    ends = data.draw(st.lists(st.booleans(), min_size=len(keys), max_size=len(keys)))
    outs = [Out(k, c, e) for k, c, e in zip(keys, counts, ends)]
    is_running = uniform or (len(set(keys)) == len(keys) and set(keys) <= set(running))
    claim = is_running and data.draw(st.booleans())
    tokens = [o.new_token_ids for o in data.draw(st.permutations(outs))] if tokens_given else None
    finished = (
        set(data.draw(st.lists(st.sampled_from(["k0", "k3", "k5", "k7", "gone"]))))
        if finished_given
        else None
    )
    groups = [Group(outs[:2]), Group(outs[2:])] if split else [Group(outs)]

    q = Shell(native)
    q.pop_request()  # a pending pop (k6, waiting) that a finish may release
    q._pending = native.get("k6")
    changes, uniform_steps = native.changes, native.uniform_steps
    q.record_outputs(groups, finished, claim, tokens)

    # Requests' own: charge_outputs, then release_finished of the finished ids
    before = python.changes
    if outs:
        python.charge_outputs(outs, running=claim, tokens=tokens)
        ids = finished if finished is not None else [o.request_id for o in outs if o.finish_reason]
        if ids:
            python.release_finished(ids, lambda r: r.is_finished())
    assert native.changes - changes == python.changes - before
    assert native.uniform_steps - uniform_steps == python.uniform_steps
    assert sorted(t.key for t in native) == sorted(t.key for t in python)
    assert native.core.counters() == python.core.counters()
    assert native.core.tokens() == python.core.tokens()
    assert sorted(tally_n.got) == sorted(tally_p.got)
    if tally_p.got:
        event("observed a charge")
    assert (q._pending is None) == ("k6" not in {t.key for t in native})


def test_record_outputs_of_no_outputs_does_nothing() -> None:
    (r, _), _ = twin_tables(False)
    q = Shell(r)
    changes = r.changes
    q.record_outputs([])
    q.record_outputs([Group([])], {"k0"})
    q.record_outputs(iter([Group([]), Group([])]))
    assert r.changes == changes and len(r) == 8


def test_a_uniform_step_is_charged_natively_once() -> None:
    (r, _), _ = twin_tables(False)
    q = Shell(r)
    running = [t for t, s in zip(list(r), r.statuses(list(r))) if s == RUNNING]
    outs = [Out(t.key, 2) for t in running]
    before = r.core.tokens()
    q.record_outputs([Group(outs)], set(), True, [o.new_token_ids for o in outs])
    assert r.uniform_steps == 1
    after = r.core.tokens()
    assert {k: after[k][1] - before[k][1] for k in after} == {"a": 4, "b": 4, "c": 4}
    # lists of two lengths: read by id, not uniform
    outs[0].new_token_ids.append(0)
    q.record_outputs([Group(outs)], None, True, [o.new_token_ids for o in outs])
    assert r.uniform_steps == 1
    assert sum(d for _, d in r.core.tokens().values()) == 12 + 13


# -- settle: the pending pop decided by the engine's statuses, natively ---------------

RUN, LOAD = "RUNNING", "WAITING_FOR_REMOTE_KVS"  # (the engine's statuses: any objects)


class EngineReq:
    """An engine request as vLLM's settle reads it."""

    def __init__(self, request_id: str, status: str = "WAITING", computed: int = 0) -> None:
        self.request_id, self.status, self.num_computed_tokens = request_id, status, computed


class Native(WaitingQueue):
    """The native settle (the statuses given), as ``vtc.vllm.VTCRequestQueue`` uses it."""

    def __new__(cls, requests: Requests):
        return super().__new__(cls, requests, RUN, LOAD)


def reference_settle(requests: Requests, t, num_scheduled_tokens) -> None:
    """What ``VTCRequestQueue.settle`` did in Python, for the pop ``t``."""
    request = t.request
    status, computed = request.status, request.num_computed_tokens
    if not (status == RUN or status == LOAD or computed > 0):
        requests.set_aside(t)
        return
    if num_scheduled_tokens is not None and status == RUN:
        computed -= num_scheduled_tokens.get(request.request_id, 0)
    requests.admit(t, computed)


class Schedule(dict):
    """A step's schedule that is a mapping but not a dict's own ``get``."""

    def get(self, key, default=None):
        return super().get(key, default)


@settings(max_examples=300, deadline=None)
@given(
    status=st.sampled_from([RUN, LOAD, "WAITING", "PREEMPTED"]),
    computed=st.integers(0, 15),
    scheduled=st.sampled_from(["none", "has", "other", "mapping"]),
    n=st.integers(0, 15),
    owed=st.integers(0, 3),
)
def test_the_native_settle_decides_as_vllms_did(status, computed, scheduled, n, owed) -> None:
    tables = []
    for _ in range(2):
        r = Requests(vtc.Scheduler(M=1000))
        t = r.submit("a", EngineReq("a", status, computed), "x", 12)
        r.submit("b", EngineReq("b"), "y", 10)
        t.owed = owed
        tables.append((r, t))
    nst = {
        "none": None,
        "has": {"a": n, "b": 1},
        "other": {"b": n},
        "mapping": Schedule(a=n),
    }[scheduled]
    (native, tn), (python, tp) = tables
    q = Native(native)
    assert q.pop_request() is tn.request
    q.settle(nst)
    reference_settle(python, tp, nst)
    assert q._pending is None
    assert native.statuses([tn]) == python.statuses([tp])
    assert native.core.counters() == python.core.counters()
    assert native.core.tokens() == python.core.tokens()
    assert (native.changes, native.num_aside, tn.owed) == (
        python.changes,
        python.num_aside,
        tp.owed,
    )


def test_a_settle_of_nothing_pending_does_nothing() -> None:
    requests = Requests(vtc.Scheduler(M=100))
    for q in (Native(requests), WaitingQueue(requests)):
        changes = requests.changes
        q.settle()
        q.settle({"a": 1})
        assert requests.changes == changes and q._pending is None


def test_a_queue_without_statuses_refuses_to_settle_and_keeps_the_pop() -> None:
    requests = Requests(vtc.Scheduler(M=100))
    t = requests.submit("a", EngineReq("a", RUN, 5), "x", 10)
    q = WaitingQueue(requests)  # (no subclass settle either)
    q._pending = t
    with pytest.raises(NotImplementedError, match="without the engine's running and loading"):
        q.settle()
    with pytest.raises(NotImplementedError):
        len(q)  # (the hot questions settle first)
    assert q._pending is t and requests.status(t) == WAITING


class Admissions(vtc.adapter.Observer):
    def __init__(self) -> None:
        self.got: list[tuple[str, int]] = []

    def admitted(self, t, prompt_tokens) -> None:
        self.got.append((t.key, prompt_tokens))


def one_waiting(requests: Requests, computed=5):
    """``requests`` with one request waiting (running in the engine, ``computed``
    tokens computed), and a native queue over it with that request popped."""
    t = requests.submit("a", EngineReq("a", RUN, computed), "x", 10)
    q = Native(requests)
    assert q.pop_request() is t.request
    return t, q


def test_the_admission_is_native_unless_something_else_must_see_it() -> None:
    calls = []

    def counted(self, t, cached_len):
        calls.append(t.key)
        vtc.adapter.Requests.admit(self, t, cached_len)

    # nothing else: native (an instance's admit replaced after the queue is made is
    # not seen; the table's own method is what the native admission does)
    requests = Requests(vtc.Scheduler(M=100))
    t, q = one_waiting(requests)
    requests.admit = counted.__get__(requests)
    q.settle({"a": 1})
    assert calls == [] and requests.status(t) == RUNNING and t.admissions == 1
    assert requests.core.tokens()["x"][0] == 10 - 4

    # a subclass's admit, or an instance's replaced before: theirs
    class Counted(Requests):
        admit = counted

    for requests in (Counted(vtc.Scheduler(M=100)), Requests(vtc.Scheduler(M=100))):
        if type(requests) is Requests:
            requests.admit = counted.__get__(requests)
        t, q = one_waiting(requests)
        q.settle()
        assert calls.pop() == "a" and requests.status(t) == RUNNING

    # observers (even one added after the queue is made) are told what it charged
    adapter = Adapter(vtc.Scheduler(M=100), EngineConfig())
    t, q = one_waiting(adapter.requests, computed=3)
    seen = Admissions()
    adapter.observers.append(seen)
    q.settle({"a": 1})
    assert seen.got == [("a", 10 - 2)] and t.admissions == 1

    # a cached count that is not an exact int: Requests.admit's own reading of it
    requests = Requests(vtc.Scheduler(M=100))
    t, q = one_waiting(requests, computed=6.9)
    q.settle()
    assert requests.core.tokens()["x"][0] == 10 - 6


def test_a_native_admission_of_a_record_that_is_not_the_head_is_refused() -> None:
    requests = Requests(vtc.Scheduler(M=100))
    a, q = one_waiting(requests)
    b = requests.submit("b", EngineReq("b", RUN, 0), "y", 10)
    q._pending = b  # (a bug in a shell: b is not the core's head)
    with pytest.raises(
        RuntimeError, match=f"VTC core admitted {a.rid}, the engine admitted {b.rid}"
    ):
        q.settle()
    assert q._pending is None and b.admissions == 0
    requests.release("a")  # (the core admitted a, its head)
    requests.release("b")
    q._pending = b  # nothing waits now
    with pytest.raises(RuntimeError, match=f"VTC core admitted None, the engine admitted {b.rid}"):
        q.settle()


def test_a_settle_whose_admission_raises_leaves_nothing_pending() -> None:
    class Refusing(Requests):
        def admit(self, t, cached_len):
            raise RuntimeError("refused")

    requests = Refusing(vtc.Scheduler(M=100))
    t = requests.submit("a", EngineReq("a", RUN, 5), "x", 10)
    q = Native(requests)
    assert q.pop_request() is t.request
    with pytest.raises(RuntimeError, match="refused"):
        bool(q)
    assert q._pending is None and requests.status(t) == WAITING

    class NoStatus:
        request_id = "b"

    t2 = requests.submit("b", NoStatus(), "x", 10)
    q._pending = t2
    with pytest.raises(AttributeError, match="status"):
        q.settle()
    assert q._pending is None and requests.status(t2) == WAITING


# -- scheduled / record_step: the step kept between vLLM's schedule and update --------


class Runner:
    """A model runner's output: the step's sampled token lists."""

    def __init__(self, sampled) -> None:
        self.sampled_token_ids = sampled


class StepOut:
    """A scheduler's output: the step's schedule."""

    def __init__(self, num_scheduled_tokens) -> None:
        self.num_scheduled_tokens = num_scheduled_tokens


class StepShell(Native):
    def release_finished(self, finished) -> None:
        Shell.release_finished(self, finished)  # type: ignore[arg-type]


def running_step(uniform_tokens: int = 1):
    """A table with 6 requests running (and 2 waiting), and a step's outputs from
    every running one, each with ``uniform_tokens`` tokens."""
    (r, _), _ = twin_tables(False)
    running = [t for t, s in zip(list(r), r.statuses(list(r))) if s == RUNNING]
    outs = [Out(t.key, uniform_tokens) for t in running]
    return r, StepShell(r), outs


def test_a_kept_step_is_charged_as_running_once() -> None:
    r, q, outs = running_step(2)
    step = StepOut({o.request_id: 1 for o in outs})
    q.scheduled(step, len(outs))
    q.record_step(step, Runner([o.new_token_ids for o in outs]), {0: Group(outs)}, set())
    assert r.uniform_steps == 1
    # used once: the same update again is read by id
    q.record_step(step, Runner([o.new_token_ids for o in outs]), {0: Group(outs)}, set())
    assert r.uniform_steps == 1
    assert sum(d for _, d in r.core.tokens().values()) == 24


@pytest.mark.parametrize("why", ["count", "other step", "changed", "no lists", "not lists"])
def test_a_step_not_kept_or_changed_is_read_by_id(why) -> None:
    r, q, outs = running_step()
    step = StepOut({})
    q.scheduled(step, len(outs) + (why == "count"))
    sampled = [o.new_token_ids for o in outs]
    runner = Runner(sampled)
    if why == "changed":
        r.submit("late", Done("late"), "a", 5)
    elif why == "no lists":
        runner = object()
    elif why == "not lists":
        runner = Runner([tuple(x) for x in sampled])
    q.record_step(StepOut({}) if why == "other step" else step, runner, {0: Group(outs)}, None)
    # (without the runner's lists the outputs are read: still one uniform charge)
    assert r.uniform_steps == (1 if why in ("no lists", "not lists") else 0)
    assert sum(d for _, d in r.core.tokens().values()) == 6


def test_the_inner_calls_run_the_classs_method_when_a_subclass_defines_one(monkeypatch) -> None:
    """The native queue's inner calls (a pending pop's ``settle`` before an answer, and
    ``scheduled``'s; ``record_step``'s ``record_outputs``; its ``release_finished``) run
    the queue's own method unless its class defines one: that is then called by name,
    found at each call (a wrap added to the class later is called). Whether to is
    asked of the class only: an instance attribute alone is not called, as for a
    special method."""

    class Plain(Native):
        pass

    (r, _), _ = twin_tables(False)
    running = [t for t, s in zip(list(r), r.statuses(list(r))) if s == RUNNING]
    q = Plain(r)
    calls: list[tuple[str, tuple]] = []

    def step(finished: str) -> None:
        outs = [Out(t.key, 1, finished=t.key == finished) for t in running]
        sched = StepOut({o.request_id: 1 for o in outs})
        q.scheduled(sched, len(running))
        groups = {0: Group(outs)}
        q.record_step(sched, Runner([o.new_token_ids for o in outs]), groups, {finished})
        running[:] = [t for t in running if t.key != finished]

    for t in r:
        t.request.status, t.request.num_computed_tokens = "WAITING", 0
    q.release_finished = lambda finished: calls.append(("instance", (finished,)))
    step("k0")  # the native methods: nothing to see, the finish released
    assert r.get("k0") is None and r.uniform_steps == 1 and not calls
    del q.release_finished
    for name in ("settle", "record_outputs", "release_finished"):
        own = getattr(WaitingQueue, name)

        def wrap(self, *args, own=own, name=name):
            calls.append((name, args))
            return own(self, *args)

        monkeypatch.setattr(Plain, name, wrap)
    step("k1")
    (record,) = [args for name, args in calls if name == "record_outputs"]
    assert record[1:] == ({"k1"}, True, record[3]) and record[3] is not None
    assert [args for name, args in calls if name == "release_finished"] == [({"k1"},)]
    assert r.get("k1") is None and r.uniform_steps == 2
    t = r.head()
    t.request.status, t.request.num_computed_tokens = RUN, 0  # (vLLM admits it)
    calls.clear()
    assert q.pop_request() is t.request
    assert bool(q) and calls == [("settle", ())]  # settled first, by the class's
    assert q.pop_request() is r.head().request
    sched = StepOut({})
    q.scheduled(sched, 0)
    assert calls == [("settle", ()), ("settle", (sched.num_scheduled_tokens,))]
    assert r.num_aside == 1  # (the second pop, still WAITING, set aside)


def test_scheduled_settles_the_pending_pop_by_the_steps_schedule() -> None:
    requests = Requests(vtc.Scheduler(M=1000))
    t = requests.submit("a", EngineReq("a", RUN, 12), "x", 20)
    q = Native(requests)
    q.pop_request()
    q.scheduled(StepOut({"a": 5}), 1)  # 12 computed, 5 of them this step: 7 cached
    assert q._pending is None and requests.status(t) == RUNNING
    assert requests.core.tokens() == {"x": (13, 0)}


# -- add_request: an arrival submitted natively ----------------------------------------


class Arrival:
    """A vLLM request as ``add_request`` reads it."""

    def __init__(self, request_id, prompt, priority=0, tenant="x") -> None:
        self.request_id, self.num_prompt_tokens, self.priority = request_id, prompt, priority
        self.tenant = tenant


def tenant_of(request) -> str:
    return request.tenant


class Arrivals(WaitingQueue):
    def __new__(cls, requests: Requests):
        return super().__new__(cls, requests, RUN, LOAD, tenant_of=tenant_of)


def reference_add(requests: Requests, request) -> None:
    """What ``VTCRequestQueue.add_request`` did in Python (nothing pending)."""
    t = requests.get(request.request_id)
    if t is not None:
        requests.put_back(t)
        return
    requests.submit(
        request.request_id, request, tenant_of(request), request.num_prompt_tokens, request.priority
    )


KEYS = ["a", "b", "c", 7, ("t", 1), "a"]


@settings(max_examples=200, deadline=None)
@given(
    arrivals=st.lists(
        st.tuples(
            st.sampled_from(KEYS),
            st.one_of(st.integers(-3, 130), st.just(2.5), st.just(2**70)),
            st.one_of(st.integers(-2, 2), st.just(2**64), st.just(1.5)),
            st.sampled_from(["x", "y", "z"]),
        ),
        max_size=8,
    ),
    observed=st.booleans(),
)
def test_the_native_arrival_submits_as_vllms_did(arrivals, observed) -> None:
    tables, other = [], Arrival("other", 5)
    for _ in range(2):
        seen = Admissions()
        ad = Adapter(vtc.Scheduler(M=100), EngineConfig(), observers=[seen] if observed else [])
        r = ad.requests
        # "c"'s id taken (as by a live request of another key): "c" takes the next
        r._by_rid[vtc.key_id("c")] = r.submit("other", other, "w", 5)
        tables.append((r, Arrivals(r)))
    (native, q), (python, _) = tables
    for key, prompt, priority, tenant in arrivals:
        req = Arrival(key, prompt, priority, tenant)
        assert raised(q.add_request, req) == raised(reference_add, python, req)
    assert native.changes == python.changes
    assert [(t.key, t.rid, t.request, t.tenant, t.prompt_len) for t in native] == [
        (t.key, t.rid, t.request, t.tenant, t.prompt_len) for t in python
    ]
    assert native.overrides == python.overrides
    assert native._by_rid.keys() == python._by_rid.keys()
    assert all(native.get(t.key) is t and native.at(t.rid) is t for t in native)
    assert native.core.active_clients() == python.core.active_clients()
    assert native.core.counters() == python.core.counters()
    assert native.statuses(list(native)) == python.statuses(list(python))
    order = []
    for r in (native, python):
        order.append([])
        while (t := r.head()) is not None and t.key != "other":
            order[-1].append(t.key)
            r.admit(t, 0)
    assert order[0] == order[1]


def test_an_arrival_settles_a_pending_pop_first_and_a_paused_request_is_put_back() -> None:
    requests = Requests(vtc.Scheduler(M=100))
    q = Arrivals(requests)
    q.add_request(a := Arrival("a", 10))
    a.status, a.num_computed_tokens = RUN, 0  # (what settle reads)
    assert q.pop_request() is a
    q.add_request(b := Arrival("b", 10, tenant="y"))
    assert q._pending is None and requests.status(requests.get("a")) == RUNNING
    t = requests.get("b")
    assert (t.key, t.request, t.tenant, t.prompt_len, requests.status(t)) == (
        "b",
        b,
        "y",
        10,
        WAITING,
    )
    b.status, b.num_computed_tokens = "WAITING", 0
    assert q.pop_request() is b
    q.settle()  # skipped: set aside
    assert requests.status(t) == ASIDE
    changes = requests.changes
    q.add_request(b)  # vLLM adds it again: put back, not a new arrival
    assert requests.status(t) == WAITING and requests.get("b") is t
    assert requests.changes != changes and len(requests) == 2


def test_an_arrival_needs_the_tenant_rule_and_a_failed_submit_changes_nothing() -> None:
    requests = Requests(vtc.Scheduler(M=100))
    version = requests.changes
    with pytest.raises(NotImplementedError, match="tenant rule"):
        Native(requests).add_request(Arrival("a", 10))
    assert len(requests) == 0 and requests.core.num_waiting == 0

    def refuse(request):
        raise LookupError(f"no tenant for {request.request_id}")

    q = WaitingQueue(requests, RUN, LOAD, tenant_of=refuse)
    with pytest.raises(LookupError, match="no tenant for a"):
        q.add_request(Arrival("a", 10))
    assert len(requests) == 0 and requests.core.num_waiting == 0
    assert requests.changes == version  # (nothing changed)
    # the core refuses (it holds the id already: a bug outside the table): no record
    q = Arrivals(requests)
    requests.core.submit(vtc.key_id("b"), "x", 5)
    version = requests.changes
    with pytest.raises(vtc.DuplicateRequestError):
        q.add_request(Arrival("b", 10))
    assert len(requests) == 0 and requests.get("b") is None and requests.core.num_waiting == 1
    assert requests.changes == version  # (the core refused: nothing changed)


# -- release_finished: a step's finishes forgotten natively -----------------------------


class Finishing(Done):
    """An engine request settle and is_finished read."""

    def __init__(self, key, finished: bool) -> None:
        super().__init__(key, finished)
        self.request_id, self.status, self.num_computed_tokens = key, RUN, 0


STATES = ["running", "waiting", "aside", "pending"]


@settings(max_examples=200, deadline=None)
@given(
    requests=st.lists(
        st.tuples(st.sampled_from(STATES), st.booleans(), st.booleans()), min_size=1, max_size=7
    ),
    finished=st.lists(st.integers(0, 8), max_size=10),
    as_set=st.booleans(),
    observed=st.booleans(),
)
def test_the_native_finishes_release_as_the_table_does(
    requests, finished, as_set, observed
) -> None:
    """Requests running, waiting, set aside or popped and pending (with str keys or
    int ones, kept in ``overrides``), each finished or not; ``finished`` names some
    (repeated, untracked too), as a set or a list."""
    tables = []
    for _ in range(2):
        seen = Tokens()
        ad = Adapter(vtc.Scheduler(M=1000), EngineConfig(), observers=[seen] if observed else [])
        r, pending = ad.requests, None
        q = Native(r)
        keys = [i if int_key else f"k{i}" for i, (_, _, int_key) in enumerate(requests)]
        # made in phases, each request alone in the queue when it moves on
        phase = {"running": 0, "aside": 1, "pending": 2, "waiting": 3}
        for i in sorted(range(len(requests)), key=lambda i: phase[requests[i][0]]):
            state, done, _ = requests[i]
            t = r.submit(keys[i], Finishing(keys[i], done), "abc"[i % 3], 10)
            if state == "running":
                r.admit(t, 0)
            elif state == "aside":
                r.set_aside(t)
            elif state == "pending" and pending is None:
                assert q.pop_request() is t.request
                pending = t
        tables.append((r, q, keys))
    (native, nq, keys), (python, pq, _) = tables
    names = [keys[i] if i < len(keys) else f"gone{i}" for i in finished]
    names = set(names) if as_set else names
    released = python.release_finished(names, lambda request: request.is_finished())
    if pq._pending is not None and pq._pending in released:
        pq._pending = None
    nq.release_finished(names)
    assert (nq._pending is None) == (pq._pending is None)
    assert native.changes == python.changes
    assert [t.key for t in native] == [t.key for t in python]
    assert native._by_rid.keys() == python._by_rid.keys()
    assert native.overrides == python.overrides and native._aside == python._aside
    assert native.core.counters() == python.core.counters()
    assert native.core.tokens() == python.core.tokens()
    assert native.core.active_clients() == python.core.active_clients()
    for key in keys:
        n, p = native.get(key), python.get(key)
        assert (n is None) == (p is None)
    assert [r.core.num_running for r in (native, python)] == [python.core.num_running] * 2
    if not as_set:
        # distinct: a repeated key released once (no error), and nothing released twice
        assert len(native) == len(python)


def test_the_finishes_are_the_tables_when_its_methods_are_replaced() -> None:
    calls = []

    class Logged(Requests):
        def release_finished(self, keys, done=None):
            keys = list(keys)
            calls.append(keys)
            return super().release_finished(keys, done)

    r = Logged(vtc.Scheduler(M=100))
    a = r.submit("a", Finishing("a", True), "x", 10)
    r.submit("b", Finishing("b", False), "x", 10)
    q = Native(r)
    assert q.pop_request() is a.request
    q._pending = a
    q.release_finished(["a", "b", "c"])
    assert calls == [["a", "b", "c"]]
    assert q._pending is None and r.get("a") is None and r.get("b") is not None


class Asked(Done):
    """An engine request with a ``status``, counting the calls of ``is_finished()``."""

    def __init__(self, key: str, status: object, finished: bool) -> None:
        super().__init__(key, finished)
        self.request_id, self.status, self.num_computed_tokens = key, status, 0
        self.asked = 0

    def is_finished(self) -> bool:
        self.asked += 1
        return self.finished


@pytest.mark.parametrize("observed", [False, True])
def test_a_finished_status_releases_without_asking_the_request(observed: bool) -> None:
    """Made with ``finished`` (the engine's statuses of a finished request): a request
    whose ``status`` is one of them (the same object) is released with no call of its
    ``is_finished()``; any other status (an equal object too) asks it, and its answer
    decides, as without the statuses."""
    stopped, capped = object(), object()
    seen = Tokens()
    ad = Adapter(vtc.Scheduler(M=1000), EngineConfig(), observers=[seen] if observed else [])
    r = ad.requests
    q = WaitingQueue(r, RUN, LOAD, finished=[stopped, capped])
    made = {
        "stopped": Asked("stopped", stopped, False),  # (its answer would keep it)
        "capped": Asked("capped", capped, False),
        "asked-yes": Asked("asked-yes", RUN, True),
        "asked-no": Asked("asked-no", RUN, False),
        "equal": Asked("equal", "FINISHED", False),
    }
    for key, request in made.items():
        r.admit(r.submit(key, request, "x", 10), 0)
    q.release_finished(list(made))
    assert sorted(t.key for t in r) == ["asked-no", "equal"]
    assert {k: m.asked for k, m in made.items()} == {
        "stopped": 0, "capped": 0, "asked-yes": 1, "asked-no": 1, "equal": 1,
    }  # fmt: skip
    # without the statuses every request is asked
    plain = Native(r)
    again = Asked("again", stopped, False)
    r.admit(r.submit("again", again, "x", 10), 0)
    plain.release_finished(["again"])
    assert again.asked == 1 and r.get("again") is not None
    with pytest.raises(TypeError):
        WaitingQueue(r, RUN, LOAD, finished=5)  # (not iterable: refused when made)
