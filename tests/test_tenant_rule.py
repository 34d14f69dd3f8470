"""vtc._core.TenantRule (``Tenancy.rule``): an arriving vLLM request's tenant, its
common case native, differential-tested against ``Tenancy.arrive`` of the request's
tenant fields read in Python (``vtc.adapter.vllm_tenant_fields``, which
``vtc.vllm.tenant_fields`` is)."""

from __future__ import annotations

import gc
import weakref
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import vtc
from helpers import raised
from vtc._core import TenantRule
from vtc.adapter import Tenancy, vllm_tenant_fields
from vtc.config import MAX_TENANT_LEN, EngineConfig
from vtc.errors import InvalidArgumentError

KEY = "tenant"


class Name(str):
    """A str subclass: not the common case (``tenant_name``'s to read)."""


class Extra(dict):
    """A dict subclass whose ``get`` is its own."""

    def get(self, key, default=None):  # noqa: ANN001, ANN201
        return "from-get"


def request(extra: Any = None, lora: Any = None, *, params: bool = True) -> SimpleNamespace:
    sampling = SimpleNamespace(extra_args=extra) if params else None
    return SimpleNamespace(sampling_params=sampling, lora_request=lora)


def make(**kw: Any) -> tuple[vtc.Scheduler, Tenancy]:
    core = vtc.Scheduler(M=10_000)
    forget_every = kw.pop("forget_every", 1000)
    return core, Tenancy(core, EngineConfig(tenant_key=KEY, **kw), forget_every=forget_every)


def test_a_known_tenant_is_named_without_the_slow_path():
    calls = []
    rule = TenantRule({"acme"}, KEY, 1000, MAX_TENANT_LEN, lambda *a: calls.append(a) or "slow")
    name = "acme"
    assert rule(request({KEY: name})) is name
    assert rule(request(None, SimpleNamespace(lora_name=name))) is name
    assert rule(request({}, SimpleNamespace(lora_name=name))) is name
    assert calls == [] and rule.arrivals == 3
    # an unknown tenant, a field only the full rule reads, none at all: the slow path
    assert rule(request({KEY: "beta"})) == "slow"
    assert rule(request({KEY: 7}, SimpleNamespace(lora_name="acme"))) == "slow"
    assert rule(request()) == "slow"
    assert calls == [
        (False, ("beta", None)),
        (False, (7, "acme")),
        (False, (None, None)),
    ]
    assert rule.arrivals == 6


def test_every_forget_every_th_arrival_is_due_on_either_path():
    core, t = make(forget_every=3)
    assert t.forget_every == t.rule.forget_every == 3
    forgets = []
    t.forget_idle = lambda: forgets.append(t.rule.arrivals) or 0  # type: ignore[method-assign]
    t.arrive(["default"])
    t.rule(request({KEY: "default"}))
    assert forgets == []
    t.rule(request({KEY: "default"}))  # third: due
    assert forgets == [3]
    for _ in range(3):
        t.arrive(["x"])
    assert forgets == [3, 6] and t.rule.arrivals == 6


def test_a_request_whose_fields_raise_is_not_counted():
    _, t = make()
    with pytest.raises(AttributeError):
        t.rule(SimpleNamespace(lora_request=None))  # no sampling_params
    broken = SimpleNamespace(sampling_params=SimpleNamespace(extra_args=None))
    with pytest.raises(AttributeError):
        t.rule(broken)  # no lora_request, and the first field names no tenant
    assert t.rule.arrivals == 0


@pytest.mark.parametrize(
    "args, match",
    [
        ((set(), KEY, 0, 128, print), "forget_every must be >= 1, got 0"),
        ((set(), KEY, 1, 0, print), "max_len must be >= 1, got 0"),
        ((set(), KEY, 1, 128, 5), "slow must be callable, got 5"),
    ],
)
def test_bad_arguments_are_refused_by_name(args, match):
    with pytest.raises(InvalidArgumentError, match=match):
        TenantRule(*args)


def test_a_key_or_set_of_the_wrong_type_is_a_type_error():
    with pytest.raises(TypeError):
        TenantRule(set(), 5, 1, 128, print)
    with pytest.raises(TypeError):
        TenantRule(["a"], KEY, 1, 128, print)


def test_a_tenancy_and_its_rule_are_collected():
    _, t = make()
    gone = weakref.ref(t)
    del t
    gc.collect()
    assert gone() is None


def test_forgetting_changes_the_set_the_rule_reads():
    core, t = make(forget_every=3)
    known = t._known
    for rid, tenant in enumerate(["a", "c"]):  # each served (c leaves last: it stays)
        assert t.rule(request({KEY: tenant})) == tenant
        core.submit(rid, tenant, 10)
        assert core.pop() == rid
        core.finish(rid)
    assert known == {"a", "c"}
    t.rule(request({KEY: "b"}))  # due: a, idle, is forgotten
    assert t._known is known and known == {"b", "c"} and "a" not in core.clients()


values = st.sampled_from(
    [None, "", "x" * (MAX_TENANT_LEN + 1), "y" * MAX_TENANT_LEN, "acme", "beta", "gamma",
     "delta", 7, -3, True, 2.5, Name("acme"), Name(""), ("t",)]
)  # fmt: skip
extras = st.one_of(
    st.none(),
    st.just(["not", "a", "dict"]),
    st.builds(lambda v: {KEY: v}, values),
    st.just({}),
    st.builds(lambda v: Extra({KEY: v}), values),
)
loras = st.one_of(
    st.none(), st.just(SimpleNamespace()), st.builds(lambda v: SimpleNamespace(lora_name=v), values)
)
requests = st.builds(request, extras, loras, params=st.booleans())


@settings(max_examples=150, deadline=None)
@given(
    arrivals=st.lists(st.tuples(requests, st.integers(0, 3)), max_size=40),
    forget_every=st.integers(1, 5),
    max_tenants=st.integers(1, 4),
)
def test_the_rule_is_tenancy_arrive_of_the_fields(arrivals, forget_every, max_tenants):
    """Each arrival through the rule (A) and through ``arrive`` of its fields (B),
    served alike (``serve``: submitted, and some admitted and finished, so tenants go
    idle and are forgotten): the same tenants, tracked sets, counts and cores."""
    weights = {"gold": 2.0}
    a_core, a = make(forget_every=forget_every, max_tenants=max_tenants, weights=weights)
    b_core, b = make(forget_every=forget_every, max_tenants=max_tenants, weights=weights)
    for rid, (req, serve) in enumerate(arrivals):
        got = a.rule(req)
        want = b.arrive(vllm_tenant_fields(req, KEY))
        assert got == want and type(got) is type(want)
        assert a._known == b._known and a.rule.arrivals == b.rule.arrivals == rid + 1
        for core in (a_core, b_core):
            core.submit(rid, got, 10)
            for _ in range(serve):
                admitted = core.pop()
                if admitted is None:
                    break
                core.finish(admitted)
        assert sorted(map(str, a_core.clients())) == sorted(map(str, b_core.clients()))


def arriving(rid: int, req: SimpleNamespace) -> SimpleNamespace:
    """``req`` (the rule's two fields) as a vLLM request arriving at the queue."""
    req.request_id, req.num_prompt_tokens, req.priority = f"r{rid}", 10, 0
    return req


def submit_named(ad: vtc.adapter.Adapter, r: SimpleNamespace) -> None:
    """``r`` submitted under the tenant its rule, called from Python, names."""
    ad.requests.submit(r.request_id, r, ad.tenancy.rule(r), r.num_prompt_tokens, r.priority)


@settings(max_examples=100, deadline=None)
@given(
    arrivals=st.lists(
        st.one_of(requests, st.just(SimpleNamespace(lora_request=None))), max_size=30
    ),
    forget_every=st.integers(1, 4),
)
def test_the_queue_names_an_arrival_as_the_rule_called_from_python(arrivals, forget_every):
    """The vLLM queue given the rule (``WaitingQueue(tenant_of=rule)``) names each
    arrival's tenant with the rule's own code, called directly (A), as the rule called
    from Python before the same submit (B): the same tenants, errors (a request whose
    fields raise is neither counted nor submitted), counts and cores."""
    from vtc._core import WaitingQueue

    sides = []
    for _ in range(2):
        ad = vtc.adapter.Adapter(
            vtc.Scheduler(M=10_000), EngineConfig(tenant_key=KEY), forget_every=forget_every
        )
        sides.append(
            (ad, WaitingQueue(ad.requests, "RUNNING", "WAITING", tenant_of=ad.tenancy.rule))
        )
    (a, queue), (b, _) = sides
    for rid, req in enumerate(arrivals):
        req = arriving(rid, req)
        assert raised(queue.add_request, req) == raised(submit_named, b, req)
        assert a.tenancy.rule.arrivals == b.tenancy.rule.arrivals
        assert a.tenancy._known == b.tenancy._known
    assert [(t.key, t.tenant) for t in a.requests] == [(t.key, t.tenant) for t in b.requests]
    assert a.core.counters() == b.core.counters()
    assert a.core.active_clients() == b.core.active_clients()
