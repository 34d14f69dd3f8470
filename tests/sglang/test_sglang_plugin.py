"""vtc.sglang against SGLang 0.5.23's real scheduler classes (see conftest.py)."""

from __future__ import annotations

import array
import json

import pytest
import torch
from conftest import arrive, make_req, make_scheduler, prefill_pass, step
from sglang.srt.managers.io_struct import AbortReq
from sglang.srt.managers.schedule_batch import FINISH_ABORT, ScheduleBatch
from sglang.srt.managers.schedule_policy import PrefillAdder, SchedulePolicy
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.mem_cache.base_prefix_cache import InsertParams
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey

import vtc.config as vc
import vtc.sglang as vs
from vtc.adapter import FORGET_EVERY


def core():
    return vs.get_state().core


def test_hooks_are_installed_on_sglang_classes() -> None:
    for fn in (
        Scheduler._add_request_to_queue,
        Scheduler._get_new_batch_prefill_raw,
        Scheduler.process_batch_result,
        Scheduler.abort_request,
        SchedulePolicy.calc_priority,
        PrefillAdder.add_one_req,
        ScheduleBatch.retract_decode,
    ):
        assert hasattr(fn, "__wrapped__"), fn


def test_tenants_drain_in_vtc_order() -> None:
    s = make_scheduler()
    a = [make_req("a", 8) for _ in range(4)]
    b = [make_req("b", 8) for _ in range(2)]
    arrive(s, *a, *b)  # SGLang's FCFS order would be a0 a1 a2 a3 b0 b1
    admitted = prefill_pass(s)
    # least counter first, ties to the older head: a0 (a=8), b0 (b=8), a1, b1, a2, a3
    assert admitted == [a[0], b[0], a[1], b[1], a[2], a[3]]
    assert core().counters() == {"a": 32.0, "b": 16.0}
    assert s.waiting_queue == [] and core().num_waiting == 0 and core().num_running == 6


def test_admission_stops_at_the_core_choice_without_skipping() -> None:
    s = make_scheduler()
    s.max_prefill_tokens = 20  # room for two 8-token prompts per pass
    a = [make_req("a", 8) for _ in range(3)]
    b = [make_req("b", 8) for _ in range(3)]
    arrive(s, *a, *b)
    assert prefill_pass(s) == [a[0], b[0]]
    assert prefill_pass(s) == [a[1], b[1]]
    # the queue SGLang keeps now starts with the core's next choice
    assert s.waiting_queue[0] is a[2] and core().peek() == vs.get_state().request_id(a[2])


@pytest.mark.parametrize("low_first", [True, False])
def test_request_priorities_are_strict_bands_with_vtc_inside(low_first: bool) -> None:
    """--enable-priority-scheduling: the urgent band first, whichever way SGLang orders
    priority values; inside the batch band, the least counter (not arrival)."""
    from sglang.srt.managers.schedule_policy import SchedulePolicy

    s = make_scheduler()
    s.enable_priority_scheduling = True
    s.schedule_low_priority_values_first = low_first
    s.policy = SchedulePolicy("fcfs", s.tree_cache, False, True, low_first)
    s.max_prefill_tokens = 20  # room for two 8-token prompts per pass
    urgent_p, batch_p = (0, 5) if low_first else (5, 0)
    a = [make_req("a", 8, priority=batch_p) for _ in range(2)]
    b = [make_req("b", 8, priority=batch_p) for _ in range(2)]
    u = [make_req("u", 8, priority=urgent_p) for _ in range(2)]
    arrive(s, *a, *b, *u)
    assert prefill_pass(s) == u
    assert prefill_pass(s) == [a[0], b[0]]
    assert prefill_pass(s) == [a[1], b[1]]
    assert core().counters() == {"a": 16.0, "b": 16.0, "u": 16.0}


@pytest.mark.parametrize("low_first", [True, False])
def test_priority_weights_share_the_machine_between_bands(low_first: bool) -> None:
    """VTC_PRIORITY_WEIGHTS (SGLang's own priority values, either order): the bands
    take turns by weight instead of the urgent one first; inside each, VTC."""
    from sglang.srt.managers.schedule_policy import SchedulePolicy

    urgent_p, batch_p = (0, 5) if low_first else (5, 0)
    env = {"VTC_PRIORITY_WEIGHTS": f"{urgent_p}=1, {batch_p}=1"}
    vs.reset_state(vs.VtcState.from_env(env))
    s = make_scheduler()
    s.enable_priority_scheduling = True
    s.schedule_low_priority_values_first = low_first
    s.policy = SchedulePolicy("fcfs", s.tree_cache, False, True, low_first)
    s.max_prefill_tokens = 20  # room for two 8-token prompts per pass
    a = [make_req("a", 8, priority=batch_p) for _ in range(3)]
    b = [make_req("b", 8, priority=batch_p) for _ in range(3)]
    u = [make_req("u", 8, priority=urgent_p) for _ in range(2)]
    arrive(s, *a, *b, *u)
    order = 1 if low_first else -1
    assert core().band_weights() == {order * urgent_p: 1.0, order * batch_p: 1.0}
    # band counters tie at 0: the more urgent band, then the batch band, in turns
    assert prefill_pass(s) == [u[0], a[0]]
    assert prefill_pass(s) == [u[1], b[0]]
    assert prefill_pass(s) == [a[1], b[1]]
    assert core().band_counters() == {order * urgent_p: 16.0, order * batch_p: 32.0}


def test_priorities_are_ignored_without_priority_scheduling() -> None:
    """SGLang ignores a request's priority unless priority scheduling is on; so does VTC."""
    s = make_scheduler()
    s.max_prefill_tokens = 20
    a = [make_req("a", 8, priority=5) for _ in range(2)]
    u = make_req("u", 8, priority=0)
    arrive(s, *a, u)
    assert prefill_pass(s) == [a[0], u]


def test_decode_is_charged_from_process_batch_result() -> None:
    s = make_scheduler()
    a, b = make_req("a", 4), make_req("b", 4)
    arrive(s, a, b)
    running = prefill_pass(s)
    assert core().counters() == {"a": 4.0, "b": 4.0}
    s.model.tokens = {a.rid: 3}  # e.g. speculative decoding: 3 tokens in one step
    step(s, running)
    assert core().counter("a") == 4.0 + 2.0 * 3
    assert core().counter("b") == 4.0 + 2.0 * 1
    step(s, running)  # tokens already charged are never charged again
    assert core().counter("a") == 4.0 + 2.0 * 6
    assert core().generated(vs.get_state().request_id(a)) == 6


def test_the_trace_records_each_tenants_tokens_as_vllms_does(tmp_path) -> None:
    """VTC_TRACE_FILE: the same JSON-lines trace as vLLM's, written after a batch
    result; a waiting request's tokens count when they are charged, once."""
    path = tmp_path / "trace.jsonl"
    vs.reset_state(vs.VtcState.from_env({"VTC_TRACE_FILE": str(path), "VTC_TRACE_INTERVAL": "0"}))
    s = make_scheduler()
    a, b = make_req("a", 4), make_req("b", 4)
    arrive(s, a, b)
    running = prefill_pass(s)
    s.model.tokens = {a.rid: 3}
    step(s, running)
    step(s, running)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(records) == 2
    assert records[0]["tokens"] == {"a": 3, "b": 1} and records[0]["queued"] == {"a": 1, "b": 1}
    assert records[1]["tokens"] == {"a": 6, "b": 2}
    assert records[0]["t"] <= records[1]["t"]
    state = vs.get_state()
    gen = {state.tenant(r): state.core.generated(state.request_id(r)) for r in (a, b)}
    assert gen == records[1]["tokens"]  # the trace says what the core charged


def test_a_changed_weights_file_is_reloaded_after_a_batch(tmp_path) -> None:
    """VTC_WEIGHTS_FILE is re-read when it changes (issue 17, item 3): the batch that
    sees the change is charged at the old weight, the next ones at the new."""
    path = tmp_path / "weights.json"
    path.write_text(json.dumps({"a": 1}))
    env = {"VTC_WEIGHTS_FILE": str(path), "VTC_WEIGHTS_RELOAD": "1e-9"}
    vs.reset_state(vs.VtcState.from_env(env))
    s = make_scheduler()
    a = make_req("a", 4)
    arrive(s, a)
    running = prefill_pass(s)
    s.model.tokens = {a.rid: 3}
    step(s, running)
    assert core().counter("a") == 4 + 3 * 2.0
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"a": 2, "b": 0.5}))
    tmp.replace(path)
    step(s, running)
    assert (core().weight("a"), core().weight("b")) == (2.0, 0.5)
    assert core().counter("a") == 10 + 3 * 2.0
    path.write_text("[]")  # a bad file keeps the weights in force
    step(s, running)
    assert core().weight("a") == 2.0
    assert core().counter("a") == 16 + 3 * 2.0 / 2


@pytest.mark.parametrize("enabled", [True, False])
def test_per_tenant_metrics_follow_sglangs_enable_metrics(enabled: bool) -> None:
    """VTC_METRICS=auto: the series exist when SGLang serves metrics
    (--enable-metrics), in the registry its /metrics reads, and say what the
    core charged; without it there are none."""
    from prometheus_client import REGISTRY

    s = make_scheduler()
    s.metrics_reporter.enable_metrics = enabled
    s.max_total_num_tokens = 4096
    a, b = make_req("a", 4), make_req("b", 6)
    arrive(s, a, b)
    running = prefill_pass(s)
    s.model.tokens = {a.rid: 3}
    step(s, running)
    metrics = vs.get_state().adapter.metrics
    assert (metrics is not None) == enabled
    if not enabled:
        return
    metrics.refresh(vs.get_state().adapter)
    got = {
        (t, kind): REGISTRY.get_sample_value(
            "vtc_tenant_service_tokens_total", {"tenant": t, "kind": kind}
        )
        for t in "ab"
        for kind in ("prompt", "decode")
    }
    assert got == {("a", "prompt"): 4, ("a", "decode"): 3, ("b", "prompt"): 6, ("b", "decode"): 1}
    assert REGISTRY.get_sample_value("vtc_fairness_bound") == 2 * max(1.0 * 6, 2.0 * 4096)
    assert REGISTRY.get_sample_value("vtc_tenants_active") == 2


def test_a_batch_with_a_waiting_or_repeated_request_is_charged_request_by_request() -> None:
    """batch_done charges a batch in one core call; a batch the core refuses
    as a whole (a request in it twice, one not running) is charged request by
    request: each running request once, a waiting one when it runs again."""
    state = vs.VtcState()
    a, b, c = make_req("a", 4), make_req("b", 4), make_req("c", 4)
    for req in (a, b, c):
        state.enqueue(req)
    state.core.pop(cached_len=0)
    state.core.pop(cached_len=0)
    running = [r for r in (a, b, c) if state.status(r) == "running"]
    (waiting,) = [r for r in (a, b, c) if state.status(r) == "waiting"]
    x, y = running
    x.output_ids.extend([7, 7])
    y.output_ids.append(7)
    waiting.output_ids.extend([7] * 5)  # e.g. output it kept from before a retraction
    base = state.core.counters()
    state.batch_done([x, y, x, waiting])
    got = {t: state.core.counter(t) - base[t] for t in base}
    assert got == {state.tenant(x): 4.0, state.tenant(y): 2.0, state.tenant(waiting): 0.0}
    state.core.pop(cached_len=0)  # the waiting one runs now
    x.output_ids.append(7)
    state.batch_done([x, y, waiting])  # the common batch: one core call
    got = {t: state.core.counter(t) - base[t] for t in base}
    # the waiting one: its prompt at admission (4), then its 5 tokens once
    assert got == {state.tenant(x): 6.0, state.tenant(y): 2.0, state.tenant(waiting): 14.0}
    assert [state.core.generated(state.request_id(r)) for r in (x, y, waiting)] == [3, 1, 5]


def test_returning_tenant_is_placed_at_the_active_floor() -> None:
    s = make_scheduler()
    s.max_prefill_tokens = 10  # one 8-token prompt per pass
    a = [make_req("a", 8) for _ in range(6)]
    b = [make_req("b", 8) for _ in range(6)]
    c_old = make_req("c", 8)
    arrive(s, c_old)
    assert prefill_pass(s) == [c_old]
    s.model.finish.add(c_old.rid)
    step(s, [c_old])  # c finishes and goes idle with counter 8 + 2
    assert core().counter("c") == 10.0
    arrive(s, *a, *b)
    for _ in range(6):
        running = prefill_pass(s)
        step(s, running)
    floor = min(core().counter("a"), core().counter("b"))
    assert floor > 30.0  # a and b were served far beyond c's 10 while c was idle
    c_new = make_req("c", 8)
    arrive(s, c_new)
    assert core().counter("c") == floor  # lifted: no banked credit for idle time
    # c is not given a burst: the others are served before c is served twice
    more_c = [make_req("c", 8) for _ in range(3)]
    arrive(s, *more_c)
    order = []
    for _ in range(4):
        order += [vs.get_state().tenant(r) for r in prefill_pass(s)]
    assert order.count("c") <= 2 and set(order) == {"a", "b", "c"}


def test_prefix_cache_hit_is_not_charged() -> None:
    tc = RadixCache.create_simulated()
    s = make_scheduler(tc)
    shared = list(range(100, 132))  # a 32-token system prompt already in the cache
    key = RadixKey(token_ids=array.array("q", shared))
    tc.insert(InsertParams(key=key, value=torch.arange(32)))
    hit = make_req("a", tokens=shared + [1, 2, 3, 4, 5, 6, 7, 8])
    miss = make_req("b", tokens=list(range(500, 540)))
    arrive(s, hit, miss)
    assert set(prefill_pass(s)) == {hit, miss}
    assert hit.prefix_len == 32 and miss.prefix_len == 0
    assert core().counter("a") == 40.0 - 32.0  # only the 8 computed tokens
    assert core().counter("b") == 40.0


def test_abort_of_a_waiting_request_frees_its_state() -> None:
    s = make_scheduler()
    a, b, b2 = make_req("a"), make_req("b"), make_req("b")
    arrive(s, a, b, b2)
    state = vs.get_state()
    rid_a = state.request_id(a)
    Scheduler.abort_request(s, AbortReq(rid=a.rid))
    assert a not in s.waiting_queue
    assert core().status(rid_a) is None and state.request_id(a) is None
    assert core().num_waiting == 2 and state.tracked() == 2
    assert core().counter("a") == 0.0  # never admitted, never charged
    assert prefill_pass(s) == [b, b2]


def test_abort_of_a_running_request_frees_its_state() -> None:
    s = make_scheduler()
    a, b = make_req("a"), make_req("b")
    arrive(s, a, b)
    running = prefill_pass(s)
    a.to_finish = FINISH_ABORT()  # what abort_request does to a running request
    a.finished_reason, a.to_finish = a.to_finish, None
    step(s, running)
    state = vs.get_state()
    assert state.request_id(a) is None and core().num_running == 1 and state.tracked() == 1
    s.model.finish.add(b.rid)
    step(s, [b])
    assert state.tracked() == 0 and core().num_running == 0 and core().num_waiting == 0


def test_retraction_is_preemption_and_never_double_charged() -> None:
    s = make_scheduler()
    a, b = make_req("a", 8), make_req("b", 8)
    arrive(s, a, b)
    running = prefill_pass(s)
    s.model.tokens = {a.rid: 3, b.rid: 3}
    step(s, running)
    charged = core().counter("a")
    assert charged == 8.0 + 2.0 * 3
    # decode ran out of KV: SGLang retracts `a` (ScheduleBatch.retract_decode, hooked)
    # and puts it back through Scheduler._add_request_to_queue(is_retracted=True).
    vs._hook_retract_decode(lambda batch: ([a], 0.5, []), ScheduleBatch(reqs=running))
    a.reset_for_retract()
    Scheduler._add_request_to_queue(s, a, is_retracted=True)
    s.running_batch.reqs.remove(a)
    state = vs.get_state()
    assert core().status(state.request_id(a)) == "waiting" and s.waiting_queue == [a]
    assert core().counter("a") == charged  # retraction itself costs nothing
    assert prefill_pass(s) == [a]  # recomputed prompt + 3 outputs: not charged again
    assert core().counter("a") == charged
    s.model.tokens = {a.rid: 1}
    step(s, [a])
    assert core().counter("a") == charged + 2.0  # only the new token
    assert core().generated(state.request_id(a)) == 4


def test_retraction_without_the_retract_hook_is_also_preemption() -> None:
    """A running request that comes back through _add_request_to_queue by another path
    (e.g. priority preemption's preempt_list) is preempted, not submitted again."""
    s = make_scheduler()
    a = make_req("a", 8)
    arrive(s, a)
    prefill_pass(s)
    a.reset_for_retract()
    Scheduler._add_request_to_queue(s, a)
    assert core().status(vs.get_state().request_id(a)) == "waiting"
    prefill_pass(s)
    assert core().counter("a") == 8.0


def test_request_that_bypassed_the_arrival_hook_is_still_scheduled() -> None:
    s = make_scheduler()
    a, b = make_req("a"), make_req("b")
    arrive(s, a)
    s.waiting_queue.append(b)  # e.g. a disaggregation or grammar path we do not hook
    assert set(prefill_pass(s)) == {a, b}
    assert core().counter("b") == 8.0 and vs.get_state().tracked() == 2


@pytest.mark.parametrize(
    ("kwargs", "tenant"),
    [
        ({"tenant": "acme"}, "acme"),
        ({"tenant": 42}, "42"),
        ({"custom_params": {"tenant": "acme"}, "routing_key": "rk"}, "acme"),
        ({"routing_key": "rk", "lora_id": "lora-1"}, "rk"),
        ({"lora_id": "lora-1"}, "lora-1"),
        ({}, vs.DEFAULT_TENANT),
        ({"tenant": ""}, vs.DEFAULT_TENANT),
        ({"tenant": True}, vs.DEFAULT_TENANT),
        ({"tenant": {"nested": 1}}, vs.DEFAULT_TENANT),
        ({"tenant": ["x"], "routing_key": "rk"}, "rk"),  # malformed: treated as absent
        ({"tenant": "x" * (vc.MAX_TENANT_LEN + 1)}, vs.DEFAULT_TENANT),
        ({"tenant": "x" * vc.MAX_TENANT_LEN}, "x" * vc.MAX_TENANT_LEN),
    ],
)
def test_tenant_of_a_request(kwargs: dict, tenant: str) -> None:
    assert vs.tenant_of(make_req(**kwargs)) == tenant


def test_malformed_tenant_is_served_as_the_default_tenant() -> None:
    s = make_scheduler()
    bad = make_req({"not": "a name"})
    arrive(s, bad)
    assert prefill_pass(s) == [bad]
    assert core().counter(vs.DEFAULT_TENANT) == 8.0


def test_tenant_key_weights_and_prices_from_the_environment() -> None:
    state = vs.VtcState.from_env(
        {"VTC_TENANT_KEY": "org", "VTC_WEIGHTS": "gold=2, free=0.5", "VTC_WQ": "3"}
    )
    assert state.tenant(make_req(custom_params={"org": "gold", "tenant": "x"})) == "gold"
    assert state.core.weight("gold") == 2.0 and state.core.weight("free") == 0.5
    assert set(state.core.clients()) == {"gold", "free"}
    assert (state.core.wp, state.core.wq) == (1.0, 3.0)


@pytest.mark.parametrize(
    "env", [{"VTC_WEIGHTS": "gold=2,bad"}, {"VTC_WEIGHTS": "neg=-1"}, {"VTC_WP": "abc"}]
)
def test_malformed_configuration_stops_the_plugin_at_registration(env, monkeypatch) -> None:
    """The same rule as vLLM (vtc.config): never skipped, named in the error.
    ``register()`` builds the state (``get_state()``) before it hooks anything."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    vs.reset_state(None)
    with pytest.raises(vc.ConfigError, match=next(iter(env))):
        vs.get_state()
    vs.reset_state(vs.VtcState())


def test_weighted_tenant_gets_its_share() -> None:
    vs.reset_state(vs.VtcState(weights={"gold": 2.0}))
    s = make_scheduler()
    gold = [make_req("gold", 8) for _ in range(6)]
    free = [make_req("free", 8) for _ in range(6)]
    arrive(s, *gold, *free)
    s.max_prefill_tokens = 8 * 6 + 1
    admitted = [vs.get_state().tenant(r) for r in prefill_pass(s)]
    assert admitted.count("gold") == 4 and admitted.count("free") == 2


def test_a_request_sglang_skips_blocks_the_pass_instead_of_being_overtaken() -> None:
    """SGLang's loop `continue`s past a request whose LoRA adapter cannot be loaded;
    VTC does not let the next request overtake the core's choice (no skipping)."""
    s = make_scheduler()
    head, other = make_req("a", lora_id="adapter-x"), make_req("b")
    arrive(s, head, other)
    blocked = {head.rid}
    s.enable_lora = True
    s.can_schedule_lora_req = lambda req, _loras: req.rid not in blocked
    assert prefill_pass(s) == []
    assert core().num_running == 0 and core().counters() == {"a": 0.0, "b": 0.0}
    blocked.clear()  # the adapter slot frees up
    assert prefill_pass(s) == [head, other]


def test_many_tenants_are_kept_apart_and_idle_ones_forgotten() -> None:
    """Every tenant name keeps its own counter however many there are; idle
    tenants below the floor are forgotten every FORGET_EVERY arrivals."""
    vs.reset_state(vs.VtcState())
    s = make_scheduler()
    names = [f"t{i}" for i in range(FORGET_EVERY + 50)]
    for name in names[:20]:
        arrive(s, make_req(name))
    prefill_pass(s)
    assert set(core().clients()) >= set(names[:20])  # no name folded into another
    for req in list(s.running_batch.reqs):  # all aborted: 20 idle tenants at the floor
        vs.get_state().drop(req)
    assert core().num_running == 0
    for name in names[20:]:
        arrive(s, make_req(name))
    assert vs.DEFAULT_TENANT not in core().clients()
    assert core().num_clients < len(names)  # the sweep ran and forgot idle tenants


def test_active_tenants_are_capped_as_in_vllm() -> None:
    """VTC_MAX_TENANTS (vtc.adapter.Tenancy, shared with vLLM): while that many
    tenants are active, a further new tenant's requests share the default tenant."""
    vs.reset_state(vs.VtcState(max_tenants=2))
    s = make_scheduler()
    a, b, c = make_req("a"), make_req("b"), make_req("c")
    arrive(s, a, b, c)
    assert set(core().clients()) == {"a", "b", vs.DEFAULT_TENANT}
    assert vs.VtcState.from_env({"VTC_MAX_TENANTS": "3"}).tenancy.config.max_tenants == 3


@pytest.mark.parametrize("tp_size", [1, 2])
def test_shared_counters_from_the_environment(redis_server, tp_size: int) -> None:
    """VTC_REDIS_URL alone: the scheduler process starts sharing at its first prefill pass
    (not where the plugin is loaded) and every charge reaches the store; mirrored
    tensor-parallel ranks would pull different counters, so they do not share."""
    env = {"VTC_REDIS_URL": redis_server.url, "VTC_SYNC_MODE": "step", "VTC_SYNC_INTERVAL": "1"}
    vs.reset_state(vs.VtcState.from_env(env))
    state = vs.get_state()
    assert state.adapter.sharing is None  # nothing started before SGLang schedules
    s = make_scheduler()
    s.tp_size = tp_size
    a, b = make_req("a", 8), make_req("b", 12)
    arrive(s, a, b)
    running = prefill_pass(s)
    step(s, running)
    step(s, running)
    sharing = state.adapter.sharing
    if tp_size > 1:
        assert sharing is None
        return
    assert sharing is not None and sharing.shared.stats.syncs >= 2
    assert sharing.shared.store.counters() == core().services() == {"a": 8.0 + 4.0, "b": 16.0}
    state.adapter.close()
    vs.reset_state(vs.VtcState())


@pytest.mark.parametrize("dp_rank, replica", [(None, "pod"), (0, "pod"), (2, "pod-dp2")])
def test_data_parallel_schedulers_share_as_replicas_of_their_own(
    redis_server, dp_rank, replica
) -> None:
    """--dp-size N runs N scheduler processes from one environment: without a suffix
    they all synced under one VTC_REPLICA_ID (the store now renames the older one,
    with an error). Rank k > 0 appends -dp<k>, read from SGLang's runtime context."""
    from sglang.srt.runtime_context import get_parallel

    env = {
        "VTC_REDIS_URL": redis_server.url,
        "VTC_REPLICA_ID": "pod",
        "VTC_SYNC_MODE": "step",
        "VTC_SYNC_INTERVAL": "1",
    }
    vs.reset_state(vs.VtcState.from_env(env))
    state = vs.get_state()
    s = make_scheduler()
    arrive(s, make_req("a", 8))
    with get_parallel().override(dp_rank=dp_rank):  # as SGLang's DP controller spawns it
        step(s, prefill_pass(s))
    sharing = state.adapter.sharing
    assert sharing is not None and sharing.shared.replica_id == replica
    assert sharing.shared.store.replicas() == [replica]
    state.adapter.close()
    vs.reset_state(vs.VtcState())


@pytest.mark.parametrize("alone", [True, False])
def test_a_request_the_plugin_failed_to_track_is_still_served(
    monkeypatch, caplog, alone: bool
) -> None:
    """Submitting one request to the core fails at every try (a defect, a field the
    plugin chokes on): each hook that tries logs it and SGLang carries on. The request
    is never refused for being unknown to the core (the admission hook admits only the
    core's next choice): a pass whose ordering failed runs in SGLang's own order, so
    it is served, uncharged, alone or behind others; the others keep VTC's order and
    are charged."""
    real = vs.VtcState.enqueue

    def enqueue(self, req):
        if vs.tenant_of(req, self.tenant_key) == "boom":
            raise RuntimeError("injected fault")
        return real(self, req)

    monkeypatch.setattr(vs.VtcState, "enqueue", enqueue)
    s = make_scheduler()
    s.max_prefill_tokens = 12  # room for one 8-token prompt per pass
    boom = make_req("boom", 8)
    others = [] if alone else [make_req("a", 8), make_req("b", 8)]
    arrive(s, boom, *others)
    admitted = []
    for _ in range(4):
        admitted += prefill_pass(s)
    assert boom in admitted and set(others) <= set(admitted), admitted
    assert [r for r in admitted if r is not boom] == others  # a then b: VTC's order
    assert "injected fault" in caplog.text
    assert "boom" not in core().services() and vs.get_state().status(boom) is None
    assert core().services() == ({} if alone else {"a": 8.0, "b": 8.0})


def test_a_failed_charge_still_releases_the_finished_requests(monkeypatch, caplog) -> None:
    """Charging a batch result fails (an error in the core call) in a step where a
    request finishes: logged, and the rest of the batch result still happens. The
    finished request leaves the core (it would otherwise stay running for ever,
    holding its Req), the others keep running, uncharged for that step's tokens and
    never charged them twice, the observers run, and later steps charge normally."""
    import vtc.adapter as va

    s = make_scheduler()
    a, b, c = make_req("a", 8), make_req("b", 8), make_req("c", 8)
    arrive(s, a, b, c)
    assert prefill_pass(s) == [a, b, c]
    state = vs.get_state()
    rids = {r.rid: state.request_id(r) for r in (a, b, c)}
    step(s, [a, b, c])  # one token each, charged
    assert [core().generated(rids[r.rid]) for r in (a, b, c)] == [1, 1, 1]
    steps = []
    step_done = state.adapter.step_done
    monkeypatch.setattr(state.adapter, "step_done", lambda: (steps.append(1), step_done()))
    real = va._decode
    faults = []

    def decode(core_, per_rid):
        if not faults:
            faults.append(1)
            raise RuntimeError("injected charge fault")
        return real(core_, per_rid)

    monkeypatch.setattr(va, "_decode", decode)
    s.model.finish.add(a.rid)
    step(s, [a, b, c])
    # a finished: released, though its last token was not charged
    assert state.status(a) is None and core().status(rids[a.rid]) is None
    assert faults == [1] and steps == [1]  # the observers ran after the failed charge
    assert "injected charge fault" in caplog.text
    assert "vtc: charging a batch result failed" in caplog.text
    assert state.tracked() == 2 and core().num_running == 2 and state.unreleased == []
    assert [state.status(r) for r in (b, c)] == ["running", "running"]
    assert [core().generated(rids[r.rid]) for r in (b, c)] == [1, 1]  # the failed step
    s.model.finish.add(c.rid)
    step(s, [b, c])  # charges normally: this step's token, not the failed step's again
    assert steps == [1, 1]
    assert core().generated(rids[b.rid]) == 2 and state.status(c) is None
    assert state.tracked() == 1 and core().num_running == 1
    assert len(b.output_ids) == 3 and state.requests.get(id(b)).charged == 3
    s.model.finish.add(b.rid)
    step(s, [b])
    assert state.status(b) is None and core().status(rids[b.rid]) is None
    assert state.tracked() == 0 and core().num_running == 0 and core().num_waiting == 0


def test_a_failed_release_keeps_no_other_request(monkeypatch, caplog) -> None:
    """Releasing one finished request fails: logged, the others of the batch are still
    charged and released, and the failed one is released after the next batch
    result."""
    s = make_scheduler()
    a, b, c, d = (make_req(t, 8) for t in "abcd")
    arrive(s, a, b, c)
    assert prefill_pass(s) == [a, b, c]
    state = vs.get_state()
    rid_a = state.request_id(a)
    real = state.requests.release
    broken = {id(a)}

    def release(key, finished=False):
        if key in broken:
            raise RuntimeError("injected release fault")
        return real(key, finished=finished)

    monkeypatch.setattr(state.requests, "release", release)
    s.model.finish.update({a.rid, b.rid, c.rid})
    step(s, [a, b, c])
    assert [state.status(r) for r in (a, b, c)] == ["running", None, None]
    assert "injected release fault" in caplog.text
    assert "vtc: releasing a finished request failed" in caplog.text
    assert state.tracked() == 1 and core().num_running == 1
    assert len(state.unreleased) == 1 and state.unreleased[0] is a
    assert core().generated(rid_a) == 1  # a's batch was charged
    assert core().services() == {"a": 10.0, "b": 10.0, "c": 10.0}  # 8 + 2 (wq) each
    step(s, [])  # no batch result: nothing tried
    broken.clear()
    arrive(s, d)
    assert prefill_pass(s) == [d]
    step(s, [d])  # the next batch result releases a
    assert state.status(a) is None and core().status(rid_a) is None
    assert state.unreleased == [] and state.tracked() == 1 and core().num_running == 1
    assert core().services() == {"a": 10.0, "b": 10.0, "c": 10.0, "d": 10.0}
