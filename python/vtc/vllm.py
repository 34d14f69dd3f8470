"""Virtual Token Counter fair scheduling for vLLM's V1 engine.

Serve with VTC by naming the scheduler class; nothing else changes::

    vllm serve MODEL --scheduler-cls vtc.vllm.VTCScheduler

(``LLM(..., scheduler_cls="vtc.vllm.VTCScheduler")`` offline; it runs as
vLLM's ``AsyncScheduler`` under async scheduling and as its ``Scheduler``
otherwise, so :class:`AsyncVTCScheduler` need not be named;
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

import os
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Callable

from vllm.logger import init_logger
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.request_queue import RequestQueue, SchedulingPolicy
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request, RequestStatus

import vtc
from vtc._core import WaitingQueue
from vtc.adapter import (
    WAITING,
    Adapter,
    Requests,
    TenantTally,
    TenantTrace,
    Tracked,
    engine_core,
)
from vtc.adapter import vllm_tenant_fields as tenant_fields  # (exported here too)
from vtc.config import DEFAULT_TENANT_KEY, EngineConfig, first_tenant, parse_weights

__all__ = [
    "AsyncVTCScheduler",
    "TenantTrace",
    "TenantTracingScheduler",
    "VTCConfig",
    "VTCRequestQueue",
    "VTCScheduler",
    "cached_prompt_tokens",
    "parse_weights",
    "resolve_tenant",
    "tenant_fields",
]

logger = init_logger("vllm.vtc")


def resolve_tenant(request: Request, key: str = DEFAULT_TENANT_KEY) -> str | None:
    """The tenant a request names (:func:`vtc.config.first_tenant` of its
    :func:`tenant_fields`), None if none does. Never raises."""
    return first_tenant(tenant_fields(request, key))


VTCConfig = EngineConfig
"""The integration's settings: :class:`vtc.config.EngineConfig` (kept under this name)."""


def cached_prompt_tokens(kv_cache_manager: Any, request: Request) -> int:
    """How many leading tokens of a waiting ``request`` vLLM's prefix cache holds now:
    the hit ``KVCacheManager.get_computed_blocks`` would find if vLLM admitted it,
    block-aligned and at most ``num_tokens - 1`` (vLLM always computes the last
    token), found without that call's side effects (no KV-cache events, no stats,
    no block touched). 0 when prefix caching is off or the request skips the cache
    (prompt logprobs). The answer the locality window (docs/locality.md) asks of
    vLLM."""
    if not kv_cache_manager.prefix_cache_lookup_enabled(request):
        return 0
    _, hit, _ = kv_cache_manager.coordinator.find_longest_cache_hit(
        request.block_hashes, request.num_tokens - 1
    )
    return int(hit)


# (module constants: an enum member read off its class costs ~45 ns, on a hot path)
_RUNNING = RequestStatus.RUNNING
_WAITING_FOR_REMOTE_KVS = RequestStatus.WAITING_FOR_REMOTE_KVS
#: the statuses of a finished request (``Request.is_finished()`` is
#: ``RequestStatus.is_finished(status)``): the native ``release_finished`` reads a
#: request's status instead of calling it (~0.25 µs a finish)
_FINISHED = tuple(s for s in RequestStatus if RequestStatus.is_finished(s))


class VTCRequestQueue(WaitingQueue, RequestQueue):
    """vLLM's waiting queue, ordered by a ``vtc.Scheduler`` in engine mode.

    ``peek_request()`` is the core's ``peek()``; ``pop_request()`` is provisional
    and settled at the next queue call (or :meth:`settle`): admitted, charged
    (less vLLM's prefix-cache hit), or skipped, set aside uncharged until vLLM
    puts it back with its place (``docs/architecture.md``). Prepending a
    running request is a preemption; removing one forgets it. Iteration yields
    waiting requests in arrival order.

    The methods vLLM calls every step are native (:class:`vtc._core.WaitingQueue`,
    this class's base), with no Python frame:

    * ``bool``, ``len``, ``peek_request()`` and ``pop_request()``: the core's own
      answers; each settles a pending pop first;
    * ``add_request(request)``: an arrival submitted to the core
      (:meth:`vtc.adapter.Requests.submit`, its tenant named by ``tenant_of``, its
      band vLLM's ``priority``), or a paused session's request put back;
    * ``settle(num_scheduled_tokens=None)`` decides the pending pop: admitted
      (``Requests.admit`` with its computed tokens, less the step's scheduled ones,
      ``num_scheduled_tokens``, given at the end of ``schedule()``, when vLLM has
      advanced ``num_computed_tokens`` by them past the prefix hit) if vLLM made
      it RUNNING, or it is loading KV (WAITING_FOR_REMOTE_KVS: it holds blocks),
      or has tokens computed; else skipped (``Requests.set_aside``);
    * ``record_outputs(outputs, finished=None, running=False, tokens=None)``, once
      a step: the step's ``EngineCoreOutputs`` charged
      (:meth:`vtc.adapter.Requests.charge_outputs`; ``running``: every output is
      from a distinct request running in the core, ``tokens`` the step's sampled
      token lists, :meth:`_VTCMixin.update_from_output` knows when), then the
      finished ones forgotten (``release_finished``): ``finished``, the ids vLLM
      freed (``finished_req_ids``), else the outputs with a ``finish_reason``;
    * ``release_finished(finished)``: a step's finished requests (by id) forgotten,
      each whose ``is_finished()`` says so (a resumable request that only stopped a
      turn stays), as :meth:`vtc.adapter.Requests.release_finished` releases them.
    """

    def __new__(
        cls,
        core: vtc.Scheduler,
        tenant_of: Callable[[Request], str],
        requests: Requests | None = None,
        prefilling: set[Request] | None = None,
    ) -> VTCRequestQueue:
        requests = Requests(core) if requests is None else requests  # by vLLM id
        # the native half holds the table, and settles pops by vLLM's statuses: admitted
        # if running, or loading KV (it holds blocks), or with tokens computed
        self = super().__new__(
            cls,
            requests,
            _RUNNING,
            _WAITING_FOR_REMOTE_KVS,
            tenant_of=tenant_of,
            finished=_FINISHED,
            prefilling=prefilling,
        )
        self.core = core
        self._tenant_of = tenant_of
        self.requests = requests
        return self

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
                self.add_request(request)  # (untracked: it arrives)
            else:
                tracked.append(t)
        self.requests.put_back_all(tracked)

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
        if self._pending is self.requests.release(request_id, finished):
            self._pending = None  # (or None was pending: a no-op)

    def charge(self, produced: Mapping[str, int]) -> None:
        """Charge the tokens each request (by vLLM id) produced in one step, in one core call."""
        self.requests.charge_keys(produced.items())

    @property
    def num_aside(self) -> int:
        """Requests popped and skipped by vLLM that it has not put back yet."""
        return self.requests.num_aside

    def tracked(self) -> int:
        """Requests the integration holds state for (0 once all are finished)."""
        return len(self.requests)

    def __iter__(self) -> Iterator[Request]:
        self.settle()
        return iter([t.request for t in self.requests.waiting()])


class _VTCMixin:
    """The VTC parts of :class:`VTCScheduler` and :class:`AsyncVTCScheduler`."""

    waiting: VTCRequestQueue

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.vtc_config = config = VTCConfig.from_env()
        capacity = int(self.cache_config.num_gpu_blocks) * int(self.block_size)
        self.vtc = engine_core(config, capacity)  # with VTC_LOCALITY_QUANTUM's window
        self.vtc_adapter = Adapter(self.vtc, config, log=logger)
        self._vtc_pass = self.vtc_adapter.selecting()  # entered by schedule() when needed
        self._install_prefix_lookup()
        self.vtc_tenancy = self.vtc_adapter.tenancy  # the tenant rule, weights, forgetting
        # vLLM's API server shows this process's series if both share the directory
        served = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        hint = "set PROMETHEUS_MULTIPROC_DIR to an empty directory (docs/metrics.md)"
        self.vtc_adapter.enable_metrics(served=served, budget=capacity, hint=hint)
        # VTC_REDIS_URL: counters shared across replicas (each data-parallel rank is one)
        parallel = getattr(getattr(self, "vllm_config", None), "parallel_config", None)
        self.vtc_adapter.start_sharing(suffix=data_parallel_suffix(parallel))
        if len(self.waiting):
            raise RuntimeError("VTC must replace the waiting queue before any request arrives")
        # the tenant rule (tenant_fields' two fields, read natively in the common case)
        rule = self.vtc_tenancy.rule
        self.waiting = VTCRequestQueue(
            self.vtc, rule, self.vtc_adapter.requests, prefilling=prefilling_set(self)
        )
        mode = "async" if isinstance(self, AsyncScheduler) else "synchronous"
        # vLLM's priority (smaller first) is the core's band under --scheduling-policy
        # priority; otherwise every request has priority 0
        order = 1 if self.policy == SchedulingPolicy.PRIORITY else None
        self.vtc_adapter.set_priority_order(order)
        if priorities := self.vtc_adapter.describe_priorities(order):
            mode += "; " + priorities
        logger.info("VTC fair scheduling (%s scheduler): %s", mode, self.vtc_adapter.describe())

    def _install_prefix_lookup(self) -> bool:
        """``VTC_LOCALITY_QUANTUM`` > 0: feed the core's locality window from vLLM's
        prefix cache (:func:`cached_prompt_tokens`, the hit vLLM admits with). Not
        installed, and logged, with prefix caching off (nothing is ever cached, so
        the window would only reorder on zeros): the core then schedules plain
        VTC. Whether it was installed."""
        if self.vtc_config.locality_quantum <= 0.0:
            return False
        if not getattr(self.cache_config, "enable_prefix_caching", False):
            off = "vLLM's prefix caching is off (--no-enable-prefix-caching)"
            self.vtc_adapter.set_prefix_lookup(None, unused=off)
            return False

        def cached(request: Request) -> int:
            return cached_prompt_tokens(self.kv_cache_manager, request)

        return self.vtc_adapter.set_prefix_lookup(cached, source="vLLM's prefix cache") is not None

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        """vLLM's step, in the adapter's scheduling pass when it guards the order
        (:attr:`Adapter.pass_guards_order`: this queue asks the core itself, so
        nothing else needs one), then settle the step's last provisional pop.
        Asked every step: sharing started or stopped, or a lookup set, after the
        scheduler was built is obeyed at the next ``schedule()``."""
        if self.vtc_adapter.pass_guards_order:
            with self._vtc_pass:
                output = super().schedule(*args, **kwargs)
        else:
            output = super().schedule(*args, **kwargs)
        # (native: the last pop settled by the step's schedule; the step kept, with
        # the table's change count, while vLLM's running list and the core's running
        # set have as many requests: see update_from_output)
        self.waiting.scheduled(output, len(self.running))
        return output

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        """vLLM's update, then charge the tokens produced and release finished requests.

        When this updates the output of the last ``schedule()`` and the core has
        not changed since (no abort, preemption, arrival or finish in between,
        nor during vLLM's update), every output is from a distinct request
        running in the core: vLLM makes one output per request it scheduled
        (its ``num_scheduled_tokens`` keys; an error output holds no token),
        it scheduled only requests of its running list, and that list is the
        core's running set (this queue moves every request in and out of
        both; the counts are compared at ``schedule()``). The charge then
        reads no id when the step is uniform (``charge_outputs(running=True)``).
        Not with async scheduling: the next ``schedule()`` comes first.

        Whether it is uniform is then read off the model runner's
        ``sampled_token_ids`` (one exact list per scheduled request), faster than
        off the outputs: vLLM's update hands each request the runner's own list
        as the output's ``new_token_ids`` (trimmed in place at a stop, so both
        stay one list), and makes at most one output per scheduled request. So
        when there are as many outputs as lists, each output's tokens are one
        of the lists, each list once, and if every list holds ``t`` tokens so
        does every output. Otherwise (a request scheduled without an output, a
        runner without lists) the outputs are read as before.

        Nor need the lists be read when the step has no draft tokens and no
        request is still prefilling after it (vLLM's own set of them,
        :func:`prefilling_set`, empty when the step was scheduled): each
        request then samples one token (a decode, or a chunk that finishes its
        prompt; the runner empties only an unfinished chunk's list), so the
        step is charged as uniform from the lists' count alone
        (bench/README.md, 48)."""
        waiting = self.waiting
        if waiting._pending is not None:  # (settle's own test, without a call)
            waiting.settle()
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        # (native: the step schedule() kept, if it is this one and the table has not
        # changed since, charged as running with the runner's token lists; then the
        # requests vLLM freed since its last schedule(): this step's finishes, and
        # aborts, which finish_requests already forgot)
        finished = getattr(self, "finished_req_ids", None)
        waiting.record_step(scheduler_output, model_runner_output, outputs, finished)
        self.vtc_adapter.step_done()  # observers: the trace, shared counters, metrics
        return outputs

    def finish_requests(self, request_ids: Any, finished_status: RequestStatus) -> list[Request]:
        """vLLM's abort/error path; the finished requests leave the core too."""
        self.waiting.settle()
        finished = super().finish_requests(request_ids, finished_status)
        for request in finished:
            self.waiting.forget(request.request_id)
        return finished

    def shutdown(self) -> None:
        """vLLM's shutdown, then a last sync of the shared counters (if any)."""
        super().shutdown()
        self.vtc_adapter.close()

    def tenant_counters(self) -> dict[str, float]:
        """Each tenant's virtual counter (weighted service plus lifts)."""
        return self.vtc_tenancy.counters()

    def tenant_services(self) -> dict[str, float]:
        """Each tenant's weighted service actually delivered (no lifts)."""
        return self.vtc_tenancy.services()


def prefilling_set(scheduler: Any) -> set[Request] | None:
    """vLLM's set of the requests still prefilling after their last chunk
    (``Scheduler._inflight_prefills``), for the queue to know that each request
    of a step without drafts samples one token, without reading the runner's lists
    (:meth:`_VTCMixin.update_from_output`); None where it cannot say so.

    vLLM adds a request when it admits it with a chunk that leaves its prompt (or
    a resumed request's tokens) unfinished, and drops it once a step's chunk
    finishes them (``_update_after_schedule``), or when it is preempted or freed;
    a running request gets more tokens to compute only through an admission. A
    KV connector breaks that (a failed load rolls a running request's computed
    tokens back), and a multimodal encoder-only instance samples nothing; with
    either, or a vLLM without the set, None: the lists are read, as before."""
    prefilling = getattr(scheduler, "_inflight_prefills", None)
    if (
        type(prefilling) is not set
        or getattr(scheduler, "connector", None) is not None
        or getattr(scheduler, "is_mm_encoder_only", False)
    ):
        return None
    return prefilling


def _async_scheduling(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> bool:
    """Whether the ``VllmConfig`` a scheduler is built with asks for async scheduling."""
    config = kwargs.get("vllm_config", args[0] if args else None)
    return bool(getattr(getattr(config, "scheduler_config", None), "async_scheduling", False))


def data_parallel_suffix(parallel_config: Any) -> str:
    """What a data-parallel rank appends to ``VTC_REPLICA_ID``: ``-dp<k>`` for rank
    k > 0, nothing for rank 0 (and without data parallelism), so that every rank
    shares counters as a replica of its own.

    The rank is ``data_parallel_index``: for a dense model vLLM runs each rank as
    an independent engine and rewrites its parallel config to one rank of one
    (``data_parallel_size`` 1, ``data_parallel_rank`` 0) before the scheduler is
    built; only ``data_parallel_index`` keeps the rank (``data_parallel_rank`` is
    the fallback for configs without it)."""
    index = getattr(parallel_config, "data_parallel_index", None)
    if index is None:
        index = getattr(parallel_config, "data_parallel_rank", 0)
    index = int(index or 0)
    return f"-dp{index}" if index > 0 else ""


class VTCScheduler(_VTCMixin, Scheduler):
    """vLLM's V1 scheduler with VTC fair admission across tenants, in either of
    vLLM's scheduling modes under this one name.

    vLLM builds the ``--scheduler-cls`` class as given (``SchedulerConfig.
    get_scheduler_cls``), whatever its scheduling mode. So this class picks its
    own: built with a ``VllmConfig`` whose ``scheduler_config.async_scheduling``
    is true (``--async-scheduling``, vLLM's default where the executor supports
    it) it is an :class:`AsyncVTCScheduler`, vLLM's ``AsyncScheduler`` with VTC;
    otherwise it is vLLM's synchronous ``Scheduler`` with VTC.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> VTCScheduler:
        if cls is VTCScheduler and _async_scheduling(args, kwargs):
            cls = AsyncVTCScheduler  # a subclass: Python then runs its __init__
        return super().__new__(cls)


class AsyncVTCScheduler(VTCScheduler, AsyncScheduler):
    """vLLM's V1 ``AsyncScheduler`` with VTC fair admission: what
    :class:`VTCScheduler` becomes under async scheduling. Kept as a name of its
    own for configurations that spell it out; always the async variant."""


class TenantTracingScheduler(Scheduler):
    """vLLM's stock ``Scheduler``, decisions unchanged, writing the per-tenant
    :class:`TenantTrace` (``VTC_TRACE_FILE``): measure what each tenant gets
    before switching to VTC. Tenants are named as for :class:`VTCScheduler`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tally = TenantTally(VTCConfig.from_env())

    def add_request(self, request: Request) -> None:
        """Remember the request's tenant, then vLLM's ``add_request``."""
        fields = tenant_fields(request, self.tally.config.tenant_key)
        self.tally.arrive(request.request_id, fields)
        super().add_request(request)

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        """vLLM's update; the tokens produced are added to the trace."""
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        tally = self.tally
        for engine_outputs in outputs.values():
            for out in engine_outputs.outputs:
                tally.produced(out.request_id, len(out.new_token_ids))
                if out.finish_reason is not None and out.request_id not in self.requests:
                    tally.left(out.request_id)
        queues = (self.waiting, self.kv_holding_waiting, self.running)
        tally.step_done(lambda: (r.request_id for q in queues for r in q))
        return outputs

    def finish_requests(self, request_ids: Any, finished_status: RequestStatus) -> list[Request]:
        """vLLM's abort/error path; the requests leave the trace's bookkeeping."""
        finished = super().finish_requests(request_ids, finished_status)
        for request in finished:
            self.tally.left(request.request_id)
        return finished
