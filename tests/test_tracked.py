"""``vtc._core.Tracked`` (``vtc.observer.Tracked``): the adapter's record of one
engine request as native data. What the Python dataclass it replaced offered must
hold: the constructor's fields, positions and defaults, the three counters set and
read back, equality by identity, weak references, and a cycle through the engine's
request collected; what it adds: the identity fields fixed, a bad value refused
with the record unchanged."""

from __future__ import annotations

import gc
import weakref

import pytest

import vtc
import vtc.adapter
import vtc.observer
from vtc._core import Tracked
from vtc.adapter import Requests


class Req:
    def __init__(self, name: str) -> None:
        self.name = name
        self.record: Tracked | None = None

    def __repr__(self) -> str:
        return f"Req({self.name!r})"


def test_the_observer_interface_names_the_native_record() -> None:
    assert vtc.observer.Tracked is Tracked
    assert vtc.adapter.Tracked is Tracked


def test_fields_positional_keyword_and_defaults() -> None:
    req = Req("a")
    t = Tracked("k", 2**64 - 1, req, "x", 12)
    assert (t.key, t.rid, t.request, t.tenant, t.prompt_len) == ("k", 2**64 - 1, req, "x", 12)
    assert (t.owed, t.admissions, t.charged) == (0, 0, 0)
    u = Tracked(
        key=("k", 1), rid=0, request=None, tenant="y", prompt_len=1, owed=3, admissions=2, charged=9
    )
    assert (u.key, u.rid, u.request, u.tenant, u.prompt_len) == (("k", 1), 0, None, "y", 1)
    assert (u.owed, u.admissions, u.charged) == (3, 2, 9)
    assert repr(t) == (
        "Tracked(key='k', rid=18446744073709551615, request=Req('a'), tenant='x', "
        "prompt_len=12, owed=0, admissions=0, charged=0)"
    )


def test_counters_set_and_read_back() -> None:
    t = Tracked("k", 1, None, "x", 5)
    t.owed += 4
    t.admissions += 1
    t.charged = 7
    t.charged -= 10
    assert (t.owed, t.admissions, t.charged) == (4, 1, -3)


@pytest.mark.parametrize("field", ["key", "rid", "request", "tenant", "prompt_len"])
def test_identity_fields_are_fixed(field: str) -> None:
    t = Tracked("k", 1, None, "x", 5)
    with pytest.raises(AttributeError):
        setattr(t, field, 2)
    assert (t.key, t.rid, t.request, t.tenant, t.prompt_len) == ("k", 1, None, "x", 5)


@pytest.mark.parametrize(
    ("value", "error"),
    [(2**63, OverflowError), ("3", TypeError), (None, TypeError), (1.5, TypeError)],
)
@pytest.mark.parametrize("field", ["owed", "admissions", "charged"])
def test_a_bad_counter_is_refused_and_the_record_unchanged(field, value, error) -> None:
    t = Tracked("k", 1, None, "x", 5, 1, 2, 3)
    with pytest.raises(error, match=f"Tracked.{field} must be an int in i64, got {value!r}"):
        setattr(t, field, value)
    assert (t.owed, t.admissions, t.charged) == (1, 2, 3)


@pytest.mark.parametrize(
    ("args", "error", "names"),
    [
        (("k", -1, None, "x", 5), OverflowError, "rid"),
        (("k", 2**64, None, "x", 5), OverflowError, "rid"),
        (("k", 1, None, 7, 5), TypeError, "tenant"),
        (("k", 1, None, "x", "5"), TypeError, "prompt_len"),
        (("k", 1, None, "x", 5, 2**63), OverflowError, "owed"),
        (("k", 1, None), TypeError, "tenant"),
    ],
)
def test_a_bad_constructor_argument_is_named(args, error, names) -> None:
    with pytest.raises(error, match=names):
        Tracked(*args)


def test_equal_only_to_itself_and_hashed_by_identity() -> None:
    a, b = Tracked("k", 1, None, "x", 5), Tracked("k", 1, None, "x", 5)
    assert a == a and a != b
    assert len({a, b, a}) == 2
    assert a in [b, a] and b not in [a]


def test_a_weak_reference_and_a_cycle_through_the_request_collected() -> None:
    req = Req("a")
    t = Tracked("k", 1, req, "x", 5)
    req.record = t  # a cycle: record -> request -> record
    gone = weakref.ref(t)
    del t, req
    gc.collect()
    assert gone() is None


def test_requests_submit_makes_the_native_record() -> None:
    r = Requests(vtc.Scheduler(M=100))
    req = Req("a")
    t = r.submit("a", req, "x", 500)
    assert type(t) is Tracked
    assert (t.key, t.rid, t.request, t.tenant, t.prompt_len) == ("a", t.rid, req, "x", 100)
    assert r.get("a") is t and r.at(t.rid) is t
    t.owed = 3
    r.admit(r.head(), 0)
    assert (t.admissions, t.owed) == (1, 0)
    assert r.core.status(t.rid) == vtc.adapter.RUNNING
