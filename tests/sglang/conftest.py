"""Fixtures for the SGLang integration tests (run in .venv-sglang: `make test-sglang`).

Everything here is SGLang's real code on the CPU: its runtime context published from
a real ``ServerArgs``, a real ``RadixCache`` (simulated: no device KV), a real
``TokenToKVPoolAllocator`` over a tiny CPU ``MHATokenToKVPool``, real ``Req`` and
``SamplingParams``, real ``SchedulePolicy`` and ``PrefillAdder``, and the real
``Scheduler`` methods the plugin hooks, called on a ``Scheduler`` shell built with
``object.__new__`` (no model, no ZMQ, no GPU). The shell gets only the attributes
those methods read; the few collaborators they call that need a model or a GPU
(batch tensors, result streaming, metrics) are stubs, listed in ``make_scheduler``.
"""

from __future__ import annotations

import array
import itertools
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

warnings.filterwarnings("ignore", message="Only CUDA, MUSA and NPU support GGUF")

import torch  # noqa: E402
from sglang.srt.disaggregation.utils import DisaggregationMode  # noqa: E402
from sglang.srt.managers.schedule_batch import Req, ScheduleBatch  # noqa: E402
from sglang.srt.managers.schedule_policy import SchedulePolicy  # noqa: E402
from sglang.srt.managers.scheduler import Scheduler  # noqa: E402
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixCache  # noqa: E402
from sglang.srt.plugins.hook_registry import HookRegistry  # noqa: E402
from sglang.srt.runtime_context import SpawnRanks, publish, reset_context  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402
from sglang.srt.server_args import ServerArgs  # noqa: E402

import vtc.sglang as vs  # noqa: E402

KV_TOKENS = 4096
_rids = itertools.count()


@pytest.fixture(scope="session", autouse=True)
def _hooks_applied() -> None:
    """Install the plugin the way SGLang's load_plugins() does: call the entry point,
    then apply the registered hooks."""
    vs.register()
    HookRegistry.apply_hooks()


@pytest.fixture(autouse=True)
def runtime_context() -> Iterator[None]:
    """Publish SGLang's process config (as a scheduler process does) from real ServerArgs."""
    reset_context()
    publish(
        ServerArgs(model_path="dummy", device="cpu"),
        role="scheduler",
        ranks=SpawnRanks(world_rank=0, dp_rank=None),
    )
    vs.reset_state(vs.VtcState())
    try:
        yield
    finally:
        vs.reset_state()
        reset_context()


def make_req(
    tenant: Any = None,
    prompt: int = 8,
    *,
    max_new_tokens: int = 16,
    tokens: list[int] | None = None,
    custom_params: dict | None = None,
    routing_key: str | None = None,
    lora_id: str | None = None,
    priority: int | None = None,
) -> Req:
    """A real SGLang Req; ``tenant`` goes into ``custom_params["tenant"]``."""
    params = dict(custom_params or {})
    if tenant is not None:
        params["tenant"] = tenant
    sp = SamplingParams(max_new_tokens=max_new_tokens, custom_params=params or None)
    sp.normalize(None)
    ids = tokens if tokens is not None else [1000 + next(_rids) % 1000] + list(range(prompt - 1))
    typecode = array.array("q").typecode
    return Req(
        f"req-{next(_rids)}",
        "",
        array.array(typecode, ids),
        sp,
        routing_key=routing_key,
        lora_id=lora_id,
        priority=priority,
    )


def _noop(*_args: Any, **_kwargs: Any) -> None:
    return None


class FakeModel:
    """Stands in for the model forward in process_batch_result: appends tokens."""

    def __init__(self) -> None:
        self.tokens: dict[str, int] = {}  # rid -> tokens to emit next result (default 1)
        self.finish: set[str] = set()  # rids that finish with the next result

    def process(self, batch: Any, _result: Any) -> None:
        from sglang.srt.managers.schedule_batch import FINISH_LENGTH

        for req in batch.reqs:
            req.output_ids.extend([7] * self.tokens.get(req.rid, 1))
            if req.rid in self.finish:
                req.finished_reason = FINISH_LENGTH(length=len(req.output_ids))


def make_scheduler(tree_cache: RadixCache | None = None) -> Scheduler:
    """A real ``Scheduler`` object without ``__init__`` (which loads a model).

    Attributes are the values a CPU, single-rank, non-disaggregated server would
    have; stubs: ``get_num_allocatable_reqs`` (request slots), the batch-result
    processor (``FakeModel``), metrics, tracing and streaming outputs.
    """
    s = object.__new__(Scheduler)
    tc = tree_cache if tree_cache is not None else RadixCache.create_simulated()
    kv = MHATokenToKVPool(KV_TOKENS, 1, torch.float16, 1, 8, 1, "cpu", False)
    alloc = TokenToKVPoolAllocator(KV_TOKENS, torch.float16, "cpu", kv, False)
    s.model = FakeModel()
    attrs: dict[str, Any] = dict(
        waiting_queue=[],
        running_batch=ScheduleBatch(reqs=[]),
        chunked_req=None,
        tree_cache=tc,
        token_to_kv_pool_allocator=alloc,
        req_to_token_pool=SimpleNamespace(device="cpu"),
        policy=SchedulePolicy("fcfs", tc, False, False, True),
        page_size=1,
        disaggregation_mode=DisaggregationMode.NULL,
        enable_priority_scheduling=False,
        enable_priority_preemption=False,
        abort_on_priority_when_disabled=False,
        schedule_low_priority_values_first=True,
        priority_scheduling_preemption_threshold=0,
        max_queued_requests=None,
        enable_hicache_storage=False,
        enable_lmcache=False,
        enable_hierarchical_cache=False,
        enable_unified_cache_external_linker=False,
        enable_lora=False,
        lora_drainer=None,
        is_hybrid_swa=False,
        is_mixed_chunk=False,
        enable_overlap=False,
        enable_fpm=False,
        min_free_slots_delayer=None,
        dynamic_chunk_sizer=None,
        chunked_prefill_size=None,
        max_prefill_tokens=KV_TOKENS,
        max_prefill_bs=0,
        max_running_requests=1024,
        truncation_align_size=None,
        processed_tokens_counter=0,
        hisparse_coordinator=None,
        scheduler_stage_metrics=None,
        mm_receiver=None,
        dllm_config=None,
        model_config=SimpleNamespace(vocab_size=32000),
        spec_algorithm=SimpleNamespace(is_none=lambda: True),
        new_token_ratio_tracker=SimpleNamespace(current=0.5),
        grammar_manager=SimpleNamespace(has_waiting_grammars=lambda: False, abort_requests=_noop),
        tp_worker=SimpleNamespace(
            model_runner=SimpleNamespace(attn_backend=None, prefill_aware_swa=False)
        ),
        beam_coordinator=SimpleNamespace(retire_group=_noop),
        load_inquirer=SimpleNamespace(_get_num_pending_tokens=lambda **_: 0, get_loads=_noop),
        load_publisher=SimpleNamespace(publish_load_stat=_noop),
        metrics_reporter=SimpleNamespace(log_batch_result_stats=_noop, update_device_timer=_noop),
        batch_result_processor=SimpleNamespace(
            process_batch_result_decode=s.model.process,
            process_batch_result_prefill=s.model.process,
        ),
        # stubs of Scheduler methods that need a model, ZMQ or metrics:
        get_num_allocatable_reqs=lambda *_a, **_k: 1024,
        publish_load_snapshot=lambda **_: None,
        send_abort_output=_noop,
        collect_inflight_reqs=lambda: [],
        _record_step_counters=_noop,
        _maybe_clear_mm_inputs=_noop,
        maybe_send_health_check_signal=_noop,
    )
    for name, value in attrs.items():
        setattr(s, name, value)
    return s


def arrive(s: Scheduler, *reqs: Req) -> None:
    """Requests arrive: SGLang's real Scheduler._add_request_to_queue (hooked)."""
    for req in reqs:
        Scheduler._add_request_to_queue(s, req)


def prefill_pass(s: Scheduler) -> list[Req]:
    """One real prefill scheduling pass (Scheduler._get_new_batch_prefill_raw, hooked).

    Returns the admitted requests, in admission order, and puts them into the
    running batch. ``ScheduleBatch.prepare_for_extend`` (device tensors) is stubbed
    by the ``no_device_batches`` fixture.
    """
    batch, running = Scheduler._get_new_batch_prefill_raw(
        s, prefill_delayer_single_pass=None, running_batch=s.running_batch
    )
    if batch is None:
        return []
    s.running_batch = running
    s.running_batch.reqs.extend(batch.reqs)
    return list(batch.reqs)


def step(s: Scheduler, reqs: list[Req], *, decode: bool = True) -> None:
    """A batch result arrives: SGLang's real Scheduler.process_batch_result (hooked)."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    batch = ScheduleBatch(reqs=list(reqs))
    batch.forward_mode = ForwardMode.DECODE if decode else ForwardMode.EXTEND
    Scheduler.process_batch_result(s, batch, None)
    s.running_batch.reqs = [r for r in s.running_batch.reqs if not r.finished()]


@pytest.fixture(autouse=True)
def no_device_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """The new prefill batch's device tensors are not built (no model, no GPU)."""
    monkeypatch.setattr(ScheduleBatch, "prepare_for_extend", _noop)
    monkeypatch.setattr(
        "sglang.srt.managers.scheduler.PrefillStats.from_adder",
        staticmethod(lambda *a, **k: None),
    )


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from redis_server import RedisServer, running_redis  # noqa: E402


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A real redis-server on loopback (tests/redis_server.py), for shared counters."""
    yield from running_redis(tmp_path)
