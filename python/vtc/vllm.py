"""Virtual Token Counter fair scheduling for vLLM's V1 engine.

Serve with VTC by naming the scheduler class; nothing else changes::

    vllm serve MODEL --scheduler-cls vtc.vllm.VTCScheduler

(``LLM(..., scheduler_cls="vtc.vllm.VTCScheduler")`` offline;
:class:`AsyncVTCScheduler` is the variant for ``--async-scheduling``;
:class:`TenantTracingScheduler` is vLLM's stock policy writing the same
per-tenant trace, to measure before switching.)

This module is the vLLM-shaped shell over :mod:`vtc.adapter`: it replaces
vLLM's waiting queue with :class:`VTCRequestQueue`, ordered by one
``vtc.Scheduler`` (the Rust core) in engine mode, and translates vLLM's
events into adapter calls. vLLM keeps making every memory decision. What is
charged and when, the tenant rule and every ``VTC_*`` variable:
``docs/vllm.md``; the data path: ``docs/architecture.md``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Callable

from vllm.logger import init_logger
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.request_queue import RequestQueue, SchedulingPolicy
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request, RequestStatus

import vtc
from vtc.adapter import ASIDE, RUNNING, WAITING, Adapter, Requests, Tenancy, TenantTrace, Tracked
from vtc.config import DEFAULT_TENANT_KEY, EngineConfig, first_tenant, parse_weights

__all__ = [
    "AsyncVTCScheduler",
    "TenantTrace",
    "TenantTracingScheduler",
    "VTCConfig",
    "VTCRequestQueue",
    "VTCScheduler",
    "parse_weights",
    "resolve_tenant",
    "tenant_fields",
]

logger = init_logger("vllm.vtc")


def tenant_fields(request: Request, key: str = DEFAULT_TENANT_KEY) -> tuple[Any, Any]:
    """A request's tenant fields, in order: ``extra_args[key]``, its LoRA adapter's name."""
    params = request.sampling_params
    extra = getattr(params, "extra_args", None) if params is not None else None
    lora = request.lora_request
    return (
        extra.get(key) if isinstance(extra, dict) else None,
        getattr(lora, "lora_name", None) if lora is not None else None,
    )


def resolve_tenant(request: Request, key: str = DEFAULT_TENANT_KEY) -> str | None:
    """The tenant a request names: ``extra_args[key]``, else its LoRA adapter's name.

    Returns None when neither names a tenant (:func:`vtc.config.first_tenant`:
    a malformed value is treated as absent; the caller uses the default
    tenant). Never raises on a malformed request.
    """
    return first_tenant(tenant_fields(request, key))


VTCConfig = EngineConfig
"""The integration's settings: :class:`vtc.config.EngineConfig` (kept under this name)."""


def _admitted(request: Request) -> bool:
    """Whether vLLM admitted a request it just popped (vs. skipped it).

    vLLM makes an admitted request RUNNING right after the pop; a request it
    starts loading KV for (``WAITING_FOR_REMOTE_KVS``) holds blocks and is
    admitted too, though it waits in another queue until the load ends.
    """
    return (
        request.status == RequestStatus.RUNNING
        or request.status == RequestStatus.WAITING_FOR_REMOTE_KVS
        or request.num_computed_tokens > 0
    )


class VTCRequestQueue(RequestQueue):
    """vLLM's waiting queue, ordered by a ``vtc.Scheduler`` in engine mode.

    ``peek_request()`` is the core's ``peek()``. ``pop_request()`` is provisional
    (the core is not touched) and is settled at the next operation on the queue,
    or by :meth:`settle` at the end of ``schedule()``:

    * admitted (vLLM made it RUNNING): ``pop(cached_len=...)``, charging the
      prompt tokens vLLM computes (its prefix-cache hit is free); once only.
    * skipped (vLLM will put it back): ``set_aside`` in the core, which
      charges nothing, so the next ``peek`` moves on. When vLLM puts it back
      (``prepend_requests``) the core's ``put_back`` returns it to the head of
      its tenant's queue with its place: nothing charged, and its tenant is
      not lifted (it was set aside, not idle), so a skipped tenant's counter
      is exactly as before.

    ``prepend_request`` of a running request (vLLM's preemption) is the core's
    ``preempt``. ``remove_request(s)`` (aborts, stops) forget the request.
    Iteration yields waiting requests in arrival order, not admission order.
    """

    def __init__(
        self,
        core: vtc.Scheduler,
        tenant_of: Callable[[Request], str],
        requests: Requests | None = None,
    ) -> None:
        self.core = core
        self._tenant_of = tenant_of
        self.requests = Requests(core) if requests is None else requests  # by vLLM id
        self._pending: Tracked | None = None
        self._aside: dict[str, int] = {}  # vLLM request id -> order it was set aside in
        self._aside_seq = 0

    # -- bookkeeping -------------------------------------------------------
    def _submit(self, request: Request) -> None:
        self.requests.submit(
            request.request_id, request, self._tenant_of(request), request.num_prompt_tokens
        )

    def entry(self, request_id: str) -> Tracked | None:
        """The integration's record of a vLLM request (None if it has none)."""
        return self.requests.get(request_id)

    def core_id(self, request_id: str) -> int | None:
        """The core's integer id of a vLLM request id (None if untracked)."""
        t = self.requests.get(request_id)
        return None if t is None else t.rid

    def __contains__(self, request: object) -> bool:
        if not isinstance(request, Request):
            return False
        t = self.requests.get(request.request_id)
        return t is not None and t is not self._pending and self.requests.status(t) == WAITING

    # -- settling provisional pops ----------------------------------------
    def settle(self, num_scheduled_tokens: Mapping[str, int] | None = None) -> None:
        """Decide the last provisional pop: admitted (charge) or skipped (set aside).

        ``num_scheduled_tokens`` is the step's schedule, passed at the end of
        ``schedule()``, when vLLM has already advanced ``num_computed_tokens`` by
        it; the prefix-cache hit is what was computed before that.
        """
        t = self._pending
        if t is None:
            return
        self._pending = None
        request = t.request
        if not _admitted(request):
            self.requests.set_aside(t)
            self._aside_seq += 1
            self._aside[request.request_id] = self._aside_seq
            return
        computed = request.num_computed_tokens
        if num_scheduled_tokens is not None and request.status == RequestStatus.RUNNING:
            computed -= num_scheduled_tokens.get(request.request_id, 0)
        # (a preempted request's prompt is never charged again, whatever is cached)
        self.requests.admit(t, computed)

    # -- RequestQueue ------------------------------------------------------
    def add_request(self, request: Request) -> None:
        """A request arrives (or a paused session returns): submit it to the core."""
        if self._pending is not None:
            self.settle()
        t = self.requests.get(request.request_id)
        if t is None:
            self._submit(request)
        else:
            self._put_back([t])

    def peek_request(self) -> Request:
        """The request the VTC policy admits next (IndexError if none waits)."""
        if self._pending is not None:
            self.settle()
        t = self.requests.head()
        if t is None:
            raise IndexError("peek from an empty VTC queue")
        return t.request

    def pop_request(self) -> Request:
        """Take the request ``peek_request()`` names; settled at the next call."""
        if self._pending is not None:
            self.settle()
        t = self.requests.head()
        if t is None:
            raise IndexError("pop from an empty VTC queue")
        self._pending = t
        return t.request

    def _put_back(self, tracked: list[Tracked]) -> None:
        # Latest set aside first, so that the earliest ends up at the head.
        states = self.core.statuses([t.rid for t in tracked])
        aside = [t for t, state in zip(tracked, states) if state == ASIDE]
        aside.sort(key=lambda t: -self._aside[t.key])
        # Then preempt the latest first, so that the earliest ends up at the head.
        running = [t for t, state in zip(tracked, states) if state == RUNNING]
        for t in aside + running[::-1]:
            self._aside.pop(t.key, None)
            self.requests.put_back(t)

    def prepend_request(self, request: Request) -> None:
        """vLLM preempted ``request`` (or puts back a skipped one): back to the head."""
        self.prepend_requests((request,))

    def prepend_requests(self, requests: Iterable[Request]) -> None:
        """Put back requests popped this step: skipped ones re-enter, running ones
        are preempted; none is charged."""
        self.settle()
        tracked = []
        for request in requests:
            t = self.requests.get(request.request_id)
            if t is None:
                self._submit(request)
            else:
                tracked.append(t)
        self._put_back(tracked)

    def remove_request(self, request: Request) -> None:
        """The request is finished or aborted: forget it."""
        self.remove_requests((request,))

    def remove_requests(self, requests: Iterable[Request]) -> None:
        """The requests are finished or aborted: forget them."""
        self.settle()
        for request in requests:
            self.forget(request.request_id)

    def forget(self, request_id: str, finished: bool = False) -> None:
        """Drop every trace of a request (no-op if untracked): ``finish`` in the core
        if it ran to completion, ``cancel`` otherwise."""
        t = self.requests.release(request_id, finished)
        if t is None:
            return
        if self._pending is t:
            self._pending = None
        if self._aside:
            self._aside.pop(request_id, None)

    def charge(self, produced: Mapping[str, int]) -> None:
        """Charge the tokens each request (by vLLM id) produced in one step, in one core call."""
        self.requests.charge_keys(produced.items())

    def record_outputs(self, outputs: Iterable[Any], finished: Iterable[str] | None = None) -> None:
        """One step's ``EngineCoreOutputs``: charge the tokens each request really
        produced (one core call, :meth:`vtc.adapter.Requests.charge_outputs`),
        then forget the requests that finished.

        ``finished``: the ids of the requests vLLM freed (its scheduler's
        ``finished_req_ids``), so that finding them costs nothing per output;
        without it, the outputs with a ``finish_reason`` are looked at.
        """
        groups = list(outputs)  # one per API-server client: one here
        if len(groups) == 1:
            outs = groups[0].outputs
        else:
            outs = [out for engine_outputs in groups for out in engine_outputs.outputs]
        if not outs:
            return
        self.requests.charge_outputs(outs)
        if finished is None:
            finished = [out.request_id for out in outs if out.finish_reason is not None]
        for request_id in finished:
            t = self.requests.get(request_id)
            # A resumable (streaming-input) request stops a turn without finishing.
            if t is not None and t.request.is_finished():
                self.forget(request_id, finished=True)

    def requests_by_tenant(self) -> tuple[dict[str, int], dict[str, int]]:
        """How many requests each tenant has waiting and admitted (for logs; O(requests))."""
        return self.requests.by_tenant()

    @property
    def num_aside(self) -> int:
        """Requests popped and skipped by vLLM that it has not put back yet."""
        return len(self._aside)

    def tracked(self) -> int:
        """Requests the integration holds state for (0 once all are finished)."""
        return len(self.requests)

    def __bool__(self) -> bool:
        return len(self) > 0

    def __len__(self) -> int:
        if self._pending is not None:
            self.settle()
        return self.core.num_waiting

    def __iter__(self) -> Iterator[Request]:
        self.settle()
        tracked = list(self.requests)
        states = self.core.statuses([t.rid for t in tracked])
        return iter([t.request for t, state in zip(tracked, states) if state == WAITING])


def _count_tenants(requests: Iterable[Request], tenant_of: Mapping[str, str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for request in requests:
        tenant = tenant_of.get(request.request_id)
        if tenant is not None:
            counts[tenant] = counts.get(tenant, 0) + 1
    return counts


class _VTCMixin:
    """The VTC parts of :class:`VTCScheduler` and :class:`AsyncVTCScheduler`."""

    waiting: VTCRequestQueue
    vtc: vtc.Scheduler
    vtc_config: VTCConfig
    vtc_tenancy: Tenancy

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        config = VTCConfig.from_env()
        capacity = int(self.cache_config.num_gpu_blocks) * int(self.block_size)
        self.vtc_config = config
        self.vtc = vtc.Scheduler(M=capacity, wp=config.wp, wq=config.wq, policy="vtc")
        self.vtc_adapter = Adapter(self.vtc, config, log=logger)
        self.vtc_tenancy = self.vtc_adapter.tenancy
        self._vtc_warned_aside = False
        if self.policy != SchedulingPolicy.FCFS:
            logger.warning("VTC orders the waiting queue itself; policy %r is ignored", self.policy)
        if len(self.waiting):
            raise RuntimeError("VTC must replace the waiting queue before any request arrives")
        self.waiting = VTCRequestQueue(self.vtc, self._vtc_tenant, self.vtc_adapter.requests)
        logger.info(
            "VTC fair scheduling: M=%d tokens, wp=%g, wq=%g, tenant key %r, weights %s",
            capacity,
            config.wp,
            config.wq,
            config.tenant_key,
            config.weights or "all 1",
        )

    def _vtc_tenant(self, request: Request) -> str:
        """The tenant an arriving request is billed to (:class:`vtc.adapter.Tenancy`)."""
        return self.vtc_tenancy.arrive(tenant_fields(request, self.vtc_config.tenant_key))

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        """vLLM's step, then settle the step's last provisional pop."""
        output = super().schedule(*args, **kwargs)
        queue = self.waiting
        queue.settle(output.num_scheduled_tokens)
        if queue.num_aside and not self._vtc_warned_aside:
            # vLLM 0.32 puts every request it skips back before schedule() returns.
            self._vtc_warned_aside = True
            logger.warning(
                "VTC: %d skipped request(s) not put back in the waiting queue", queue.num_aside
            )
        return output

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        """vLLM's update, then charge the tokens produced and release finished requests."""
        self.waiting.settle()
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        # The requests vLLM freed since its last schedule(): this step's finishes
        # (and aborts, which finish_requests already forgot).
        self.waiting.record_outputs(outputs.values(), getattr(self, "finished_req_ids", None))
        self.vtc_adapter.step_done()  # observers: the trace, shared counters, metrics
        return outputs

    def finish_requests(self, request_ids: Any, finished_status: RequestStatus) -> list[Request]:
        """vLLM's abort/error path; the finished requests leave the core too."""
        self.waiting.settle()
        finished = super().finish_requests(request_ids, finished_status)
        for request in finished:
            self.waiting.forget(request.request_id)
        return finished

    def tenant_counters(self) -> dict[str, float]:
        """Each tenant's virtual counter (weighted service plus lifts)."""
        return self.vtc_tenancy.counters()

    def tenant_services(self) -> dict[str, float]:
        """Each tenant's weighted service actually delivered (no lifts)."""
        return self.vtc_tenancy.services()


class VTCScheduler(_VTCMixin, Scheduler):
    """vLLM's V1 ``Scheduler`` with VTC fair admission across tenants."""


class AsyncVTCScheduler(_VTCMixin, AsyncScheduler):
    """vLLM's V1 ``AsyncScheduler`` (``--async-scheduling``) with VTC fair admission."""


class TenantTracingScheduler(Scheduler):
    """vLLM's stock ``Scheduler``, decisions unchanged, writing the per-tenant
    :class:`TenantTrace` (``VTC_TRACE_FILE``): measure what each tenant gets
    before switching to VTC. Tenants are named as for :class:`VTCScheduler`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._trace_config = VTCConfig.from_env()
        self._trace = TenantTrace.from_config(self._trace_config)
        self._tenant_of: dict[str, str] = {}

    def add_request(self, request: Request) -> None:
        """Remember the request's tenant, then vLLM's ``add_request``."""
        tenant = resolve_tenant(request, self._trace_config.tenant_key)
        self._tenant_of[request.request_id] = tenant or self._trace_config.default_tenant
        super().add_request(request)

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        """vLLM's update; the tokens produced are added to the trace."""
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        for engine_outputs in outputs.values():
            for out in engine_outputs.outputs:
                tenant = self._tenant_of.get(out.request_id)
                if tenant is not None and out.new_token_ids and self._trace is not None:
                    self._trace.add(tenant, len(out.new_token_ids))
                if out.finish_reason is not None and out.request_id not in self.requests:
                    self._tenant_of.pop(out.request_id, None)
        if self._trace is not None:
            self._trace.maybe_write(self._queued)
        return outputs

    def finish_requests(self, request_ids: Any, finished_status: RequestStatus) -> list[Request]:
        """vLLM's abort/error path; the requests leave the trace's bookkeeping."""
        finished = super().finish_requests(request_ids, finished_status)
        for request in finished:
            self._tenant_of.pop(request.request_id, None)
        return finished

    def _queued(self) -> dict[str, int]:
        queues = (self.waiting, self.kv_holding_waiting, self.running)
        return _count_tenants((r for q in queues for r in q), self._tenant_of)
