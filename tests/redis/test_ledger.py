"""The shared counters' ledger in the core (``vtc._core.SyncLedger``, issue 15 item 5):
the service folded since the last acknowledged sync, kept by tenant in Rust, and the
push built there as the script's JSON argument. The store must end up exactly where the
Python encoding takes it, for tenant names of every kind (quotes, backslashes, control
characters, non-ASCII, a lone surrogate, ints)."""

from __future__ import annotations

import itertools
import json
import threading

import pytest
from sync_helpers import Recording

import vtc
from vtc import distributed as D
from vtc._core import SyncLedger
from vtc.config import SYNC_CHANGES_READER
from vtc.redis_store import _json_list

_rid = itertools.count(1)

NAMES: list[vtc.Client] = [
    "plain",
    'quo"te',
    "back\\slash",
    "tab\tnew\nline\x00nul\x1f",
    "café ünï",
    "emoji \U0001f600",
    "lone \ud800 surrogate",
    "s:looks-encoded",
    "",
    0,
    -7,
    2**62,
]


def _charged(names=NAMES, tokens: int = 3, attach=None) -> tuple[vtc.Scheduler, dict]:
    """A scheduler where each of ``names`` has one request running (charged its prompt
    and ``tokens`` decoded) and one waiting; ``attach`` is called with it first."""
    s = vtc.Scheduler(1 << 20)
    if attach is not None:
        attach(s)
    running = {}
    for i, c in enumerate(names):
        running[c] = next(_rid)
        s.submit(running[c], c, 10 + i)
    s.schedule()
    for c in names:
        s.submit(next(_rid), c, 5)
    s.decode(list(running.values()), tokens)
    return s, running


def test_the_push_is_what_python_encoded():
    s, _ = _charged()
    ledger = SyncLedger(SYNC_CHANGES_READER)
    ledger.read(s)  # full: every tenant's service is new
    data, n = ledger.push_json()
    assert n == len(NAMES) == len(ledger)
    flat = json.loads(data.decode("utf-8", "surrogatepass"))
    got = dict(zip(flat[::2], map(float, flat[1::2])))
    want = {D.encode(c): s.service(c) for c in NAMES}
    assert got == want
    assert ledger.pushed() == want
    assert json.loads(_json_list(list(want)).decode("utf-8", "surrogatepass")) == list(want)
    ledger.acknowledge()
    assert ledger.push_json() == (b"[]", 0) and len(ledger) == 0
    ledger.check()


@pytest.mark.parametrize("bad", [None, "1", 1.5, vtc.CHANGE_READERS, -1])
def test_a_bad_reader_or_scheduler_is_refused(bad):
    if isinstance(bad, int) and not isinstance(bad, bool):
        with pytest.raises(vtc.InvalidArgumentError, match="reader"):
            SyncLedger(bad)
        return
    with pytest.raises(TypeError):
        SyncLedger(bad)
    ledger = SyncLedger(SYNC_CHANGES_READER)
    with pytest.raises(TypeError, match="scheduler"):
        ledger.read(bad)
    with pytest.raises(TypeError, match="client"):
        ledger.unacked_of(1.5)
    ledger.check()


def _replica(server, ns: str, rid: str, wrapped: bool) -> D.SharedCounters:
    store = D.RedisStore.from_url(server.url, ns, timeout_ms=2000)
    return D.SharedCounters(Recording(store) if wrapped else store, replica_id=rid, retry_ms=0)


def test_every_kind_of_name_syncs_as_the_python_encoding_does(redis_server):
    """The same charges pushed through the core's JSON (a RedisStore itself) and through
    Python's encoding (a wrapper without ``takes_json``), each in its own namespace:
    the same counters in both; a second replica pulls each counter back for the tenant
    it belongs to."""
    counters = {}
    for ns, wrapped in (("json", False), ("python", True)):
        sh = _replica(redis_server, ns, "r0", wrapped)
        s, running = _charged(attach=sh.attach)
        assert sh.sync(s, D.CORE_WAITING), sh.stats
        assert getattr(sh.store, "takes_json", False) is not wrapped
        s.decode(list(running.values()), 2)  # more, pushed by the next sync
        assert sh.sync(s, D.CORE_WAITING)
        assert sh.stats.pushed_tenants == 2 * len(NAMES)
        counters[ns] = sh.store.counters()
        assert set(counters[ns]) == set(NAMES)  # each under its own name
        assert all(counters[ns][c] >= s.service(c) > 0 for c in NAMES)

        # a second replica with the same tenants waiting: each rises to its counter
        s1 = vtc.Scheduler(1 << 20)
        for c in NAMES:
            s1.submit(next(_rid), c, 5)
        other = _replica(redis_server, ns, "r1", wrapped)
        assert other.sync(s1, D.CORE_WAITING) and other.sync(s1, D.CORE_WAITING)
        for c in NAMES:
            assert s1.counter(c) == counters[ns][c], c
        assert set(s1.active_clients()) == set(NAMES)  # no tenant made up from a key
    assert counters["json"] == counters["python"]


def test_charges_during_the_round_trip_are_pushed_next_and_raise_the_local_part(redis_server):
    """A charge made while a sync's request is out is not acknowledged by it: the pulled
    counter plus that charge is what the tenant rises to, and the next sync pushes it."""
    store = D.RedisStore.from_url(redis_server.url, "rt", timeout_ms=2000)

    class During:
        takes_json = True

        def __init__(self) -> None:
            self.charge = False

        def sync(self, req):
            reply = store.sync(req)
            if self.charge:
                s.decode([running["a"]], 4)  # 8 at wq = 2
            return reply

        def counters(self):
            return store.counters()

        def backlog(self):
            return store.backlog()

    wrapper = During()
    sh = D.SharedCounters(wrapper, replica_id="r0", retry_ms=0)
    s, running = _charged(names=["a", "b"], attach=sh.attach)
    assert sh.sync(s, D.CORE_WAITING)
    before = store.counters()["a"]
    wrapper.charge = True
    assert sh.sync(s, D.CORE_WAITING)
    wrapper.charge = False
    assert store.counters()["a"] == before  # not pushed yet
    assert sh.unsynced(s, "a") == 8.0
    assert sh.sync(s, D.CORE_WAITING)
    assert store.counters()["a"] == before + 8.0
    assert sh.unsynced(s, "a") == 0.0
    assert s.counter("a") >= before + 8.0


class _Garbled:
    """A store that says ``takes_json`` and answers what the script never sends while
    ``garble`` is set (else delegates)."""

    takes_json = True

    def __init__(self, store: D.RedisStore) -> None:
        self.store, self.garble = store, False

    def sync(self, req):
        reply = self.store.sync(req)
        if self.garble and reply.status == "ok":
            assert reply.changed_raw is not None and reply.changed == {}
            reply.changed_raw = (b'["s:a","s:b"', b"1,2")
        return reply

    def counters(self):
        return self.store.counters()

    def backlog(self):
        return self.store.backlog()


def test_a_reply_that_cannot_be_read_acknowledges_nothing(redis_server):
    """The ledger reads the reply's counters before anything is acknowledged: a reply it
    cannot read is a store fault, and what was pushed is pushed again (the store applies
    it once: the request's ``base`` tells it what it already has)."""
    store = _Garbled(D.RedisStore.from_url(redis_server.url, "garbled", timeout_ms=2000))
    sh = D.SharedCounters(store, replica_id="r0", retry_ms=0)
    s, running = _charged(names=["a", "b"], attach=sh.attach)
    assert sh.sync(s, D.CORE_WAITING)
    base = store.counters()
    s.decode(list(running.values()), 5)  # 10 each
    store.garble = True
    assert not sh.sync(s, D.CORE_WAITING)
    assert sh.degraded and "changed" in sh.stats.last_error
    assert sh.unsynced(s, "a") == sh.unsynced(s, "b") == 10.0
    store.garble = False
    assert sh.sync(s, D.CORE_WAITING) and not sh.degraded
    assert store.counters() == {c: base[c] + 10.0 for c in "ab"}
    assert sh.unsynced(s, "a") == 0.0


def test_a_raise_while_a_pass_holds_the_guard_waits_for_the_pass(redis_server):
    """A background sync that finds the engine's scheduling pass holding the guard
    leaves its raises (the reply's counters, read in the core, plus the local part) to
    ``apply_deferred``; the pass's order does not move meanwhile."""
    url = redis_server.url
    other = D.SharedCounters(D.RedisStore.from_url(url, "guard"), replica_id="r1", retry_ms=0)
    s1, run1 = _charged(names=["a", "b"], attach=other.attach)
    s1.decode([run1["a"]], 50)  # a is far ahead on r1
    assert other.sync(s1, D.CORE_WAITING)

    sh = D.SharedCounters(D.RedisStore.from_url(url, "guard"), replica_id="r0", retry_ms=0)
    sh.guard = threading.Lock()
    s, running = _charged(names=["a", "b"], attach=sh.attach)
    before = {c: s.counter(c) for c in "ab"}
    with sh.guard:
        assert sh.sync(s, D.CORE_WAITING)
        assert {c: s.counter(c) for c in "ab"} == before  # nothing moved within the pass
        s.decode([running["a"]], 1)  # charged after the reply: 2 more
    global_a = sh.store.counters()["a"]
    assert global_a > before["a"]
    with sh.guard:
        assert sh.apply_deferred(s) >= 1
    assert s.counter("a") >= global_a
