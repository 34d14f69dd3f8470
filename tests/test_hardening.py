"""Hostile input (issue 14): every case here crashed, wrapped, went infinite
or disagreed with ``vtc.reference`` before it was fixed. Each case runs on
the Rust core and, where the reference takes the same input, on the
reference too, and both must agree."""

from __future__ import annotations

import collections.abc
import math
import sys
import types
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest

import vtc
import vtc.config
import vtc.reference as ref
from helpers import state
from vtc import _core

BOTH = [vtc.Scheduler, ref.Scheduler]
BIG = 2**40


class LyingLen:
    """Says it holds ``n`` items and yields none (or ``items``)."""

    def __init__(self, n, items=()):
        self.n, self.items = n, list(items)

    def __len__(self):
        return self.n

    def __iter__(self):
        return iter(self.items)


class LyingSequence(collections.abc.Sequence):
    def __len__(self):
        return 2**62

    def __getitem__(self, i):
        if i >= 3:
            raise IndexError(i)
        return 0


def one_running(cls=vtc.Scheduler, **kw):
    s = cls(100, **kw)
    s.submit(0, "a", 5)
    s.schedule()
    return s


def outcome(fn):
    """The result of ``fn()``, or the type of the exception it raised."""
    try:
        return ("ok", fn())
    except Exception as e:  # the type is what is compared
        return ("raised", type(e))


# -- 1. lying lengths: never allocate from __len__ ---------------------------


@pytest.mark.parametrize("n", [2**40, 2**61, 2**62, 2**63 - 1])
def test_a_lying_length_neither_aborts_nor_panics(n):
    s = one_running()
    before = state(s, [0])
    assert s.decode(LyingLen(n)) == []  # it yields nothing: an empty batch
    assert s.decode([0], LyingLen(n, [3])) == []  # read as what it yields
    assert s.generated(0) == 3
    s.decode(LyingLen(n, [0]), LyingLen(n, [2]))
    assert s.generated(0) == 5
    s.decode_outputs(LyingLen(n), {})
    assert state(s, [0])["running"] == before["running"]
    s._check_invariants()


def test_an_endless_iterable_is_read_only_up_to_the_running_set():
    s = one_running()
    with pytest.raises(vtc.UnknownRequestError):  # id 1 is not running
        s.decode(range(BIG))
    with pytest.raises(vtc.InvalidArgumentError, match="differ in length"):
        s.decode([0], range(BIG))

    def forever():
        while True:
            yield 0

    with pytest.raises(vtc.InvalidArgumentError, match="appears twice"):
        s.decode(forever())

    class Out:
        request_id, new_token_ids = 0, [1]

    with pytest.raises(vtc.InvalidArgumentError, match="appears twice"):
        s.decode_outputs((Out() for _ in range(BIG)), {0: 0})
    assert s.generated(0) == 0
    s._check_invariants()


@pytest.mark.parametrize("cls", BOTH)
@pytest.mark.parametrize("tokens", [list, tuple, np.array])
def test_ids_without_a_length_are_read_as_far_as_sized_tokens_go(cls, tokens):
    # One running request, ids from a generator longer than the running set
    # and tokens with a real length: the lengths are compared (they agree),
    # then the ids position by position: 7 is not running.
    s = one_running(cls)
    with pytest.raises(vtc.UnknownRequestError, match="7"):
        s.decode((r for r in [0, 7, 8, 9]), tokens([1, 1, 1, 1]))
    with pytest.raises(vtc.InvalidArgumentError, match="differ in length"):
        s.decode((r for r in [0, 7, 8, 9, 10]), tokens([1, 1, 1, 1]))
    with pytest.raises(vtc.InvalidArgumentError, match="differ in length"):
        s.decode((r for r in [0, 7, 8]), tokens([1, 1, 1, 1]))
    # tokens without a length: read as far as the ids, a longer one is cut
    with pytest.raises(vtc.InvalidArgumentError, match="differ in length: 1 != more than 1"):
        s.decode([0], (t for t in [1, 1]))
    assert s.generated(0) == 0
    if cls is vtc.Scheduler:
        s._check_invariants()


def test_from_snapshot_takes_only_buffers():
    s = one_running()
    data = s.snapshot()
    for good in (data, bytearray(data), memoryview(data)):
        assert vtc.Scheduler.from_snapshot(good).counters() == s.counters()
    for bad in (LyingSequence(), list(data), LyingLen(2**62)):
        with pytest.raises(TypeError, match="bytes"):
            vtc.Scheduler.from_snapshot(bad)


# -- 2. occupancy never wraps ------------------------------------------------


def test_the_largest_budget_is_exported_and_agrees_with_the_reference():
    assert vtc.MAX_BUDGET == _core.MAX_BUDGET == ref.MAX_BUDGET == 2**53
    # every limit of rust/core/src/limits.rs, the same in the executable spec
    for name in ("MAX_REQUEST_TOKENS", "MAX_PRICE", "MIN_WEIGHT", "MAX_WEIGHT", "MAX_COUNTER"):
        assert getattr(_core, name) == getattr(ref, name), name
    assert vtc.config.MAX_PRICE == _core.MAX_PRICE == 1e9
    assert vtc.Scheduler(vtc.MAX_BUDGET).M == vtc.MAX_BUDGET


@pytest.mark.parametrize("cls", BOTH)
def test_budget_is_bounded_so_occupancy_cannot_wrap(cls):
    with pytest.raises(vtc.InvalidArgumentError, match=str(2**63 - 1)):
        cls(2**63 - 1)
    M = 2**53
    s = cls(M)
    s.submit(1, "a", M)
    assert s.schedule() == [1]
    s.decode([1], 2)
    s.submit(2, "b", M)
    assert s.schedule() == []
    assert s.occupancy == M + 2
    assert s.num_running == 1


def test_pops_past_the_budget_sum_exactly():
    M = 2**53
    s, r = vtc.Scheduler(M), ref.Scheduler(M)
    for x in (s, r):
        for i in range(3):
            x.submit(i, f"c{i}", M)
        for _ in range(3):
            x.pop()
    assert s.occupancy == r.occupancy == 3 * M


# -- 3. every accepted configuration keeps counters finite -------------------


@pytest.mark.parametrize("cls", BOTH)
@pytest.mark.parametrize(
    "call",
    [
        lambda cls: cls(10, wp=1e308, wq=0.0),
        lambda cls: cls(10, wq=1e10),
        lambda cls: cls(10).set_weight("a", 1e-308),
        lambda cls: cls(10).set_weight("a", 5e-324),
        lambda cls: cls(10).set_weight("a", 1e7),
        lambda cls: cls(10).raise_counter("a", 1e300),
        lambda cls: cls(10).raise_counter("a", -1e31),
    ],
)
def test_values_that_would_make_counters_infinite_are_refused(cls, call):
    with pytest.raises(vtc.InvalidArgumentError):
        call(cls)


def test_the_extremes_accepted_keep_counters_finite_and_snapshots_restorable():
    M = 2**53
    s = vtc.Scheduler(M, wp=1e9, wq=1e9)
    r = ref.Scheduler(M, wp=1e9, wq=1e9)
    for x in (s, r):
        x.set_weight("a", 1e-6)
        x.set_weight("b", 1e6)
        x.raise_counter("b", 1e30)
        x.submit(1, "a", M - 2**33, cached_len=0)
        x.schedule()
        x.decode([1], _core.MAX_TOKENS_PER_CALL)
        x.submit(2, "b", 10, cached_len=10)
    assert s.counters() == r.counters()
    for c in s.counters().values():
        assert math.isfinite(c)
    t = vtc.Scheduler.from_snapshot(s.snapshot())
    assert t.counters() == s.counters()
    s._check_invariants()


@pytest.mark.parametrize(
    "cost",
    [
        lambda: vtc.LinearCost(wp=1e308, wq=1.0),
        lambda: vtc.QuadraticCost(a_qq=math.inf),
        lambda: vtc.ContextCost(beta=1e10),
    ],
)
def test_cost_coefficients_are_bounded_too(cost):
    with pytest.raises(vtc.InvalidArgumentError):
        cost()


# -- 4. numpy: every integer dtype, any empty array --------------------------

INT_DTYPES = [
    np.int8,
    np.uint8,
    np.int16,
    np.uint16,
    np.int32,
    np.uint32,
    np.int64,
    np.uint64,
    np.dtype(">i8"),
    np.dtype(">u4"),
    np.dtype("<i2"),
]


@pytest.mark.parametrize("dtype", INT_DTYPES, ids=str)
def test_every_integer_dtype_is_a_batch(dtype):
    s, r = vtc.Scheduler(1000), ref.Scheduler(1000)
    for x in (s, r):
        for i in range(4):
            x.submit(i, f"c{i % 2}", 10)
        x.schedule()
        x.decode(np.arange(4).astype(dtype), np.array([1, 2, 3, 4]).astype(dtype))
        x.decode(np.arange(4)[::-2].astype(dtype), np.array([5, 6]).astype(dtype))
    assert s.counters() == r.counters()
    assert [s.generated(i) for i in range(4)] == [1, 8, 3, 9]


@pytest.mark.parametrize("dtype", [np.float64, np.int8, np.bool_, object, np.uint64])
def test_an_empty_array_of_any_dtype_is_an_empty_batch(dtype):
    for cls in BOTH:
        s = one_running(cls)
        assert s.decode(np.array([], dtype=dtype)) == []
        assert s.decode(np.array([], dtype=dtype), np.array([], dtype=dtype)) == []
        assert s.generated(0) == 0


def test_non_integer_arrays_are_type_errors_for_both():
    for arr in (np.array([0.0]), np.array([True]), np.array([[0]])):
        got = {cls: outcome(lambda cls=cls, arr=arr: one_running(cls).decode(arr)) for cls in BOTH}
        assert got[vtc.Scheduler] == got[ref.Scheduler] == ("raised", TypeError), arr
    s = one_running()
    with pytest.raises(TypeError):
        s.decode([0], np.array([1.5]))
    assert s.generated(0) == 0


def test_negative_numpy_ids_and_huge_numpy_tokens_are_value_errors():
    s = one_running()
    with pytest.raises(vtc.InvalidArgumentError):
        s.decode(np.array([-1], dtype=np.int8))
    with pytest.raises(vtc.InvalidArgumentError):
        s.decode(np.array([0]), np.array([2**64 - 1], dtype=np.uint64))
    assert s.generated(0) == 0


# -- 5. every str is a key ---------------------------------------------------


@pytest.mark.parametrize("key", ["\ud800", "a\udfffb", "\udc80\ud800", "é\ud83d"])
def test_a_str_with_lone_surrogates_is_a_key(key):
    s, r = vtc.Scheduler(100), ref.Scheduler(100)
    for x in (s, r):
        x.submit(5, key, 5)
        x.set_weight(key, 2.0)
        x.submit(6, "plain", 5)
        x.schedule()
        x.decode([5, 6], 3)
    assert s.counters() == r.counters()
    assert s.counter(key) == r.counter(key) > 0
    assert key in s.clients()
    t = vtc.Scheduler.from_snapshot(s.snapshot())
    assert t.counters() == s.counters()
    assert t.weight(key) == 2.0
    t._check_invariants()


def test_a_str_subclass_is_the_same_key_as_its_str():
    class S(str):
        pass

    s = vtc.Scheduler(100)
    s.set_weight(S("x\ud800"), 3.0)
    assert s.weight("x\ud800") == 3.0
    assert s.num_clients == 1


# -- 6. one order of checks ---------------------------------------------------

PRECEDENCE = [
    ([999], [2**64]),
    ([999], 2**64),
    ([999], ["x"]),
    ([0, "x"], [1, 2, 3]),
    ([], 2**64),
    ([], -(2**64)),
    ([0], 2**64),
    ([0], -(2**70)),
    ([0, 0], [1, "x"]),
    ([0, 999], ["x", 1]),
    (["x", 999], [1, 1]),
    ([0, 2**64], [1, 1]),
    ([0, -1], [-1, 1]),
    ([0, 1], [1, -1]),
    ([0, 0], [2**40, 1]),
    ([1], [1.5]),
    ([1, 0], [1, 2**64]),
    # the core's checks by position: a token count or a duplicate before an id
    # that is not running, and an id that is not running before them
    ([0, 999], [-1, 1]),
    ([0, 1, 999], [1, 2**40, 1]),
    ([0, 0, 999], [1, 1, 1]),
    ([999, 0], [1, -1]),
    ([1, 999, 1], [1, 1, 1]),
    ((0, 1), (1, 2)),
    ("iter", [0, 1], [1]),
    ("iter", [0, 1], [1, 2, 3]),
    ("iter", [0, 1, 1], [1, 2, 3]),
    ("iter", [0, 1, 5, 6], [1, 2, 3, 4]),
]


@pytest.mark.parametrize("case", PRECEDENCE, ids=repr)
def test_decode_checks_in_the_same_order_as_the_reference(case):
    as_iter = case[0] == "iter"
    ids, tokens = case[-2:]
    got = {}
    for cls in BOTH:
        s = cls(100)
        s.submit(0, "a", 5)
        s.submit(1, "b", 5)
        s.schedule()
        # iterators (not lists): read without a length, up to a limit
        i, t = (iter(ids), iter(tokens)) if as_iter else (ids, tokens)
        got[cls] = outcome(lambda s=s, i=i, t=t: s.decode(i, t))
        got[cls, "after"] = (s.generated(0), s.generated(1), s.counters())
    assert got[vtc.Scheduler] == got[ref.Scheduler]
    assert got[vtc.Scheduler, "after"] == got[ref.Scheduler, "after"]


@pytest.mark.parametrize("cached", [2**63, -(2**63) - 1, "x", 2**200])
def test_pop_on_an_empty_queue_returns_none_whatever_cached_len(cached):
    for cls in BOTH:
        assert cls(10).pop(cached) is None


@pytest.mark.parametrize("cached", [2**63, -(2**63) - 1, 2**200, -1, 6])
def test_pop_names_an_out_of_range_cached_len(cached):
    for cls in BOTH:
        s = cls(10)
        s.submit(1, "a", 5)
        with pytest.raises(vtc.InvalidArgumentError, match=f"got {cached}"):
            s.pop(cached)
        assert s.num_waiting == 1


class _Int(int):
    """An int subclass: not an exact int, so read by the general path."""


@pytest.mark.parametrize("cls", BOTH)
def test_an_int_argument_reads_alike_at_each_edge_of_64_bits(cls):
    """Request ids at the edges of i64 and u64 (an exact int is read in one call
    when it fits in either), and the same values as an int subclass (the general
    path), are the same ids; the first ints past them are refused, naming them."""
    s = cls(100)
    ids = [0, 2**63 - 1, 2**63, 2**64 - 1]
    for i, rid in enumerate(ids):
        s.submit(rid, f"t{i}", 5)
        assert s.status(_Int(rid)) == "waiting"
    for rid in (-1, -(2**63) - 1, 2**64, 2**200):
        with pytest.raises(vtc.InvalidArgumentError, match="request_id"):
            s.submit(rid, "x", 5)
    with pytest.raises(TypeError):
        s.submit(True, "x", 5)
    assert sorted(s.pop(_Int(0)) for _ in ids) == ids
    assert s.num_waiting == 0 and s.num_running == len(ids)


@pytest.mark.parametrize("cls", BOTH)
def test_an_int_client_id_reads_alike_at_each_edge_of_64_bits(cls):
    """Int client ids at the edges of i64, as exact ints and as an int subclass,
    are the same clients; the first ints past them (an exact int past i64 is read
    in one call up to u64) are refused, naming the value, and change nothing."""
    s = cls(100)
    for i, client in enumerate([-(2**63), 2**63 - 1, 0]):
        s.submit(i, client, 5)
        s.submit(10 + i, _Int(client), 5)
        assert s.active_clients()[client] == (2, 0)
    for client in (2**63, 2**64 - 1, 2**64, -(2**63) - 1):
        with pytest.raises(vtc.InvalidArgumentError, match=str(client)):
            s.submit(99, client, 5)
    assert s.num_waiting == 6 and sorted(s.clients()) == [-(2**63), 0, 2**63 - 1]


# -- 7 and 8. one rule for numbers --------------------------------------------


@pytest.mark.parametrize("cls", BOTH)
def test_an_int_too_large_for_a_float_is_a_value_error(cls):
    s = cls(10)
    with pytest.raises(vtc.InvalidArgumentError, match="weight"):
        s.set_weight("a", 10**400)
    with pytest.raises(vtc.InvalidArgumentError, match="value"):
        s.raise_counter("a", 10**400)
    with pytest.raises(vtc.InvalidArgumentError, match="wp"):
        cls(10, wp=10**400)
    assert s.num_clients == 0


@pytest.mark.parametrize("cls", BOTH)
def test_numbers_rule(cls):
    s = cls(10)
    for w in (Fraction(3, 2), np.float32(1.5), np.int64(2), 2, 2.5):
        s.set_weight("a", w)
        assert s.weight("a") == float(w)
    s.raise_counter("a", Fraction(7, 2))
    assert s.counter("a") == 3.5
    for bad in (Decimal("1.5"), "1.5", None, True, 1j):
        with pytest.raises(TypeError):
            s.set_weight("a", bad)
        with pytest.raises(TypeError):
            s.raise_counter("a", bad)
        if bad is not None:  # wq=None is the default
            with pytest.raises(TypeError):
                cls(10, wq=bad)
    assert s.weight("a") == 2.5
    assert cls(10, policy=None).policy == "vtc"
    assert cls(10, client_cap=2**63).client_cap == 10
    assert cls(10, client_cap=2**200).client_cap == 10
    assert cls(10, client_cap=0.5).client_cap == 5
    assert cls(10, client_cap=Fraction(1, 2)).client_cap == 5
    with pytest.raises(vtc.InvalidArgumentError):
        cls(10, client_cap=-(2**200))
    with pytest.raises(TypeError):
        cls(10, policy=3)


# -- 9. the caller's exceptions propagate ------------------------------------


class Boom(Exception):
    pass


class BadIndex:
    def __init__(self, exc):
        self.exc = exc

    def __index__(self):
        raise self.exc


@pytest.mark.parametrize("cls", BOTH)
def test_an_exception_inside_index_propagates(cls):
    s = one_running(cls)
    for exc in (Boom("mine"), vtc.UnknownRequestError("re-entrant")):
        with pytest.raises(type(exc), match=str(exc)):
            s.submit(BadIndex(exc), "a", 5)
        with pytest.raises(type(exc)):
            s.decode([BadIndex(exc)])
        with pytest.raises(type(exc)):
            s.decode([0], [BadIndex(exc)])
        with pytest.raises(type(exc)):
            s.finish(BadIndex(exc))
    assert s.running() == [0]


def running_four(cls):
    s = cls(100)
    for i in range(4):
        s.submit(i, "abcd"[i], 5)
    assert sorted(s.schedule()) == [0, 1, 2, 3]
    return s


def mutated_decode(cls, change):
    """``decode`` on four running requests of a list whose second item changes
    the list from its ``__index__``: the outcome and what each was charged."""
    s = running_four(cls)
    ids: list = []

    class Mutate:
        def __index__(self):
            if change == "shrink":
                ids.pop()
            elif change == "grow":
                ids.append(3)
            else:
                ids.clear()
            return 1

    ids.extend([0, Mutate(), 2] + ([3] if change == "shrink" else []))
    return outcome(lambda: s.decode(ids, 2)), [s.generated(i) for i in range(4)]


@pytest.mark.parametrize("change", ["shrink", "grow", "clear"])
def test_a_list_changed_by_index_while_read_is_read_as_it_was_at_the_call(change):
    """The ids list is read as it is at the call, whatever an item's
    ``__index__`` does to it: the core and the reference charge the same
    requests."""
    core, reference = (mutated_decode(cls, change) for cls in BOTH)
    assert core == reference
    expected = {"shrink": [2, 2, 2, 2], "grow": [2, 2, 2, 0], "clear": [2, 2, 2, 0]}
    assert core[1] == expected[change]


def decode_items(cls, items, tokens):
    s = running_four(cls)
    return outcome(lambda: s.decode(list(items), tokens)), [s.generated(i) for i in range(4)]


@pytest.mark.parametrize(
    "items",
    [
        [0, 1, 2**63, 3],  # an id above i64 (read through the general path)
        [0, 1, 2**64, 3],  # out of range
        [0, -1, 2, 3],
        [0, True, 2, 3],  # bool: not an id
        [0, 1.0, 2, 3],
        [0, np.int64(1), np.uint8(2), 3],
        [0, 1, 2, 2],  # a duplicate
        [0, 1, 2, 7],  # not running
        [3, 2, 1, 0],
    ],
)
@pytest.mark.parametrize("tokens", [1, [1, 2, 3, 4], [1, 2**63, 3, 4], [1, True, 3, 4]])
def test_list_ids_of_every_kind_read_as_the_reference_reads_them(items, tokens):
    """Exact ints are read in place; every other item takes the general path:
    the outcome and the charges are the reference's."""
    core, reference = (decode_items(cls, items, tokens) for cls in BOTH)
    assert core == reference


@pytest.mark.parametrize("cls", BOTH)
def test_list_ids_past_i64_are_charged_as_a_tuple_or_an_array_of_them_is(cls):
    """Ids in u64 past i64 (read in place from a list, like any exact int in
    u64), before, between and after ids in i64 and an int subclass: a list, a
    tuple and a uint64 array charge the same requests the same tokens."""
    rids = [0, 2**63, 2**64 - 1, 7]
    orders = ([2**63, 0, 2**64 - 1, 7], [0, 2**64 - 1, _Int(2**63), 7], [7, 2**63, 0, 2**64 - 1])
    seen = []
    for shape in (list, tuple, lambda ids: np.array([int(i) for i in ids], dtype=np.uint64)):
        s = cls(1000)
        for i, rid in enumerate(rids):
            s.submit(rid, f"t{i}", 5)
        while s.schedule():
            pass
        for k, ids in enumerate(orders):
            s.decode(shape(ids), [1, 2, 3, 4][k:] + [1, 2, 3, 4][:k])
        seen.append([s.generated(r) for r in rids])
        with pytest.raises(vtc.InvalidArgumentError, match=str(2**64)):
            s.decode([2**63, 2**64], 1)
        assert [s.generated(r) for r in rids] == seen[-1]
    assert seen[0] == seen[1] == seen[2] and sum(seen[0]) == 30


def test_lists_are_read_in_place_where_the_layout_is_known():
    """The batch readers take an exact list's items from its own array on the
    CPython versions whose list layout is known, after a probe at import
    agreed with the API; anywhere else through the API."""
    known = sys.implementation.name == "cpython" and (3, 10) <= sys.version_info[:2] <= (3, 14)
    assert vtc._core._LISTS_IN_PLACE is known


@pytest.mark.parametrize("cls", BOTH)
def test_empty_shrunk_and_grown_lists_are_read_to_their_length(cls):
    """Lists read in place at their own length: empty (a list with no item
    array), shrunk (stale room past the end), grown past a reallocation; the
    ids, the per-request tokens and the sampled token lists alike."""
    s = cls(10_000)
    for rid in range(6):
        s.submit(rid, f"t{rid}", 5)
    while s.schedule():
        pass
    s.decode([], 1)
    s.decode([], [])
    assert [s.generated(r) for r in range(6)] == [0] * 6
    ids, toks = [0, 1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 6]
    del ids[3:], toks[3:]  # room for six left past the length of three
    s.decode(ids, toks)
    assert [s.generated(r) for r in range(6)] == [1, 2, 3, 0, 0, 0]
    ids.extend(range(3, 6))
    toks = [t for t in range(1, 4)] + [7] * 3
    s.decode(ids, toks)
    assert [s.generated(r) for r in range(6)] == [2, 4, 6, 7, 7, 7]


def test_sampled_token_lists_are_read_to_their_length():
    """`decode_uniform(..., tokens_attr=None)` reads a list of token lists in
    place at its length: shrunk (stale room past the end), one list that
    differs, an empty list; it charges what `decode_all` would."""
    s, twin = vtc.Scheduler(10_000), vtc.Scheduler(10_000)
    for t in (s, twin):
        for rid in range(6):
            t.submit(rid, f"t{rid}", 5)
        while t.schedule():
            pass
    sampled = [[9, 9] for _ in range(8)]
    del sampled[6:]
    assert s.decode_uniform(sampled, tokens_attr=None) is True
    twin.decode_all(2)
    assert [s.generated(r) for r in range(6)] == [2] * 6
    sampled[2] = [9]
    assert s.decode_uniform(sampled, tokens_attr=None) is False
    del sampled[5:]
    assert s.decode_uniform(sampled, tokens_attr=None) is False  # 5 of 6 running
    assert s.decode_uniform([], tokens_attr=None) is False
    assert [s.generated(r) for r in range(6)] == [2] * 6
    assert s.counters() == twin.counters()


def test_a_reentrant_call_inside_index_raises_its_own_error():
    s = one_running()

    class Reenter:
        def __index__(self):
            s.finish(12345)  # UnknownRequestError, raised inside __index__
            return 0

    with pytest.raises(vtc.UnknownRequestError, match="12345"):
        s.decode([Reenter()])
    assert s.generated(0) == 0


def test_an_exception_inside_len_of_produced_tokens_propagates():
    s = one_running()

    class Toks:
        def __len__(self):
            raise Boom("len")

    class Out:
        request_id, new_token_ids = "k", Toks()

    with pytest.raises(Boom):
        s.decode_outputs([Out()], {"k": 0})
    assert s.generated(0) == 0


# -- 10. forgetting with the mean predictor ------------------------------------


def test_forget_idle_frees_clients_with_the_mean_predictor():
    s = vtc.Scheduler(1000, predictor="mean")
    n = 2000
    for i in range(n):
        s.submit(i, f"one-off-{i}", 5)
        s.schedule()
        s.decode([i], 3)
        s.finish(i)
    assert s.num_clients == n
    forgotten = s.forget_idle()
    assert forgotten >= n - 1
    assert s.num_clients <= 1
    s._check_invariants()
    # a forgotten client comes back as new and is served as usual
    s.submit(n, "one-off-7", 5)
    assert s.schedule() == [n]
    s._check_invariants()


@pytest.mark.parametrize("cls", BOTH)
def test_raise_counters_checks_every_pair_before_moving_any(cls):
    s = cls(100)
    s.submit(1, "a", 10)
    s.raise_counters({"a": 5.0, "b": 2})
    before = state(s, [1])
    bad_batches = [
        ({"a": 50.0, "b": float("nan")}, vtc.InvalidArgumentError),
        ({"a": 50.0, "b": 1e31}, vtc.InvalidArgumentError),
        ({"a": 50.0, "b": -math.inf}, vtc.InvalidArgumentError),
        ({"a": 50.0, "b": "7"}, TypeError),
        ({"a": 50.0, "b": True}, TypeError),
        ({"a": 50.0, 2.5: 1.0}, TypeError),
        ({"a": 50.0, True: 1.0}, TypeError),
        ({"a": 50.0, 2**64: 1.0}, vtc.InvalidArgumentError),
    ]
    for batch, err in bad_batches:
        with pytest.raises(err):
            s.raise_counters(batch)
        assert state(s, [1]) == before, batch
    for not_a_mapping in ([("a", 50.0)], ("a", 50.0), None, 50.0, {"a"}):
        with pytest.raises(TypeError, match="mapping"):
            s.raise_counters(not_a_mapping)
        assert state(s, [1]) == before
    # any Mapping works; never lowers; how many counters rose
    proxy = types.MappingProxyType({"a": 1.0, "b": 3, "c": Fraction(1, 2)})
    assert s.raise_counters(proxy) == 2
    assert (s.counter("a"), s.counter("b"), s.counter("c")) == (5.0, 3.0, 0.5)
    assert s.raise_counters({}) == 0
