"""``Scheduler.decode_outputs``: charging an engine step from its output objects,
``vtc.key_id``, and ``decode`` with a plain list of ids (its fast path)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import vtc
from helpers import state


def out(key, n, **extra):
    return SimpleNamespace(request_id=key, new_token_ids=[7] * n, **extra)


def running_scheduler(rids, clients=3):
    s = vtc.Scheduler(M=1_000_000)
    for i, rid in enumerate(rids):
        s.submit(rid, f"c{i % clients}", 10)
    assert len(s.schedule()) == len(rids)
    return s


def test_charges_what_decode_charges():
    keys = [f"req-{i}" for i in range(40)]
    ids = {k: 1000 + i for i, k in enumerate(keys)}
    tokens = [1 + i % 4 for i in range(40)]
    a = running_scheduler(ids.values())
    b = running_scheduler(ids.values())
    a.decode_outputs([out(k, n) for k, n in zip(keys, tokens)], ids)
    b.decode(list(ids.values()), tokens)
    assert state(a, list(ids.values())) == state(b, list(ids.values()))
    assert [a.generated(r) for r in ids.values()] == tokens


def test_any_iterable_of_outputs_and_custom_attributes():
    s = running_scheduler([1, 2])
    items = (SimpleNamespace(rid="x", count=3), SimpleNamespace(rid="y", count=0))
    s.decode_outputs(iter(items), {"x": 1, "y": 2}, id_attr="rid", tokens_attr="count")
    assert (s.generated(1), s.generated(2)) == (3, 0)
    s.decode_outputs((), {})  # nothing to charge
    assert (s.generated(1), s.generated(2)) == (3, 0)


def test_hash_mode_names_requests_by_key_id():
    keys = ["cmpl-a", "cmpl-b", ("tuple", 3)]
    s = running_scheduler([vtc.key_id(k) for k in keys])
    s.decode_outputs([out(k, 2) for k in keys], {}, missing="hash")
    assert all(s.generated(vtc.key_id(k)) == 2 for k in keys)
    # the mapping wins over the hash: a key whose id was taken maps elsewhere
    s.submit(5, "c0", 10)
    s.schedule()
    s.decode_outputs([out("cmpl-a", 1), out("moved", 4)], {"moved": 5}, missing="hash")
    assert s.generated(vtc.key_id("cmpl-a")) == 3 and s.generated(5) == 4


def test_hash_str_mode_hashes_only_str_keys():
    """An int's hash is the int (mod 2**61 - 1): an int key that no live request
    was submitted under may hash to another's id, so "hash-str" looks every key that
    is not a str up in the mapping, and a str key not there by its hash."""
    s = running_scheduler([1, vtc.key_id("cmpl-a"), 9])
    s.decode_outputs([out("cmpl-a", 2), out(2**61, 3)], {2**61: 9}, missing="hash-str")
    assert (s.generated(vtc.key_id("cmpl-a")), s.generated(9), s.generated(1)) == (2, 3, 0)
    s.decode_outputs([out(2**61, 1)], {}, missing="hash")  # "hash" hashes it: request 1
    assert s.generated(1) == 1
    for key in [2**61, ("t", 1), b"cmpl-a"]:
        with pytest.raises(vtc.UnknownRequestError, match="not in request_ids"):
            s.decode_outputs([out(key, 1)], {}, missing="hash-str")
    assert (s.generated(vtc.key_id("cmpl-a")), s.generated(9), s.generated(1)) == (2, 3, 1)


def test_key_id_is_the_python_hash_as_u64():
    for key in ["", "req-1", "é", 0, -1, 2**70, ("a", 1)]:
        assert vtc.key_id(key) == hash(key) % 2**64
    with pytest.raises(TypeError):
        vtc.key_id(["unhashable"])
    with pytest.raises(TypeError):
        vtc.key_id(key="a")  # positional only, as in _core.pyi


BAD = [
    # (outputs, request_ids, kwargs, exception, message)
    ([out("a", 1), out("zz", 1)], {"a": 1}, {}, vtc.UnknownRequestError, "'zz' is not in"),
    ([out("a", 1), out("a", 2)], {"a": 1}, {}, vtc.InvalidArgumentError, "appears twice"),
    ([out("a", 1), out("w", 1)], {"a": 1, "w": 3}, {}, vtc.RequestStateError, "request 3"),
    ([out("a", 1), out("gone", 1)], {"a": 1}, {"missing": "hash"}, vtc.UnknownRequestError, ""),
    ([out("a", 1)], {"a": 1}, {"missing": "ignore"}, vtc.InvalidArgumentError, '"ignore"'),
    # 2**61 hashes to 1, a running request: "hash-str" hashes str keys only
    (
        [out("a", 1), out(2**61, 1)],
        {"a": 2},
        {"missing": "hash-str"},
        vtc.UnknownRequestError,
        str(2**61),
    ),
    ([out(2**61, 1)], {}, {"missing": "hash-str"}, vtc.UnknownRequestError, str(2**61)),
    ([out("a", 1), SimpleNamespace(new_token_ids=[1])], {"a": 1}, {}, TypeError, "outputs[1]"),
    ([SimpleNamespace(request_id="a", new_token_ids=5.0)], {"a": 1}, {}, TypeError, "5.0"),
    ([SimpleNamespace(request_id="a", new_token_ids=-2)], {"a": 1}, {}, ValueError, "-2"),
    ([out("a", 1)], {"a": -1}, {}, ValueError, "-1"),
    ([out("a", 1)], {"a": "1"}, {}, TypeError, "'1'"),
    ([out(["unhashable"], 1)], {"a": 1}, {}, TypeError, "unhashable"),
    (42, {}, {}, TypeError, "outputs must be an iterable"),
]


@pytest.mark.parametrize("outputs,ids,kwargs,exc,msg", BAD)
def test_bad_input_charges_nothing(outputs, ids, kwargs, exc, msg):
    s = running_scheduler([1, 2])
    s.submit(3, "c0", 10**6)  # waiting: too large to run
    before = state(s, [1, 2, 3])
    with pytest.raises(exc) as info:
        s.decode_outputs(outputs, ids, **kwargs)
    assert msg in str(info.value)
    assert state(s, [1, 2, 3]) == before
    s._check_invariants()


class BrokenOutput:
    """An engine's output whose token getter raises."""

    request_id = "a"

    @property
    def new_token_ids(self):
        raise RuntimeError("engine bug")


def test_an_error_raised_by_a_getter_propagates_unchanged():
    s = running_scheduler([1])
    with pytest.raises(RuntimeError, match="engine bug"):
        s.decode_outputs([BrokenOutput()], {"a": 1})
    assert s.generated(1) == 0


def test_decode_with_a_list_takes_every_int_form():
    s = running_scheduler([0, 2**63, 2**64 - 1])
    s.decode([0, 2**63, 2**64 - 1], [1, np.int64(2), 3])
    assert [s.generated(r) for r in (0, 2**63, 2**64 - 1)] == [1, 2, 3]
    before = state(s, [0])
    for bad, exc, msg in [
        ([0, True], TypeError, "True"),
        ([0, 2**64], ValueError, str(2**64)),
        ([0, -5], ValueError, "-5"),
        ([0, "1"], TypeError, "'1'"),
    ]:
        with pytest.raises(exc, match=msg):
            s.decode(bad, 1)
        assert state(s, [0]) == before


def test_every_kind_of_token_container_is_counted():
    """An exact list or tuple is sized directly (the fast path), anything else
    with a ``__len__`` or an int as before."""

    class Tokens(list):
        pass

    class Sized:
        def __len__(self):
            return 4

    held = [[7, 7], (7, 7, 7), Tokens([7]), Sized(), 5, []]
    keys = [f"k{i}" for i in range(len(held))]
    s = running_scheduler([vtc.key_id(k) for k in keys])
    s.decode_outputs(
        [SimpleNamespace(request_id=k, new_token_ids=h) for k, h in zip(keys, held)],
        {},
        missing="hash",
    )
    assert [s.generated(vtc.key_id(k)) for k in keys] == [2, 3, 1, 4, 5, 0]


def test_decode_uniform_charges_what_decode_outputs_charges():
    keys = [f"req-{i}" for i in range(30)]
    rids = [vtc.key_id(k) for k in keys]
    for t in (1, 3):
        a, b = running_scheduler(rids), running_scheduler(rids)
        outputs = [out(k, t) for k in keys]
        assert a.decode_uniform(outputs) is True
        b.decode_outputs(outputs, {}, missing="hash")
        assert state(a, rids) == state(b, rids)
        a._check_invariants()
    # tuples and ints, a custom attribute
    a, b = running_scheduler(rids[:2]), running_scheduler(rids[:2])
    items = [SimpleNamespace(n=(7, 7)), SimpleNamespace(n=2)]
    assert a.decode_uniform(items, tokens_attr="n") is True
    b.decode(rids[:2], 2)
    assert state(a, rids[:2]) == state(b, rids[:2])


def test_decode_uniform_reads_token_lists_themselves_without_an_attribute():
    """``tokens_attr=None``: the items are the tokens (a sampler's token lists)."""
    keys = [f"req-{i}" for i in range(8)]
    rids = [vtc.key_id(k) for k in keys]
    for t in (1, 2):
        a, b = running_scheduler(rids), running_scheduler(rids)
        assert a.decode_uniform([[7] * t for _ in keys], tokens_attr=None) is True
        b.decode_outputs([out(k, t) for k in keys], {}, missing="hash")
        assert state(a, rids) == state(b, rids)
    a, b = running_scheduler(rids[:2]), running_scheduler(rids[:2])
    assert a.decode_uniform([(7, 7), 2], tokens_attr=None) is True  # a tuple, an int
    b.decode(rids[:2], 2)
    assert state(a, rids[:2]) == state(b, rids[:2])
    s = running_scheduler(rids[:2])
    before = state(s, rids[:2])
    for refused in ([[7], [7, 7]], [[7]], [[7], [7], [7]], [[], []], [out("a", 1)] * 2, [1.0, 1.0]):
        assert s.decode_uniform(refused, tokens_attr=None) is False, refused
    assert state(s, rids[:2]) == before


def test_decode_uniform_inside_predictions_charges_what_decode_outputs_charges():
    keys = [f"req-{i}" for i in range(12)]
    rids = [vtc.key_id(k) for k in keys]
    pair = []
    for _ in range(2):
        s = vtc.Scheduler(M=1_000_000, predictor="mean")
        for i, rid in enumerate(rids):  # some inside a prediction, some not
            s.submit(rid, f"c{i % 3}", 10, predicted_output=(0, 2, 50)[i % 3])
        assert len(s.schedule()) == len(rids)
        pair.append(s)
    a, b = pair
    for t in (1, 2, 1):
        outputs = [out(k, t) for k in keys]
        assert a.decode_uniform(outputs) is True
        b.decode_outputs(outputs, {}, missing="hash")
        assert state(a, rids) == state(b, rids)
    a._check_invariants()


@pytest.mark.parametrize(
    "outputs",
    [
        [out("a", 1)],  # fewer outputs than running requests
        [out("a", 1), out("b", 1), out("c", 1)],  # more
        [out("a", 1), out("b", 2)],  # counts differ
        [out("a", 0), out("b", 0)],  # nothing generated
        (out("a", 1), out("b", 1)),  # not a list
        [out("a", 1), SimpleNamespace(request_id="b")],  # no tokens attribute
        [out("a", 1), SimpleNamespace(new_token_ids=type("L", (list,), {})([7]))],  # subclass
        [out("a", 1), SimpleNamespace(new_token_ids=1.0)],  # not a count
        [],
    ],
)
def test_decode_uniform_charges_nothing_unless_uniform_over_the_running_set(outputs):
    s = running_scheduler([1, 2])
    before = state(s, [1, 2])
    assert s.decode_uniform(outputs) is False
    assert state(s, [1, 2]) == before


def test_decode_uniform_leaves_a_getters_error_to_decode_outputs():
    s = running_scheduler([1])
    assert s.decode_uniform([BrokenOutput()]) is False  # decode_outputs reports it
    with pytest.raises(RuntimeError, match="engine bug"):
        s.decode_outputs([BrokenOutput()], {}, missing="hash")
    assert s.generated(1) == 0
