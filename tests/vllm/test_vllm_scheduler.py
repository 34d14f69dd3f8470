"""vtc.vllm against vLLM's real V1 Scheduler on CPU (no model is run).

Each test builds vLLM's scheduler as vLLM's own CPU tests do and plays the
model runner (``vllm_harness.step``). Expected charges are written out from
the rules: a request costs ``wp * (prompt - prefix-cache hit)`` once, when vLLM
admits it, plus ``wq`` per token it really produced.
"""

from __future__ import annotations

import json
from collections import deque
from pathlib import Path

import numpy as np
import pytest
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import RequestStatus
from vllm_harness import (
    BLOCK_SIZE,
    admitted,
    make_request,
    make_scheduler,
    model_output,
    run_until_idle,
    step,
    vllm_config,
)

import vtc
from vtc import reference
from vtc.adapter import Adapter, Requests, Tenancy
from vtc.vllm import (
    AsyncVTCScheduler,
    TenantTracingScheduler,
    VTCConfig,
    VTCRequestQueue,
    VTCScheduler,
    cached_prompt_tokens,
    parse_weights,
    resolve_tenant,
    tenant_fields,
)

WP, WQ = 1.0, 2.0


def assert_empty(s: VTCScheduler) -> None:
    """Nothing is left once every request finished or was aborted."""
    assert s.get_num_unfinished_requests() == 0 and not s.requests
    assert s.waiting.tracked() == 0
    assert s.vtc.num_waiting == 0
    assert s.vtc.num_running == 0
    assert s.vtc.occupancy == 0
    s.vtc._check_invariants()


def core_ids_consistent(s: VTCScheduler) -> None:
    """Every request vLLM runs is running in the core; every waiting one waits there."""
    s.vtc._check_invariants()
    assert s.waiting.num_aside == 0  # every request vLLM skipped was put back
    for request in s.running:
        assert s.vtc.status(s.waiting.core_id(request.request_id)) == "running"
    waiting = list(s.waiting)
    assert len(waiting) == len(s.waiting) == s.vtc.num_waiting
    for request in waiting:
        assert s.vtc.status(s.waiting.core_id(request.request_id)) == "waiting"


def test_replaces_waiting_queue_and_uses_kv_capacity(model_dir: str) -> None:
    s = make_scheduler(VTCScheduler, vllm_config(model_dir), num_blocks=123)
    assert isinstance(s, Scheduler)
    assert isinstance(s.waiting, VTCRequestQueue)
    assert s.vtc.M == 123 * BLOCK_SIZE
    assert s.vtc.policy == "vtc"
    assert (s.vtc.wp, s.vtc.wq) == (WP, WQ)
    with pytest.raises(IndexError):
        s.waiting.peek_request()
    assert not s.waiting and len(s.waiting) == 0
    a = make_scheduler(AsyncVTCScheduler, vllm_config(model_dir, async_scheduling=True))
    assert isinstance(a, AsyncScheduler) and isinstance(a.waiting, VTCRequestQueue)


def _reference_order(
    plan: list[tuple], weights: dict | None = None, band_weights: dict | None = None
) -> list[str]:
    """The admission order vtc.reference gives when each request runs alone to the end."""
    ref = reference.Scheduler(M=10**6, wp=WP, wq=WQ, band_weights=band_weights)
    for tenant, weight in (weights or {}).items():
        ref.set_weight(tenant, weight)
    for i, (tenant, prompt, *rest) in enumerate(plan):
        ref.submit(i, tenant, prompt, priority=rest[1] if len(rest) > 1 else 0)
    order = []
    while (rid := ref.pop()) is not None:
        ref.decode([rid], [plan[rid][2]])
        ref.finish(rid)
        order.append(plan[rid][0])
    return order


def test_tenants_drain_in_vtc_order(model_dir: str) -> None:
    # One request at a time, so vLLM's admission order is the policy's order.
    config = vllm_config(model_dir, max_num_seqs=1)
    plan = [("a", 40, 8)] * 4 + [("b", 20, 8)] * 3 + [("c", 60, 4)] * 3

    def drain(cls: type) -> tuple[list[str], object]:
        s = make_scheduler(cls, config)
        tenant_of = {}
        for tenant, prompt, max_tokens in plan:
            request = make_request(tenant, prompt, max_tokens)
            tenant_of[request.request_id] = tenant
            s.add_request(request)
        return [tenant_of[r] for r in run_until_idle(s)], s

    vtc_order, s = drain(VTCScheduler)
    fcfs_order, _ = drain(Scheduler)
    assert fcfs_order == [t for t, _, _ in plan]
    assert vtc_order == _reference_order(plan)
    assert vtc_order[:3] == ["a", "b", "c"]  # equal counters: oldest head first
    assert vtc_order != fcfs_order
    # Each tenant paid its prompts once and each generated token.
    expected: dict[str, float] = {}
    for tenant, prompt, max_tokens in plan:
        expected[tenant] = expected.get(tenant, 0.0) + WP * prompt + WQ * max_tokens
    assert s.tenant_services() == expected
    assert s.tenant_counters() == expected  # all backlogged from the start: no lift
    assert_empty(s)


def test_request_priorities_are_strict_bands_with_vtc_inside(model_dir: str) -> None:
    # vLLM's --scheduling-policy priority: one request at a time again.
    config = vllm_config(model_dir, max_num_seqs=1, policy="priority")
    plan = [("batch-a", 40, 8, 1)] * 3 + [("batch-b", 20, 8, 1)] * 3 + [("urgent", 30, 4, 0)] * 2

    def drain(cls: type) -> tuple[list[str], object]:
        s = make_scheduler(cls, config)
        tenant_of = {}
        for tenant, prompt, max_tokens, priority in plan:
            request = make_request(tenant, prompt, max_tokens, priority=priority)
            tenant_of[request.request_id] = tenant
            s.add_request(request)
        return [tenant_of[r] for r in run_until_idle(s)], s

    vtc_order, s = drain(VTCScheduler)
    stock_order, _ = drain(Scheduler)
    # stock: the band, then arrival; VTC: the band, then the least counter
    assert stock_order == ["urgent"] * 2 + ["batch-a"] * 3 + ["batch-b"] * 3
    assert vtc_order == _reference_order(plan)
    assert vtc_order[:2] == ["urgent", "urgent"]
    assert vtc_order[2:4] == ["batch-a", "batch-b"]  # fair shares inside the batch band
    expected: dict[str, float] = {}
    for tenant, prompt, max_tokens, _ in plan:
        expected[tenant] = expected.get(tenant, 0.0) + WP * prompt + WQ * max_tokens
    assert s.tenant_services() == expected
    assert_empty(s)


def test_priority_weights_let_the_bands_share_the_machine(model_dir: str, monkeypatch) -> None:
    # VTC_PRIORITY_WEIGHTS under --scheduling-policy priority: the bands take turns
    # by weight (here equal) instead of the urgent band first; VTC inside each.
    monkeypatch.setenv("VTC_PRIORITY_WEIGHTS", "0=1, 1=1")
    config = vllm_config(model_dir, max_num_seqs=1, policy="priority")
    plan = [("batch-a", 30, 8, 1)] * 2 + [("batch-b", 30, 8, 1)] * 2 + [("urgent", 30, 8, 0)] * 3
    s = make_scheduler(VTCScheduler, config)
    assert s.vtc.band_weights() == {0: 1.0, 1: 1.0}
    tenant_of = {}
    for tenant, prompt, max_tokens, priority in plan:
        request = make_request(tenant, prompt, max_tokens, priority=priority)
        tenant_of[request.request_id] = tenant
        s.add_request(request)
    order = [tenant_of[r] for r in run_until_idle(s)]
    assert order == _reference_order(plan, band_weights={0: 1.0, 1: 1.0})
    assert order[:4] == ["urgent", "batch-a", "urgent", "batch-b"]
    assert s.vtc.band_counters() == {}  # every request finished: no band state left
    assert_empty(s)


def run_counting_preemptions(s: VTCScheduler, requests: list) -> int:
    """Add ``requests`` and step ``s`` until idle (at most 500 steps), checking the
    core's ids each step; how many steps preempted something."""
    for r in requests:
        s.add_request(r)
    preempted_steps = 0
    for _ in range(500):
        if not s.has_requests():
            break
        output, _ = step(s)
        preempted_steps += bool(output.preempted_req_ids)
        core_ids_consistent(s)
    return preempted_steps


def test_priority_preemption_evicts_the_batch_band_and_never_charges_twice(
    model_dir: str,
) -> None:
    # As test_preemption_does_not_charge_twice, under vLLM's priority policy: vLLM
    # evicts the least urgent running request, possibly one scheduled this step.
    config = vllm_config(model_dir, max_num_seqs=3, policy="priority")
    s = make_scheduler(VTCScheduler, config, num_blocks=12)
    plan = (("a", 1), ("b", 1), ("u", 0))
    requests = [make_request(t, 48, 48, priority=p) for t, p in plan]
    preempted_steps = run_counting_preemptions(s, requests)
    assert preempted_steps > 0
    assert requests[2].num_preemptions == 0  # the urgent request is never the victim
    assert requests[0].num_preemptions + requests[1].num_preemptions > 0
    assert_empty(s)
    assert s.tenant_services() == {t: WP * 48 + WQ * 48 for t in "abu"}


def test_the_queue_answers_from_its_cache_and_never_a_stale_one(
    model_dir: str, cache_checks: dict[str, int]
) -> None:
    """vLLM's peeks, pops, ``bool`` and ``len`` of the queue are answered from
    ``Requests``' cache when nothing changed (issue 20, item 4), through
    preemptions, priority bands and a counter raised between steps; the
    ``cache_checks`` fixture fails the test on any stale answer."""
    config = vllm_config(model_dir, max_num_seqs=3, policy="priority")
    s = make_scheduler(VTCScheduler, config, num_blocks=12)
    plan = (("a", 1), ("b", 1), ("u", 0), ("a", 1), ("b", 0), ("c", 1))
    requests = [make_request(t, 48, 48, priority=p) for t, p in plan]
    for r in requests[:3]:
        s.add_request(r)
    step(s)
    s.vtc.raise_counter("a", 1e6)  # as a shared counters' sync does between passes
    assert run_counting_preemptions(s, requests[3:]) > 0
    assert cache_checks["pop"] > 0 and cache_checks["num_waiting"] > 0
    assert_empty(s)


def test_batch_of_several_tenants_is_consistent_each_step(model_dir: str) -> None:
    s = make_scheduler(VTCScheduler, vllm_config(model_dir, max_num_seqs=3))
    requests = [make_request(t, 24 + 8 * i, 5 + i) for i, t in enumerate("aabbbcca" * 2)]
    for r in requests:
        s.add_request(r)
    for _ in range(200):
        if not s.has_requests():
            break
        step(s)
        core_ids_consistent(s)
    assert_empty(s)
    expected: dict[str, float] = {}
    for r in requests:
        tenant = r.sampling_params.extra_args["tenant"]
        expected[tenant] = (
            expected.get(tenant, 0.0) + WP * r.num_prompt_tokens + WQ * (r.max_tokens)
        )
        assert r.num_output_tokens == r.max_tokens
    assert s.tenant_services() == pytest.approx(expected)


def test_core_ids_that_collide_are_moved_and_charged_the_same(model_dir: str, monkeypatch) -> None:
    """A request's core id is vtc.key_id(its vLLM id); one taken by a live
    request moves to the next free id (kept in an override map), which the
    step's charging consults. With every id taken on arrival, every request
    moves, and the charges are the same, each step in one decode_outputs call."""
    slow_steps = []  # the per-output path: a step decode_outputs could not charge
    charge_keys = Requests.charge_keys
    monkeypatch.setattr(
        Requests, "charge_keys", lambda q, p: slow_steps.append(1) or charge_keys(q, p)
    )
    ids = [f"collide-{i}" for i in range(5)]

    def run(taken: bool) -> tuple[dict[str, float], VTCScheduler, int]:
        # 12 blocks: requests are preempted and re-admitted too.
        s = make_scheduler(VTCScheduler, vllm_config(model_dir, max_num_seqs=3), num_blocks=12)
        queue = s.waiting
        squatter = object()
        if taken:  # as if live requests held each id (they hold no state in the core)
            for request_id in ids:
                queue.requests._by_rid[vtc.key_id(request_id)] = squatter
        for i, (request_id, tenant) in enumerate(zip(ids, "abcab")):
            s.add_request(make_request(tenant, 40 + 4 * i, 40, request_id=request_id))
        most_moved = 0
        for _ in range(500):
            if not s.has_requests():
                break
            step(s)
            core_ids_consistent(s)
            most_moved = max(most_moved, len(queue.requests.overrides))
        for rid in [r for r, e in queue.requests._by_rid.items() if e is squatter]:
            del queue.requests._by_rid[rid]
        return s.tenant_services(), s, most_moved

    expected, _, moved = run(taken=False)
    assert moved == 0
    services, s, moved = run(taken=True)
    assert moved == len(ids)
    assert services == expected
    assert_empty(s)
    # forgotten with their requests
    assert not s.waiting.requests.overrides and not s.waiting.requests._by_rid
    assert not slow_steps  # every step was charged by one decode_outputs call


def test_returning_tenant_is_lifted_to_the_floor(model_dir: str) -> None:
    config = vllm_config(model_dir, max_num_seqs=1)
    s = make_scheduler(VTCScheduler, config)
    for _ in range(8):
        s.add_request(make_request("steady", 32, 8))
    # "late" was served long ago, then went quiet.
    s.add_request(make_request("late", 32, 8))
    order = []
    for _ in range(40):
        output, _ = step(s)
        order += admitted(output)
    assert s.tenant_services()["late"] == WP * 32 + WQ * 8
    steady_before = s.vtc.counter("steady")
    assert steady_before > 3 * s.vtc.counter("late")  # idle credit, not to be banked
    burst = [make_request("late", 32, 8) for _ in range(4)]
    for r in burst:
        s.add_request(r)
    # Lifted on arrival to the least counter among backlogged tenants: steady's.
    assert s.vtc.counter("late") == steady_before
    late_ids = {r.request_id for r in burst}
    order = run_until_idle(s)
    tags = ["L" if r in late_ids else "S" for r in order]
    # Without the lift, the four "late" requests would all go first (least counter first);
    # lifted, they alternate with "steady" from the floor.
    assert tags[:4] != ["L"] * 4
    assert tags[:6].count("L") == 3
    assert_empty(s)


def test_preemption_does_not_charge_twice(model_dir: str) -> None:
    # 12 blocks of 16 tokens: three requests growing to 96 tokens (6 blocks) cannot all fit.
    config = vllm_config(model_dir, max_num_seqs=3)
    s = make_scheduler(VTCScheduler, config, num_blocks=12)
    requests = [make_request(t, 48, 48) for t in ("a", "b", "c")]
    preempted_steps = run_counting_preemptions(s, requests)
    assert preempted_steps > 0
    assert sum(r.num_preemptions for r in requests) > 0
    assert_empty(s)
    assert s.tenant_services() == {t: WP * 48 + WQ * 48 for t in "abc"}


def test_abort_leaves_no_state_and_charges_nothing_unserved(model_dir: str) -> None:
    s = make_scheduler(VTCScheduler, vllm_config(model_dir, max_num_seqs=2))
    running = [make_request("a", 32, 50), make_request("b", 32, 50)]
    waiting = [make_request("c", 32, 50), make_request("a", 32, 50)]
    for r in running + waiting:
        s.add_request(r)
    for _ in range(3):
        step(s)
    assert {r.request_id for r in s.running} == {r.request_id for r in running}
    assert len(s.waiting) == 2
    aborted = s.finish_requests(
        [running[0].request_id, waiting[0].request_id], RequestStatus.FINISHED_ABORTED
    )
    assert len(aborted) == 2
    assert s.waiting.entry(running[0].request_id) is None
    assert s.waiting.entry(waiting[0].request_id) is None
    core_ids_consistent(s)
    assert s.tenant_services()["c"] == 0.0  # aborted before admission: never charged
    assert s.tenant_services()["a"] == WP * 32 + WQ * 3  # prompt + the 3 tokens it got
    # An unknown or already-finished id is ignored, as by vLLM.
    assert s.finish_requests([running[0].request_id, "nope"], RequestStatus.FINISHED_ABORTED) == []
    s.finish_requests(None, RequestStatus.FINISHED_ABORTED)  # abort everything
    assert_empty(s)


def test_prefix_cache_hit_charges_only_computed_tokens(model_dir: str) -> None:
    config = vllm_config(model_dir, max_num_seqs=4, enable_prefix_caching=True)
    s = make_scheduler(VTCScheduler, config)
    prompt = [11 + (7 * j) % 400 for j in range(80)]  # 5 full blocks
    first = make_request("a", prompt=prompt, max_tokens=4)
    s.add_request(first)
    run_until_idle(s)
    assert s.tenant_services()["a"] == WP * 80 + WQ * 4

    full = make_request("b", prompt=prompt, max_tokens=4)
    half = make_request("c", prompt=prompt[:40] + [500] * 40, max_tokens=4)
    s.add_request(full)
    s.add_request(half)
    output, _ = step(s)
    hits = {r.req_id: r.num_computed_tokens for r in output.scheduled_new_reqs}
    # vLLM recomputes at least the last prompt token: 4 of 5 blocks hit; 2 blocks for c.
    assert hits == {full.request_id: 64, half.request_id: 32}
    run_until_idle(s)
    services = s.tenant_services()
    assert services["b"] == WP * (80 - 64) + WQ * 4
    assert services["c"] == WP * (80 - 32) + WQ * 4
    assert_empty(s)


def test_preempted_request_with_prefix_cache_is_not_charged_again(model_dir: str) -> None:
    config = vllm_config(model_dir, max_num_seqs=3, enable_prefix_caching=True)
    s = make_scheduler(VTCScheduler, config, num_blocks=12)
    requests = [make_request(t, 48, 48) for t in ("a", "b", "c")]
    for r in requests:
        s.add_request(r)
    run_until_idle(s)
    assert sum(r.num_preemptions for r in requests) > 0
    assert s.tenant_services() == {t: WP * 48 + WQ * 48 for t in "abc"}
    assert_empty(s)


def test_speculative_tokens_are_charged_as_produced(model_dir: str) -> None:
    s = make_scheduler(VTCScheduler, vllm_config(model_dir, max_num_seqs=4))
    requests = [make_request("a", 16, 10), make_request("b", 16, 7)]
    for r in requests:
        s.add_request(r)
    step(s, tokens_per_step=3)
    assert s.tenant_services() == {"a": WP * 16 + WQ * 3, "b": WP * 16 + WQ * 3}
    run_until_idle(s, tokens_per_step=3)
    # 10 = 3+3+3+1 and 7 = 3+3+1: vLLM trims at max_tokens and only what it kept is charged.
    assert s.tenant_services() == {"a": WP * 16 + WQ * 10, "b": WP * 16 + WQ * 7}
    assert [r.num_output_tokens for r in requests] == [10, 7]
    assert_empty(s)


def test_skipped_pops_are_not_charged(model_dir: str) -> None:
    # max_loras=1: while adapter x runs, vLLM pops adapter y's requests and puts them back.
    s = make_scheduler(VTCScheduler, vllm_config(model_dir, max_num_seqs=4, max_loras=1))
    xs = [make_request(None, 32, 6, lora="x") for _ in range(2)]
    ys = [make_request(None, 32, 6, lora="y") for _ in range(2)]
    for r in xs + ys:
        s.add_request(r)
    output, _ = step(s)
    assert set(admitted(output)) == {r.request_id for r in xs}
    assert {r.request_id for r in s.deferred_waiting} == {r.request_id for r in ys}  # skipped
    assert s.tenant_services() == {"x": 2 * (WP * 32 + WQ), "y": 0.0}
    core_ids_consistent(s)
    assert len(s.waiting) == 2
    for _ in range(3):  # skipped again every step, still free
        step(s)
        assert s.tenant_services()["y"] == 0.0
        core_ids_consistent(s)
    run_until_idle(s)
    assert s.tenant_services() == {t: 2 * (WP * 32 + WQ * 6) for t in "xy"}
    assert_empty(s)


def test_a_pop_takes_the_head_its_peek_named_unless_the_queue_changed_between() -> None:
    """In a scheduling pass, ``pop_request`` takes the head ``peek_request`` named
    (vLLM peeks, then pops; both ask the core natively); a change in between (here
    an arrival in a more urgent band, which goes ahead) makes it the new head."""
    core = vtc.Scheduler(M=1000)
    adapter = Adapter(core, VTCConfig())
    q = VTCRequestQueue(core, lambda r: r.sampling_params.extra_args["tenant"], adapter.requests)
    a1, a2, b1 = make_request("a", 10), make_request("a", 20), make_request("b", 30, priority=-1)
    q.add_request(a1)
    q.add_request(a2)
    with adapter.selecting():
        assert q.peek_request() is a1
        assert q.pop_request() is a1 and q._pending.request is a1
        a1.status = RequestStatus.RUNNING
        assert q.peek_request() is a2  # (a1 settled: admitted)
        q.add_request(b1)
        assert q.pop_request() is b1  # not a2, the head before the arrival
    assert core.status(q.core_id(a2.request_id)) == "waiting"


def test_schedule_holds_a_pass_while_shared_counters_or_a_lookup_need_one(
    model_dir: str, monkeypatch
) -> None:
    """``schedule()`` runs vLLM's step inside the adapter's scheduling pass (its
    selection lock held from the first question to the last) while shared counters
    or a prefix lookup need one, with the shared counters' pass edges at both ends,
    and without it otherwise; asked every step, so sharing started or stopped, or a
    lookup set or removed, after the scheduler was built is obeyed at once."""
    monkeypatch.setenv("VTC_LOCALITY_QUANTUM", "64")  # (a lookup can be installed)
    s = make_scheduler(VTCScheduler, vllm_config(model_dir, max_num_seqs=2))
    adapter, lock = s.vtc_adapter, s.vtc_adapter.selection_lock
    adapter.set_prefix_lookup(None)
    assert adapter.sharing is None and adapter.prefix_lookup is None
    held: list[bool] = []
    frozen: list[bool] = []

    class Probe(VTCRequestQueue):  # (the queue's class swapped: same layout)
        def __bool__(self) -> bool:
            held.append(lock._is_owned())
            lookup = adapter.prefix_lookup
            frozen.append(lookup is not None and lookup.frozen)
            return super().__bool__()

    s.waiting.__class__ = Probe
    edges: list[bool] = []

    class Edges:  # stands in for SharedCounterSync's pass edges
        def pass_edge(self) -> None:
            edges.append(lock._is_owned())

    def held_in_a_step() -> bool:
        held.clear()
        s.add_request(make_request("a", 16, 4))
        step(s)
        assert held and len(set(held)) == 1, held  # (asked at least once, one answer)
        assert not lock._is_owned()
        return held[0]

    assert not held_in_a_step()
    adapter.sharing = Edges()
    assert held_in_a_step()
    assert edges == [True, True]  # at both edges, the lock held
    adapter.sharing = None
    assert not held_in_a_step() and len(edges) == 2
    lookup = adapter.set_prefix_lookup(lambda request: 0, source="a test")
    assert lookup is not None
    frozen.clear()
    assert held_in_a_step()
    assert frozen and all(frozen) and not lookup.frozen  # (frozen in, thawed out)
    adapter.set_prefix_lookup(None)
    assert not held_in_a_step()
    run_until_idle(s)
    assert s.tenant_services()["a"] > 0
    assert_empty(s)


def test_provisional_pop_is_settled_by_what_vllm_did(model_dir: str) -> None:
    core = vtc.Scheduler(M=1000)
    q = VTCRequestQueue(core, lambda r: r.sampling_params.extra_args["tenant"])
    a1, b1, a2 = make_request("a", 10), make_request("b", 30), make_request("a", 20)
    for r in (a1, b1, a2):
        q.add_request(r)
    assert q.peek_request() is a1
    assert q.pop_request() is a1  # vLLM skips it (e.g. grammar not compiled yet)
    assert q.peek_request() is b1  # settled as skipped: a1 is set aside, uncharged
    assert core.service("a") == 0.0 and len(q) == 2
    assert [r.request_id for r in q] == [b1.request_id, a2.request_id]
    q.prepend_requests(deque([a1]))  # put back at the end of vLLM's pass
    # nothing charged, nobody lifted, and a1 is back in its place
    assert len(q) == 3 and core.counters() == {"a": 0.0, "b": 0.0}
    assert q.peek_request() is a1  # the oldest head of two tenants at counter 0
    assert q.pop_request() is a1
    q.prepend_requests(deque([a1]))  # skipped again in the same pass: still free
    assert core.counters() == {"a": 0.0, "b": 0.0}
    assert q.pop_request() is a1  # vLLM admits it with a 4-token prefix-cache hit
    a1.status = RequestStatus.RUNNING
    a1.num_computed_tokens = 4
    assert q.peek_request() is b1  # settled: admitted
    assert core.service("a") == 10 - 4
    assert q.pop_request() is b1  # admitted with a 16-token prefix-cache hit
    b1.status = RequestStatus.RUNNING
    b1.num_computed_tokens = 16
    assert len(q) == 1  # settled: admitted
    assert core.service("b") == 30 - 16 and core.status(q.core_id(b1.request_id)) == "running"
    q.prepend_request(b1)  # preempted: back, never charged again
    assert core.status(q.core_id(b1.request_id)) == "waiting"
    assert q.pop_request() is a2  # a (6) is ahead of b (14)
    a2.status = RequestStatus.RUNNING
    q.settle()
    assert core.service("a") == 6 + 20
    assert q.pop_request() is b1  # b1 comes back, recomputed from scratch
    b1.num_computed_tokens = 0
    q.settle()
    assert core.service("b") == 30 - 16
    q.prepend_request(a1)  # preempted
    q.charge({b1.request_id: 3, a1.request_id: 2})  # a1 is waiting: owed, not charged yet
    assert core.service("b") == 30 - 16 + 2 * 3 and core.service("a") == 26
    assert q.pop_request() is a1
    a1.status = RequestStatus.RUNNING
    q.settle()
    assert core.service("a") == 26 + 2 * 2  # owed tokens charged on re-admission, prompt not
    q.remove_requests([a1, b1, a2])
    assert q.tracked() == 0 and core.num_waiting == 0 and core.num_running == 0


def test_a_skipped_tenant_keeps_its_counter_and_place() -> None:
    """vLLM pops tenant a's only request and skips it while b is backlogged at a
    higher counter: put back, a is neither charged nor lifted to b's counter (as
    a re-submission would be), and it is still first in line."""
    core = vtc.Scheduler(M=1000)
    q = VTCRequestQueue(core, lambda r: r.sampling_params.extra_args["tenant"])
    b1, a1 = make_request("b", 30), make_request("a", 10)
    q.add_request(b1)
    q.add_request(a1)
    core.raise_counter("b", 100.0)  # b was served more: a goes first
    before = core.counters()
    for _ in range(3):  # skipped in three passes
        assert q.pop_request() is a1
        q.prepend_requests(deque([a1]))
        assert core.counters() == before
        assert q.peek_request() is a1
    assert q.pop_request() is a1
    a1.status = RequestStatus.RUNNING
    assert q.pop_request() is b1  # settles a1: admitted, charged its prompt once
    assert core.service("a") == 10.0 and core.counter("a") == before["a"] + 10.0


def test_record_outputs_fast_and_slow_paths_charge_the_same() -> None:
    """One step's outputs: one token each (the fast path), an id repeated (the
    core rejects the batch, the slow path merges), several tokens, a request
    unknown here, a finished one."""
    from types import SimpleNamespace

    def out(request, n, finished=False):
        return SimpleNamespace(
            request_id=request.request_id,
            new_token_ids=[7] * n,
            finish_reason="stop" if finished else None,
        )

    core = vtc.Scheduler(M=10_000)
    q = VTCRequestQueue(core, lambda r: r.sampling_params.extra_args["tenant"])
    a, b, c = make_request("a", 10, 50), make_request("b", 10, 50), make_request("c", 10, 1)
    for r in (a, b, c):
        q.add_request(r)
        assert q.pop_request() is r
        r.status = RequestStatus.RUNNING
    q.settle()
    base = {t: core.service(t) for t in "abc"}
    step = SimpleNamespace
    q.record_outputs([step(outputs=[out(a, 1), out(b, 1)])])  # fast path
    assert core.service("a") - base["a"] == 2 and core.service("b") - base["b"] == 2
    q.record_outputs([step(outputs=[out(a, 1), out(a, 1), out(b, 1)])])  # id twice
    assert core.service("a") - base["a"] == 6 and core.service("b") - base["b"] == 4
    stranger = make_request("z", 5)
    q.record_outputs([step(outputs=[out(a, 3), out(stranger, 1)]), step(outputs=[out(b, 1)])])
    assert core.service("a") - base["a"] == 12 and core.service("b") - base["b"] == 6
    c.status = RequestStatus.FINISHED_STOPPED
    q.record_outputs([step(outputs=[out(c, 1, finished=True)])])
    assert core.service("c") - base["c"] == 2
    assert q.entry(c.request_id) is None and core.num_running == 2


def test_a_step_of_one_token_each_is_charged_without_reading_the_lists() -> None:
    """With the engine's set of prefilling requests empty when the step was
    scheduled, each request of a step without drafts decodes or finishes its
    prompt, whatever its scheduled tokens, and samples one token: the step is
    charged one token each from the lists' count alone, and lists that say
    otherwise are not read. With a request in the set, or a draft, the lists are
    read; with fewer outputs than running requests the step is read by id; a set
    that is not a set is refused."""
    from types import SimpleNamespace

    core = vtc.Scheduler(M=10_000)
    prefilling: set = set()
    q = VTCRequestQueue(core, lambda r: r.sampling_params.extra_args["tenant"], None, prefilling)
    assert q.prefilling is prefilling
    a, b = make_request("a", 10, 50), make_request("b", 10, 50)
    for r in (a, b):
        q.add_request(r)
        assert q.pop_request() is r
        r.status = RequestStatus.RUNNING
    q.settle()
    ids = [a.request_id, b.request_id]

    def step(tokens, *, total=2, drafts=None, chunk=()):
        """One step: scheduled with ``total`` tokens, ``drafts``, ``chunk`` still
        prefilling after it; the runner's ``tokens`` a request; each one's tokens
        charged."""
        before = {t: core.service(t) for t in "ab"}
        output = SimpleNamespace(
            num_scheduled_tokens=dict.fromkeys(ids, 1),
            total_num_scheduled_tokens=total,
            scheduled_spec_decode_tokens=drafts or {},
        )
        prefilling.update(chunk)
        q.scheduled(output, 2)
        prefilling.clear()
        lists = [[7] * n for n in tokens]
        outs = [
            SimpleNamespace(request_id=i, new_token_ids=t, finish_reason=None)
            for i, t in zip(ids, lists)
        ]
        runner = SimpleNamespace(sampled_token_ids=lists)
        q.record_step(output, runner, {0: SimpleNamespace(outputs=outs)}, None)
        return {t: (core.service(t) - before[t]) / core.wq for t in "ab"}  # tokens

    assert step([1, 1]) == {"a": 1, "b": 1}
    assert step([1, 2]) == {"a": 1, "b": 1}  # (lists not read: one token each)
    assert step([1, 2], chunk=[b]) == {"a": 1, "b": 2}  # read: a request prefilling
    assert step([1, 2], drafts={b.request_id: [7]}) == {"a": 1, "b": 2}  # read: drafts
    assert step([1, 2], total=9) == {"a": 1, "b": 1}  # (a prompt finished: one token)
    assert step([1]) == {"a": 1, "b": 0}  # one output, two running: read by id
    assert step([2, 2], drafts=dict.fromkeys(ids, [7])) == {"a": 2, "b": 2}  # read, uniform
    with pytest.raises(TypeError, match="prefilling must be a set"):
        VTCRequestQueue(core, str, None, [])


class _PerIdScheduler(VTCScheduler):
    """VTCScheduler that always charges by reading the outputs' ids."""

    def schedule(self, *args, **kwargs):
        output = super().schedule(*args, **kwargs)
        self.waiting.scheduled(output, 2**62)  # (never as many: never the uniform charge)
        return output


def test_uniform_steps_charge_as_reading_every_id(model_dir: str) -> None:
    """The uniform charge (``charge_outputs(running=True)``: ``decode_all``, no id
    read) against the same scheduler charging by id, on one seeded workload
    that mixes every kind of step: uniform (one token each, or two), prefill
    chunks (no output), finishes (the last token), preemptions, mixed counts
    (speculative decoding), aborts between ``schedule()`` and the update, and
    arrivals. Every tenant's counter and service, bit for bit, after every
    step; the uniform charge is taken on uniform steps only. A step in which
    a request samples more than one token is marked as vLLM marks it: with
    draft tokens (``scheduled_spec_decode_tokens``, all accepted)."""
    import random

    from vllm.v1.outputs import ModelRunnerOutput

    config = vllm_config(model_dir, max_num_seqs=8, max_num_batched_tokens=96)
    fast = make_scheduler(VTCScheduler, config, num_blocks=16)  # 256 tokens: preemptions
    slow = make_scheduler(_PerIdScheduler, config, num_blocks=16)
    rng = random.Random(5)
    arrivals = 0

    def arrive() -> None:
        nonlocal arrivals
        arrivals += 1
        tenant, prompt_len, rid = f"t{rng.randrange(4)}", rng.randint(8, 80), f"r{arrivals}"
        prompt = [3 + rng.randrange(500) for _ in range(prompt_len)]
        max_tokens = rng.choice((1, 2, rng.randint(3, 150)))
        for s in (fast, slow):
            s.add_request(make_request(tenant, 8, max_tokens, prompt=prompt, request_id=rid))

    for _ in range(12):
        arrive()
    assert fast.waiting.prefilling is fast._inflight_prefills  # (one-token steps unread)
    for s in (fast, slow):  # (drafts with no drafter: vLLM's statistics of them not kept)
        s.make_spec_decoding_stats = lambda stats, *args, **kwargs: stats
    kinds: dict[str, int] = {}
    preempted = finished = 0
    for n in range(400):
        kind = rng.choice(("one", "one", "one", "two", "mixed", "abort"))
        outputs = [s.schedule() for s in (fast, slow)]
        assert outputs[0].num_scheduled_tokens == outputs[1].num_scheduled_tokens
        preempted += len(outputs[0].preempted_req_ids or ())
        if kind == "abort" and fast.running:
            victim = rng.choice(fast.running).request_id
            for s in (fast, slow):
                s.finish_requests([victim], RequestStatus.FINISHED_ABORTED)
        ids = list(outputs[0].num_scheduled_tokens)
        counts = {"one": 1, "two": 2}
        sampled = []
        for rid in ids:
            k = counts.get(kind, rng.randint(1, 3))
            request = fast.requests.get(rid)  # None: aborted (vLLM skips its output)
            sampled.append([] if request is not None and request.is_prefill_chunk else [7] * k)
            if len(sampled[-1]) > 1:  # k - 1 drafts, each accepted
                for out in outputs:
                    out.scheduled_spec_decode_tokens[rid] = [7] * (k - 1)
        before = fast.waiting.requests.uniform_steps
        running = fast.vtc.num_running
        got = []
        for s, out in zip((fast, slow), outputs):
            runner = ModelRunnerOutput(
                req_ids=ids,
                req_id_to_index={r: i for i, r in enumerate(ids)},
                sampled_token_ids=[list(x) for x in sampled],
            )
            got.append([o for g in s.update_from_output(out, runner).values() for o in g.outputs])
        assert fast.tenant_counters() == slow.tenant_counters(), n
        assert fast.tenant_services() == slow.tenant_services(), n
        uniform = fast.waiting.requests.uniform_steps > before
        if uniform:  # an output from every running request, all of one count
            assert len(got[0]) == running == len(ids) and kind != "abort"
            assert len({len(o.new_token_ids) for o in got[0]}) == 1
        finished += sum(o.finish_reason is not None for o in got[0])
        kinds[f"{kind}:{uniform}"] = kinds.get(f"{kind}:{uniform}", 0) + 1
        for _ in range(rng.choice((0, 0, 1, 2))):
            arrive()
    for s in (fast, slow):
        core_ids_consistent(s)
    assert slow.waiting.requests.uniform_steps == 0
    # each kind of step was met, and uniform steps were charged both ways
    assert kinds["one:True"] and kinds["two:True"] and kinds["one:False"], kinds
    assert kinds["mixed:False"] and kinds["abort:False"], kinds
    assert preempted and finished, (preempted, finished)


def test_a_one_token_prefill_chunk_keeps_the_step_from_the_uniform_charge(model_dir: str) -> None:
    """A step without drafts is one token each only if no request is in a
    prefill chunk that leaves its prompt unfinished (vLLM's runner samples
    nothing for it), even when it gave each request one token. With a budget of
    one token more than the decoding requests take, each arriving long prompt is
    prefilled one token a step beside them: those steps are read by id, the
    steps in between charged as uniform without reading the runner's lists, and
    every tenant's counter and service is the by-id scheduler's, bit for bit,
    after every step."""
    from vllm.v1.outputs import ModelRunnerOutput

    config = vllm_config(model_dir, max_num_seqs=4, max_num_batched_tokens=4)
    fast = make_scheduler(VTCScheduler, config)
    slow = make_scheduler(_PerIdScheduler, config)
    assert fast.waiting.prefilling is fast._inflight_prefills

    def arrive(tenant: str, prompt_len: int, max_tokens: int, rid: str) -> None:
        prompt = [3 + (len(rid) * 7 + j * 13) % 500 for j in range(prompt_len)]
        for s in (fast, slow):
            request = make_request(tenant, max_tokens=max_tokens, prompt=prompt, request_id=rid)
            s.add_request(request)

    for i, tenant in enumerate("abc"):  # decoding throughout
        arrive(tenant, 1, 120, f"d{i}")
    kinds = dict.fromkeys(("chunk of one", "chunk, uniform", "decodes", "uniform"), 0)
    long_prompts = 0
    for n in range(110):
        if n % 20 == 0 and long_prompts < 4:  # prefilled one token a step
            long_prompts += 1
            arrive("p", 12, 3, f"p{long_prompts}")
        outputs = [s.schedule() for s in (fast, slow)]
        out = outputs[0]
        assert out.num_scheduled_tokens == outputs[1].num_scheduled_tokens
        ids = list(out.num_scheduled_tokens)
        chunk = [rid for rid in ids if fast.requests[rid].is_prefill_chunk]
        one_each = out.total_num_scheduled_tokens == len(ids)
        sampled = [[] if rid in chunk else [7] for rid in ids]
        before = fast.waiting.requests.uniform_steps
        for s, o in zip((fast, slow), outputs):
            runner = ModelRunnerOutput(
                req_ids=ids,
                req_id_to_index={r: i for i, r in enumerate(ids)},
                sampled_token_ids=[list(x) for x in sampled],
            )
            s.update_from_output(o, runner)
        assert fast.tenant_counters() == slow.tenant_counters(), n
        assert fast.tenant_services() == slow.tenant_services(), n
        uniform = fast.waiting.requests.uniform_steps > before
        if chunk:
            kinds["chunk of one"] += one_each
            kinds["chunk, uniform"] += uniform
        else:
            kinds["decodes"] += 1
            kinds["uniform"] += uniform
    assert slow.waiting.requests.uniform_steps == 0
    # each long prompt was prefilled one token a step beside three decodes, and
    # the steps of one token each with no prefill were charged as uniform
    assert kinds["chunk of one"] >= 4 * 10 and not kinds["chunk, uniform"], kinds
    assert kinds["uniform"] == kinds["decodes"] >= 40, kinds
    assert fast.tenant_services()["p"] == slow.tenant_services()["p"] > 0


def test_one_class_name_runs_as_vllms_scheduler_of_the_configured_mode(
    model_dir: str, monkeypatch
) -> None:
    """VTCScheduler is vLLM's AsyncScheduler under async scheduling, its Scheduler
    otherwise; AsyncVTCScheduler, the old name, is always the async one."""
    sync_config = vllm_config(model_dir)
    async_config = vllm_config(model_dir, async_scheduling=True)
    s = make_scheduler(VTCScheduler, sync_config)
    assert type(s) is VTCScheduler and not isinstance(s, AsyncScheduler)
    a = make_scheduler(VTCScheduler, async_config)
    assert type(a) is AsyncVTCScheduler
    assert isinstance(a, AsyncScheduler) and isinstance(a, VTCScheduler)
    assert isinstance(a.waiting, VTCRequestQueue) and a.vtc.policy == "vtc"
    for config in (sync_config, async_config):
        assert type(make_scheduler(AsyncVTCScheduler, config)) is AsyncVTCScheduler
    # The class vLLM's engine core builds for --scheduler-cls vtc.vllm.VTCScheduler
    for config, expected in ((sync_config, VTCScheduler), (async_config, AsyncVTCScheduler)):
        monkeypatch.setattr(config.scheduler_config, "scheduler_cls", "vtc.vllm.VTCScheduler")
        cls = config.scheduler_config.get_scheduler_cls()
        assert cls is VTCScheduler
        assert type(make_scheduler(cls, config)) is expected
    # vLLM passes its config by keyword; positionally it is the first argument
    assert vtc.vllm._async_scheduling((async_config,), {})
    assert not vtc.vllm._async_scheduling((sync_config,), {})


@pytest.mark.parametrize("cls", [VTCScheduler, AsyncVTCScheduler])
def test_async_scheduler_charges_every_token_once(model_dir: str, cls: type) -> None:
    config = vllm_config(model_dir, max_num_seqs=3, async_scheduling=True)
    s = make_scheduler(cls, config, num_blocks=12)
    assert isinstance(s, AsyncScheduler)
    requests = [make_request(t, 48, 40) for t in ("a", "b", "c", "a")]
    for r in requests:
        s.add_request(r)
    # The engine's async loop: schedule step N+1 before step N's output arrives.
    in_flight: deque = deque()
    for _ in range(2000):
        if not in_flight and not s.has_requests():
            break
        output = s.schedule()
        if output.num_scheduled_tokens:
            in_flight.append((output, model_output(s, output)))
        if len(in_flight) == 2 or (in_flight and not output.num_scheduled_tokens):
            done, result = in_flight.popleft()
            s.update_from_output(done, result)
            core_ids_consistent(s)
    assert not in_flight and not s.has_requests()
    assert sum(r.num_preemptions for r in requests) > 0
    assert [r.num_output_tokens for r in requests] == [40] * 4
    one = WP * 48 + WQ * 40
    assert s.tenant_services() == {"a": 2 * one, "b": one, "c": one}
    assert_empty(s)


@pytest.mark.parametrize("cls", [VTCScheduler, TenantTracingScheduler])
def test_tenant_trace(model_dir: str, tmp_path: Path, monkeypatch, cls: type) -> None:
    trace = tmp_path / "trace.jsonl"
    monkeypatch.setenv("VTC_TRACE_FILE", str(trace))
    monkeypatch.setenv("VTC_TRACE_INTERVAL", "0")  # a record every step
    s = make_scheduler(cls, vllm_config(model_dir, max_num_seqs=2))
    plan = [("a", 5), ("a", 5), ("b", 3), ("c", 4)]
    requests = [make_request(t, 16, n) for t, n in plan]
    for r in requests:
        s.add_request(r)
    order = run_until_idle(s)
    if cls is TenantTracingScheduler:  # vLLM's own FCFS, observed
        assert order == [r.request_id for r in requests]
        assert len(s.tally) == 0  # every request left its bookkeeping
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    assert len(records) >= 5
    assert records[0]["queued"] == {"a": 2, "b": 1, "c": 1}
    last = records[-1]
    assert last == {**last, "tokens": {"a": 10, "b": 3, "c": 4}, "queued": {}}
    assert sorted(last) == ["queued", "t", "time", "tokens"]
    times = [r["t"] for r in records]
    assert times == sorted(times)


@pytest.mark.parametrize("mode, on", [("auto", False), ("on", True)])
def test_per_tenant_metrics_say_what_the_core_charged(
    model_dir: str, monkeypatch, mode: str, on: bool
) -> None:
    """VTC_METRICS: auto is on only where vLLM's /metrics can show the series
    (PROMETHEUS_MULTIPROC_DIR; the e2e test scrapes a real server); on keeps
    them in this process's registry. The step that leaves vLLM idle refreshes
    them: the series end with every token."""
    from prometheus_client import REGISTRY

    monkeypatch.setenv("VTC_METRICS", mode)
    monkeypatch.setenv("VTC_METRICS_INTERVAL", "3600")  # only the idle step refreshes
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    s = make_scheduler(VTCScheduler, vllm_config(model_dir, max_num_seqs=2))
    assert (s.vtc_adapter.metrics is not None) == on
    if not on:
        return
    plan = [("a", 16, 5), ("a", 16, 5), ("b", 24, 3)]
    for tenant, prompt, max_tokens in plan:
        s.add_request(make_request(tenant, prompt, max_tokens))
    run_until_idle(s)

    def sample(name: str, **labels: str) -> float | None:
        return REGISTRY.get_sample_value(name, labels)

    for tenant in "ab":
        prompt = sum(p for t, p, _ in plan if t == tenant)
        decode = sum(n for t, _, n in plan if t == tenant)
        assert sample("vtc_tenant_service_tokens_total", tenant=tenant, kind="prompt") == prompt
        assert sample("vtc_tenant_service_tokens_total", tenant=tenant, kind="decode") == decode
        assert sample("vtc_tenant_counter", tenant=tenant) == s.tenant_counters()[tenant]
        assert sample("vtc_tenant_requests", tenant=tenant, state="running") == 0
    assert sample("vtc_tenants_active") == 0
    assert sample("vtc_fairness_bound") == 2 * max(WP * 24, WQ * s.vtc.M)


# -- tenants and configuration --------------------------------------------------


def test_tenant_comes_from_extra_args_then_lora_then_default() -> None:
    assert resolve_tenant(make_request("acme")) == "acme"
    assert resolve_tenant(make_request(42)) == "42"
    assert resolve_tenant(make_request(None, lora="adapter-1")) == "adapter-1"
    assert resolve_tenant(make_request("acme", lora="adapter-1")) == "acme"
    assert resolve_tenant(make_request(None)) is None
    assert resolve_tenant(make_request(extra_args={"org": "x"}), key="org") == "x"
    for bad in (True, 3.5, ["a"], {"a": 1}, "", "x" * 129, None):
        assert resolve_tenant(make_request(bad if bad is not None else None)) is None
        assert resolve_tenant(make_request(extra_args={"tenant": bad}, lora="L")) == "L"
    assert resolve_tenant(make_request("x" * 128)) == "x" * 128


def test_the_native_tenant_rule_names_what_tenant_fields_name(model_dir: str) -> None:
    """``Tenancy.rule`` (the common case native) names, for vLLM's own requests, the
    tenant ``Tenancy.arrive`` names from :func:`tenant_fields`, with the same tenants
    tracked; the scheduler's queue names arrivals by it."""
    cases = [
        make_request("acme"),
        make_request(42),
        make_request(None, lora="adapter-1"),
        make_request("acme", lora="adapter-1"),
        make_request(None),
        make_request(extra_args={"org": "x"}),
        make_request("x" * 128),
        make_request("x" * 129, lora="L"),
    ]
    for bad in (True, 3.5, ["a"], {"a": 1}, ""):
        cases += [make_request(bad), make_request(extra_args={"tenant": bad}, lora="L")]
    config = VTCConfig(max_tenants=4)
    native = Tenancy(vtc.Scheduler(1000), config, forget_every=3)
    fields = Tenancy(vtc.Scheduler(1000), config, forget_every=3)
    for r in cases * 2:  # the second time round, known tenants: the native answer
        assert native.rule(r) == fields.arrive(tenant_fields(r))
        assert native._known == fields._known
    assert native.rule.arrivals == fields.rule.arrivals == 2 * len(cases)
    s = make_scheduler(VTCScheduler, vllm_config(model_dir))
    assert s.waiting._tenant_of is s.vtc_tenancy.rule


def test_malformed_tenant_is_served_as_default(model_dir: str, monkeypatch) -> None:
    monkeypatch.setenv("VTC_TENANT_KEY", "org")
    s = make_scheduler(VTCScheduler, vllm_config(model_dir))
    good = make_request(extra_args={"org": "acme"}, prompt_len=10, max_tokens=2)
    bad = [
        make_request(extra_args={"org": {"nested": 1}}, prompt_len=10, max_tokens=2),
        make_request(extra_args={"org": "y" * 1000}, prompt_len=10, max_tokens=2),
        make_request(extra_args={"tenant": "ignored-key"}, prompt_len=10, max_tokens=2),
        make_request(None, prompt_len=10, max_tokens=2),
    ]
    for r in [good, *bad]:
        s.add_request(r)
    run_until_idle(s)
    assert all(r.status == RequestStatus.FINISHED_LENGTH_CAPPED for r in [good, *bad])
    assert s.tenant_services() == {"acme": 14.0, "default": 4 * 14.0}
    assert_empty(s)


def test_weights_from_env_and_file(model_dir: str, tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "weights.json"
    path.write_text(json.dumps({"gold": 4, "silver": 2}))
    monkeypatch.setenv("VTC_WEIGHTS_FILE", str(path))
    monkeypatch.setenv("VTC_WEIGHTS", "gold=3, free=0.5")
    s = make_scheduler(VTCScheduler, vllm_config(model_dir, max_num_seqs=1))
    assert s.vtc.weight("gold") == 3.0  # the variable wins over the file
    assert s.vtc.weight("silver") == 2.0
    assert s.vtc.weight("free") == 0.5
    s.add_request(make_request("gold", 30, 5))
    s.add_request(make_request("free", 30, 5))
    run_until_idle(s)
    assert s.tenant_services() == pytest.approx({"gold": 40 / 3, "silver": 0.0, "free": 80.0})
    assert s.tenant_counters()["gold"] == pytest.approx(40 / 3)


def test_a_changed_weights_file_is_reloaded_between_steps(
    model_dir: str, tmp_path: Path, monkeypatch
) -> None:
    """VTC_WEIGHTS_FILE is re-read when it changes (issue 17, item 3): the step that
    sees the change charges at the old weight, every later token at the new one."""
    path = tmp_path / "weights.json"
    path.write_text(json.dumps({"gold": 1}))
    monkeypatch.setenv("VTC_WEIGHTS_FILE", str(path))
    monkeypatch.setenv("VTC_WEIGHTS_RELOAD", "1e-9")  # check at every step
    s = make_scheduler(VTCScheduler, vllm_config(model_dir, max_num_seqs=1))
    s.add_request(make_request("gold", 30, 5))
    step(s)  # admitted: its prompt and first token at weight 1
    assert s.tenant_services()["gold"] == 30 + 2
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"gold": 4, "free": 0.5}))
    tmp.replace(path)
    step(s)
    assert (s.vtc.weight("gold"), s.vtc.weight("free")) == (4.0, 0.5)
    assert s.tenant_services()["gold"] == 32 + 2
    run_until_idle(s)
    assert s.tenant_services()["gold"] == 34 + 3 * 2 / 4
    path.write_text("{broken")  # a bad file keeps the weights in force
    s.add_request(make_request("gold", 8, 1))
    run_until_idle(s)
    assert s.vtc.weight("gold") == 4.0
    assert s.tenant_services()["gold"] == 35.5 + (8 + 2) / 4
    assert_empty(s)


def test_weighted_tenant_gets_proportional_admissions(model_dir: str, monkeypatch) -> None:
    monkeypatch.setenv("VTC_WEIGHTS", "gold=2")
    s = make_scheduler(VTCScheduler, vllm_config(model_dir, max_num_seqs=1))
    plan = [(t, 20, 10) for _ in range(12) for t in ("gold", "free")]
    tenant_of = {}
    for tenant, prompt, max_tokens in plan:
        r = make_request(tenant, prompt, max_tokens)
        tenant_of[r.request_id] = tenant
        s.add_request(r)
    order = [tenant_of[r] for r in run_until_idle(s)]
    assert order == _reference_order(plan, {"gold": 2.0})
    first = order[:12]
    assert first.count("gold") == 8 and first.count("free") == 4


def test_config_errors_are_loud() -> None:
    assert parse_weights(" a=2 ,b = 0.5,,") == {"a": 2.0, "b": 0.5}
    for bad in ("a", "a=", "a=0", "a=-1", "a=nan", "=2", "a=inf", "team=x=2", "a=2;b=1"):
        with pytest.raises(ValueError):
            parse_weights(bad)
    with pytest.raises(ValueError):
        VTCConfig.from_env({"VTC_WQ": "-1"})
    with pytest.raises(ValueError):
        VTCConfig.from_env({"VTC_MAX_TENANTS": "0"})
    config = VTCConfig.from_env({"VTC_TENANT_KEY": "org", "VTC_WP": "0.5", "VTC_WQ": "3"})
    assert (config.tenant_key, config.wp, config.wq) == ("org", 0.5, 3.0)


def test_weights_file_errors(tmp_path: Path) -> None:
    for content in ("[1, 2]", '{"a": "heavy"}', '{"a": 0}', "{not json"):
        path = tmp_path / "w.json"
        path.write_text(content)
        with pytest.raises(ValueError):
            VTCConfig.from_env({"VTC_WEIGHTS_FILE": str(path)})


def test_tenant_count_is_capped(model_dir: str, monkeypatch) -> None:
    monkeypatch.setenv("VTC_MAX_TENANTS", "2")
    s = make_scheduler(VTCScheduler, vllm_config(model_dir))
    for t in ("t1", "t2", "t3", "t4", "t1"):
        s.add_request(make_request(t, 10, 1))
    run_until_idle(s)
    assert s.tenant_services() == {"t1": 24.0, "t2": 12.0, "default": 24.0}


def test_idle_tenants_are_forgotten_so_the_cap_counts_active_ones(
    model_dir: str, monkeypatch
) -> None:
    monkeypatch.setenv("VTC_MAX_TENANTS", "2")
    s = make_scheduler(VTCScheduler, vllm_config(model_dir))
    for t in ("t1", "t2"):
        s.add_request(make_request(t, 10, 1))
    run_until_idle(s)
    # Both are idle now; the one that left the queue last stays (the lift's
    # reference), the other is forgotten when a new tenant needs room.
    s.add_request(make_request("t3", 10, 1))
    run_until_idle(s)
    assert "t3" in s.tenant_services()
    assert "default" not in s.tenant_services()
    assert len(s.vtc.clients()) <= 2
    s.vtc._check_invariants()


def test_decode_charges_take_numpy_arrays() -> None:
    core = vtc.Scheduler(M=100)
    core.submit(1, "a", 10)
    core.pop()
    core.decode(np.asarray([1], dtype=np.uint64), np.asarray([3], dtype=np.int64))
    assert core.service("a") == 10 + 2 * 3


def test_two_replicas_share_counters_through_redis(
    model_dir: str, monkeypatch, redis_server
) -> None:
    """VTC_REDIS_URL alone: two real vLLM schedulers (replicas) share counters. Tenant a
    runs only on r0, b on both, both backlogged: with shared counters r0 serves a ahead of
    b (b is served on r1 too); per replica it alternates them. Every charge reaches the
    store once, and shutdown takes the replicas' tenants out of the global backlog."""
    monkeypatch.setenv("VTC_SYNC_MODE", "step")
    monkeypatch.setenv("VTC_SYNC_INTERVAL", "1")
    config = vllm_config(model_dir, max_num_seqs=1)
    one = WP * 40 + WQ * 8
    first: dict[str, list[str]] = {}
    for mode in ("per-replica", "shared"):
        if mode == "shared":
            monkeypatch.setenv("VTC_REDIS_URL", redis_server.url)
        reps = []
        for name in ("r0", "r1"):
            monkeypatch.setenv("VTC_REPLICA_ID", name)
            reps.append(make_scheduler(VTCScheduler, config))
        r0, r1 = reps
        tenant_of = {}
        for tenant in ["b", "a"] * 4:
            request = make_request(tenant, 40, 8)
            tenant_of[request.request_id] = tenant
            r0.add_request(request)
        for _ in range(8):
            r1.add_request(make_request("b", 40, 8))
        order: list[str] = []
        for _ in range(10_000):  # the replicas step in turn, as replicas of equal speed
            if not (r0.has_requests() or r1.has_requests()):
                break
            if r0.has_requests():
                output, _ = step(r0)
                order += [tenant_of[r] for r in admitted(output)]
            if r1.has_requests():
                step(r1)
        first[mode] = order[:4]
        assert r0.tenant_services() == {"a": 4 * one, "b": 4 * one}
        assert r1.tenant_services() == {"b": 8 * one}
        if mode == "shared":
            store = r0.vtc_adapter.sharing.shared.store
            for s in (r0, r1):
                s.shutdown()
                assert not s.vtc_adapter.sharing.shared.degraded
            got = store.counters()
            assert got["b"] >= 12 * one and got["a"] >= 4 * one
            assert store.backlog() == {}
        else:
            assert r0.vtc_adapter.sharing is None
        assert_empty(r0)
        assert_empty(r1)
    assert first["per-replica"].count("a") == 2  # b, a, b, a
    assert first["shared"].count("a") >= 3, first


def test_data_parallel_ranks_get_their_own_replica_suffix() -> None:
    """vLLM rewrites a dense model's rank to one of one (size 1, rank 0); only
    data_parallel_index keeps the rank (the real server: tests/vllm/test_vllm_dp.py)."""
    from types import SimpleNamespace

    from vtc.vllm import data_parallel_suffix

    independent = SimpleNamespace(data_parallel_size=1, data_parallel_rank=0)
    assert (
        data_parallel_suffix(SimpleNamespace(**vars(independent), data_parallel_index=1)) == "-dp1"
    )
    assert data_parallel_suffix(SimpleNamespace(**vars(independent), data_parallel_index=0)) == ""
    assert (
        data_parallel_suffix(SimpleNamespace(data_parallel_size=2, data_parallel_rank=3)) == "-dp3"
    )
    assert data_parallel_suffix(None) == ""


@pytest.mark.parametrize("caching", [True, False])
def test_cached_prompt_tokens_is_the_hit_vllm_admits_with(model_dir: str, caching: bool) -> None:
    """The locality window's question to vLLM (issue 19): for a waiting request, the
    prefix-cache hit vLLM finds when it admits it, asked without side effects."""
    config = vllm_config(model_dir, max_num_seqs=4, enable_prefix_caching=caching)
    s = make_scheduler(VTCScheduler, config)
    prompt = [11 + (7 * j) % 400 for j in range(80)]  # 5 full blocks
    s.add_request(make_request("a", prompt=prompt, max_tokens=4))
    run_until_idle(s)

    waiting = [
        make_request("b", prompt=prompt, max_tokens=4),  # all cached: 4 blocks (5th recomputed)
        make_request("c", prompt=prompt[:40] + [500] * 40, max_tokens=4),  # 2 blocks
        make_request("d", prompt=prompt[:15] + [500] * 65, max_tokens=4),  # less than a block
        make_request("e", prompt_len=80, max_tokens=4),  # nothing shared
    ]
    for r in waiting:
        s.add_request(r)
    kvm = s.kv_cache_manager
    free = kvm.block_pool.get_num_free_blocks()
    asked = {r.request_id: cached_prompt_tokens(kvm, r) for r in waiting}
    again = {r.request_id: cached_prompt_tokens(kvm, r) for r in waiting}
    expected = [64, 32, 0, 0] if caching else [0, 0, 0, 0]
    assert list(asked.values()) == expected and again == asked
    assert kvm.block_pool.get_num_free_blocks() == free  # nothing allocated or touched
    assert all(type(n) is int for n in asked.values())
    output, _ = step(s)
    hits = {r.req_id: r.num_computed_tokens for r in output.scheduled_new_reqs}
    assert hits == asked  # exactly what vLLM admitted them with
    run_until_idle(s)
    assert_empty(s)
