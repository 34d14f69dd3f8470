"""VTC fair scheduling for SGLang, as an SGLang general plugin.

Install ``vtc`` next to SGLang and start the server with ``SGLANG_PLUGINS=vtc``:
SGLang's plugin loader (``sglang.srt.plugins.load_plugins``) calls
:func:`register`, which puts AROUND hooks (:data:`HOOKS`) on a handful of
SGLang methods. Nothing else in SGLang changes: its memory checks, chunked
prefill, prefix cache and retraction logic all run as before. The policy
lives in one :class:`vtc.Scheduler` per scheduler process (the Rust core);
this module is the SGLang-shaped shell over :mod:`vtc.adapter` that
translates SGLang's events into adapter calls. Admission follows VTC
exactly: the hooks keep the core's next choice right after the last admitted
request and refuse any other (no skipping), so the requests SGLang admits
are exactly the sequence ``pop()`` would give. Only the unified
(non-disaggregated) scheduler is hooked.

The hook table, the tenant rule and every ``VTC_*`` variable:
``docs/sglang.md``; the data path: ``docs/architecture.md``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from vtc import MAX_BUDGET, Scheduler
from vtc.adapter import Adapter, engine_core
from vtc.config import (
    DEFAULT_TENANT,
    DEFAULT_TENANT_KEY,
    ConfigError,
    EngineConfig,
    check_env,
    first_tenant,
)

logger = logging.getLogger(__name__)

#: KV budget given to the core. SGLang owns memory (``pop`` does no KV check),
#: so the core's budget only has to admit any prompt.
ENGINE_M = MAX_BUDGET

_Req = Any  # sglang.srt.managers.schedule_batch.Req (not imported at module import time)


def tenant_fields(req: _Req, key: str = DEFAULT_TENANT_KEY) -> tuple[Any, ...]:
    """A request's tenant fields, in order: ``sampling_params.custom_params[key]``,
    ``routing_key``, ``lora_id`` (none if they cannot be read). Never raises."""
    try:
        params = getattr(getattr(req, "sampling_params", None), "custom_params", None)
        return (
            params.get(key) if isinstance(params, Mapping) else None,
            getattr(req, "routing_key", None),
            getattr(req, "lora_id", None),
        )
    except Exception:  # a hostile custom_params mapping must not drop the request
        logger.debug("vtc: could not read the tenant of a request", exc_info=True)
    return ()


def tenant_of(req: _Req, key: str = DEFAULT_TENANT_KEY) -> str:
    """The tenant a request is billed to: the first of its :func:`tenant_fields`
    that names one (:func:`vtc.config.first_tenant`), else :data:`DEFAULT_TENANT`."""
    return first_tenant(tenant_fields(req, key)) or DEFAULT_TENANT


class VtcState:
    """One VTC core and the bookkeeping that maps SGLang requests onto it.

    SGLang runs one ``Scheduler`` per process (per TP/PP/DP rank); every rank
    sees the same events in the same order, so every rank's core makes the
    same decisions. Requests are identified by object identity (SGLang's
    ``rid`` strings may repeat), mapped to dense integer ids for the core.
    """

    def __init__(self, config: EngineConfig | None = None, **fields: Any) -> None:
        """``config``, or an :class:`vtc.config.EngineConfig` of ``fields``."""
        self.config = config = EngineConfig(**fields) if config is None else config
        # VTC_LOCALITY_QUANTUM: the window is fed by the radix cache once SGLang
        # schedules (start: install_prefix_lookup)
        self.core: Scheduler = engine_core(config, ENGINE_M)
        self.tenant_key = config.tenant_key
        self.adapter = Adapter(self.core, config, log=logger)  # sets the weights
        self.tenancy = self.adapter.tenancy
        # Keyed by id(Req): each record keeps its Req alive, so the key stays unique.
        self.requests = self.adapter.requests
        self.in_pass = False  # inside Scheduler._get_new_batch_prefill_raw
        self.queue: list[_Req] | None = None  # the waiting queue that pass walks
        # SGLang's priority order, read from the scheduler by the arrival hook:
        # 1 (smaller values first), -1 (larger first), None (priority scheduling off)
        self.priority_order: int | None = None
        # finished requests whose release failed, tried again after the next batch
        # result (holding each Req keeps its id unique until then)
        self.unreleased: list[_Req] = []

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> VtcState:
        """Build from the ``VTC_*`` variables (:class:`vtc.config.EngineConfig`);
        a malformed one raises ``ConfigError``."""
        return cls(EngineConfig.from_env(environ))

    def request_id(self, req: _Req) -> int | None:
        """The core's id for a tracked request, else None."""
        t = self.requests.get(id(req))
        return None if t is None else t.rid

    def status(self, req: _Req) -> str | None:
        """``"waiting"``, ``"running"`` or None (not tracked) in the core."""
        rid = self.request_id(req)
        return None if rid is None else self.core.status(rid)

    def tracked(self) -> int:
        """Requests this state holds a mapping for (tests: stale-state checks)."""
        return len(self.requests)

    def tenant(self, req: _Req) -> str:
        """The tenant of ``req`` under this state's tenant key."""
        return tenant_of(req, self.tenant_key)

    def read_priority_order(self, scheduler: Any) -> None:
        """Note how ``scheduler`` orders request priorities (``--enable-priority-scheduling``,
        ``--schedule-low-priority-values-first``), for :meth:`band`."""
        if getattr(scheduler, "enable_priority_scheduling", False):
            low_first = getattr(scheduler, "schedule_low_priority_values_first", False)
            order = 1 if low_first else -1
        else:
            order = None
        if order != self.priority_order:
            self.adapter.set_priority_order(order)  # VTC_PRIORITY_WEIGHTS, oriented
        self.priority_order = order

    def band(self, req: _Req) -> int:
        """The core's priority band of ``req`` (smaller is more urgent): SGLang's
        priority, oriented by the scheduler's order, under priority scheduling; else
        0 (SGLang ignores priorities then, and so does VTC)."""
        priority = getattr(req, "priority", None)
        if self.priority_order is None or priority is None:
            return 0
        return self.priority_order * int(priority)

    def enqueue(self, req: _Req) -> None:
        """``req`` entered the waiting queue: a new request (in its priority band), or
        a running one sent back (preempted); what it generated before is not charged."""
        fields = tenant_fields(req, self.tenant_key)
        n = len(req.origin_input_ids)
        charged = len(req.output_ids)
        self.adapter.enqueue(id(req), req, fields, n, charged=charged, priority=self.band(req))

    def start(self, scheduler: Any) -> None:
        """The scheduler's first prefill pass (at its first event loop iteration,
        before any request): the per-tenant series (``VTC_METRICS``), on SGLang's
        ``/metrics`` with ``--enable-metrics`` (the fairness bound uses its KV pool
        size), shared counters (``VTC_REDIS_URL``), and the start-up line. SGLang
        loads plugins before it configures logging, so a line logged by
        :func:`register` is lost; this one is logged once logging is set up."""
        served = getattr(getattr(scheduler, "metrics_reporter", None), "enable_metrics", False)
        budget = getattr(scheduler, "max_total_num_tokens", None)
        hint = "start SGLang with --enable-metrics"
        self.adapter.enable_metrics(served=bool(served), budget=budget, hint=hint)
        # VTC_REDIS_URL: counters shared across replicas, by the one scheduler of a replica
        ranks = int(getattr(scheduler, "tp_size", 1) or 1) * int(
            getattr(scheduler, "pp_size", 1) or 1
        )
        self.adapter.start_sharing(ranks=ranks, suffix=data_parallel_suffix(scheduler))
        self.read_priority_order(scheduler)
        self.install_prefix_lookup(scheduler)
        priorities = self.adapter.describe_priorities(self.priority_order)
        logger.info(
            "vtc: VTC fair scheduling orders this scheduler's waiting queue: %s%s",
            self.adapter.describe(budget=budget),
            f"; {priorities}" if priorities else "",
        )

    def install_prefix_lookup(self, scheduler: Any) -> bool:
        """``VTC_LOCALITY_QUANTUM`` > 0: feed the core's locality window from
        ``scheduler.tree_cache`` (:func:`cached_prefix`, the match SGLang's ``lpm``
        policy computes). Not installed, and logged, when SGLang's radix cache is
        off (``--disable-radix-cache``: nothing is ever cached, so the window would
        only reorder on zeros) or this SGLang lacks the calls :func:`cached_prefix`
        makes: the core then schedules plain VTC. Whether it was installed."""
        if self.config.locality_quantum <= 0.0:
            return False
        tree_cache = getattr(scheduler, "tree_cache", None)
        why = None
        if tree_cache is None or getattr(tree_cache, "disable", False):
            why = "SGLang's radix cache is disabled (--disable-radix-cache)"
        else:
            try:
                _prefix_match_calls()
            except ImportError as e:
                why = f"this SGLang lacks the prefix-match calls vtc uses ({e})"
        if why is not None:
            self.adapter.set_prefix_lookup(None, unused=why)
            return False

        def cached(req: _Req) -> int:
            return cached_prefix(scheduler.tree_cache, req)

        return self.adapter.set_prefix_lookup(cached, source="SGLang's radix cache") is not None

    def drop(self, req: _Req) -> None:
        """``req`` left SGLang (aborted, rejected): release it from the core."""
        self.requests.release(id(req))

    def sync_waiting(self, queue: list[_Req]) -> None:
        """Make the core's waiting set equal to ``queue`` (a safety net: requests
        that left or entered through paths not hooked are dropped or submitted)."""
        self.requests.sync_waiting({id(r): r for r in queue}, self.enqueue)

    def put_head_first(self, queue: list[_Req]) -> None:
        """Move the core's next choice to the front of SGLang's waiting queue."""
        self.queue = queue
        head = self.requests.head()
        if head is not None:
            self._move_after(queue, head.request, -1)

    def is_head(self, req: _Req) -> bool:
        """Whether ``req`` is the request the core would admit next."""
        head = self.requests.head()
        return head is not None and head.request is req

    def admitted(self, req: _Req) -> None:
        """SGLang admitted ``req`` (the core's head) to a prefill batch: charge it.

        Only computed prompt tokens are charged; the prefix-cache hit SGLang
        found (``req.prefix_len``) is free. A preempted request pays nothing.
        Then the core's next choice is moved right after ``req`` in the queue
        SGLang is walking.
        """
        t = self.requests.get(id(req))
        if t is None:  # pragma: no cover - is_head() said it is the core's head
            return
        self.requests.admit(t, int(req.prefix_len))
        queue = self.queue
        head = self.requests.head()
        if queue is None or head is None:
            return
        pos = next((i for i, r in enumerate(queue) if r is req), None)
        if pos is not None:
            self._move_after(queue, head.request, pos)

    @staticmethod
    def _move_after(queue: list[_Req], req: _Req, pos: int) -> None:
        """Move ``req`` to index ``pos + 1`` if it sits later; the list object is
        kept (SGLang is iterating over it)."""
        at = next((i for i in range(pos + 1, len(queue)) if queue[i] is req), None)
        if at is not None and at != pos + 1:
            queue[pos + 1 : at + 1] = [req, *queue[pos + 1 : at]]

    def batch_done(self, reqs: list[_Req]) -> None:
        """A batch result was processed: charge new output tokens (in one core
        call, :meth:`vtc.adapter.Requests.charge_totals`; a request not running
        is charged once it runs again), release finished requests.

        Each part fails on its own (logged, :func:`_guarded`): a failed charge
        does not keep finished requests in the core (they are released, uncharged
        for the failed step's tokens, never charged twice: ``charge_totals`` has
        already counted them as charged), a request whose release fails does not
        keep the others (it is tried again after each later batch result), and the
        observers run after every batch result."""
        _guarded(
            "charging a batch result",
            lambda: self.requests.charge_totals((id(req), len(req.output_ids)) for req in reqs),
        )
        retry, self.unreleased = self.unreleased, []
        for req in (*retry, *reqs):
            released = _guarded("releasing a finished request", lambda req=req: self._release(req))
            if not released and not any(r is req for r in self.unreleased):
                self.unreleased.append(req)
        # observers: the trace, shared counters, metrics
        _guarded("the observers of a batch result", self.adapter.step_done)

    def _release(self, req: _Req) -> bool:
        """Release ``req`` if it finished; True unless that must be tried again."""
        if req.finished():
            self.requests.release(id(req), finished=True)
        return True

    def retracted(self, reqs: list[_Req], aborted: list[_Req]) -> None:
        """Decode ran out of memory: ``reqs`` go back to waiting, ``aborted`` are gone."""
        get = self.requests.get
        self.requests.put_back_all(t for req in reqs if (t := get(id(req))) is not None)
        for req in aborted:
            self.drop(req)


def _prefix_match_calls() -> tuple[Any, Any, Any]:
    """SGLang's calls :func:`cached_prefix` makes (ImportError on an SGLang
    without them)."""
    from sglang.srt.environ import envs
    from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
    from sglang.srt.mem_cache.common import _req_radix_key

    return envs, MatchPrefixParams, _req_radix_key


def cached_prefix(tree_cache: Any, req: _Req) -> int:
    """How many leading tokens of the waiting ``req`` SGLang's prefix cache holds
    now: the match its ``lpm`` policy sorts by (``match_kv_cache`` in
    ``schedule_policy.calc_priority``: ``num_matched_prefix_tokens``, the device
    hit plus a host hit, up to the longest prefix SGLang would reuse, which
    leaves at least the last token to compute), on the same key (token ids, extra
    key, cache salt, SWA re-prefill tail) as ``Req.init_next_round_input``.

    Without ``match_kv_cache``'s side effects: ``req`` is not touched (its
    ``prefix_len``, ``last_node`` and the rest are SGLang's to set when it admits),
    no node is locked, nothing is allocated, inserted, loaded or copied (no
    ``req`` and no mamba copy-on-write in the match). As in every SGLang match,
    the matched path's access time is refreshed (as ``lpm``'s match and SGLang's
    waiting-prefix refresh do for waiting requests), and a path ending inside a
    node splits it. A disabled cache answers 0."""
    if tree_cache is None or getattr(tree_cache, "disable", False):
        return 0
    if getattr(req, "positional_embed_overrides", None) is not None:
        return 0  # SGLang matches nothing for these (init_next_round_input)
    envs, MatchPrefixParams, _req_radix_key = _prefix_match_calls()
    if envs.SGLANG_RADIX_FORCE_MISS.get():
        return 0
    token_ids = req.origin_input_ids + req.output_ids
    max_len = req._compute_max_prefix_len(len(token_ids))
    key = _req_radix_key(tree_cache, req, token_ids, max_len)
    result = tree_cache.match_prefix(MatchPrefixParams(key=key))
    return max(0, min(int(result.device_prefix_len) + int(result.host_hit_length), max_len))


_STATE: VtcState | None = None


def data_parallel_suffix(scheduler: Any = None) -> str:
    """What SGLang's data-parallel scheduler k appends to ``VTC_REPLICA_ID``:
    ``-dp<k>`` for k > 0, nothing for rank 0 or without data parallelism, so that
    with ``--dp-size N`` every DP scheduler shares counters as a replica of its own
    (as vLLM's ranks do: :func:`vtc.vllm.data_parallel_suffix`).

    The rank is SGLang's runtime context (``get_parallel().dp_rank``, set in the
    scheduler process before the model loads; ``None`` without DP attention or
    data parallelism), else the scheduler's own ``dp_rank`` (older SGLang)."""
    rank = None
    try:
        from sglang.srt.runtime_context import get_parallel

        rank = get_parallel().dp_rank
    except (ImportError, AttributeError, RuntimeError, ValueError):  # older, or unpublished
        rank = getattr(scheduler, "dp_rank", None)
    index = int(rank or 0)
    return f"-dp{index}" if index > 0 else ""


def get_state() -> VtcState:
    """This process's VTC state, created from the environment on first use."""
    global _STATE
    if _STATE is None:
        _STATE = VtcState.from_env()
    return _STATE


def reset_state(state: VtcState | None = None) -> None:
    """Replace this process's state (tests; ``None``: rebuilt from the environment)."""
    global _STATE
    _STATE = state


def _guarded(what: str, fn: Callable[[], Any]) -> Any:
    """Run a bookkeeping step; log and swallow any error so SGLang keeps serving."""
    try:
        return fn()
    except Exception:
        logger.exception("vtc: %s failed; SGLang continues without it for this step", what)
        return None


# -- hooks (HookType.AROUND: hook(original, *args, **kwargs)) ------------------------------


def _is_unified(scheduler: Any) -> bool:
    mode = getattr(scheduler, "disaggregation_mode", None)
    return getattr(mode, "value", mode) in (None, "null")


def _hook_add_request_to_queue(
    original: Callable[..., Any], scheduler: Any, req: _Req, *args: Any, **kwargs: Any
) -> Any:
    """Arrival (and return of a retracted/preempted request): submit to the core."""
    result = original(scheduler, req, *args, **kwargs)
    queue = getattr(scheduler, "waiting_queue", None)
    if _is_unified(scheduler) and queue and queue[-1] is req:

        def submit() -> None:
            state = get_state()
            state.read_priority_order(scheduler)
            state.enqueue(req)

        _guarded("submit", submit)
    return result


def _hook_get_new_batch_prefill_raw(
    original: Callable[..., Any], scheduler: Any, *args: Any, **kwargs: Any
) -> Any:
    """Scope the ordering and admission hooks to the unified prefill pass."""
    if not _is_unified(scheduler):
        return original(scheduler, *args, **kwargs)
    state = get_state()
    if not state.adapter.metrics_decided:
        _guarded("start", lambda: state.start(scheduler))
    if not scheduler.waiting_queue and state.core.num_waiting:
        _guarded("sync", lambda: state.sync_waiting(scheduler.waiting_queue))
    state.in_pass, state.queue = True, None
    try:
        with state.adapter.selecting():  # a prefix hit is asked once per pass
            return original(scheduler, *args, **kwargs)
    finally:
        state.in_pass, state.queue = False, None


def _hook_calc_priority(
    original: Callable[..., Any], policy: Any, waiting_queue: list[_Req], *args: Any, **kwargs: Any
) -> Any:
    """Let SGLang match prefixes as usual, then put the core's choice first."""
    result = original(policy, waiting_queue, *args, **kwargs)
    state = get_state()
    if state.in_pass:

        def order() -> None:
            state.sync_waiting(waiting_queue)
            state.put_head_first(waiting_queue)

        _guarded("ordering", order)
    return result


def _hook_add_one_req(
    original: Callable[..., Any], adder: Any, req: _Req, *args: Any, **kwargs: Any
) -> Any:
    """Admit only the core's next choice; charge it once SGLang has really admitted it."""
    state = get_state()
    if not state.in_pass or state.queue is None:
        return original(adder, req, *args, **kwargs)
    head = _guarded("peek", lambda: state.is_head(req))
    if head is False:
        from sglang.srt.managers.schedule_policy import AddReqResult

        return AddReqResult.OTHER  # no skipping: the pass ends here
    before = len(adder.can_run_list)
    result = original(adder, req, *args, **kwargs)
    if head and len(adder.can_run_list) > before and adder.can_run_list[-1] is req:
        _guarded("admission", lambda: state.admitted(req))
    return result


def _hook_process_batch_result(
    original: Callable[..., Any], scheduler: Any, batch: Any, *args: Any, **kwargs: Any
) -> Any:
    """Charge the tokens a batch generated and release the requests that finished."""
    result = original(scheduler, batch, *args, **kwargs)
    reqs = list(getattr(batch, "reqs", None) or [])
    if reqs:
        _guarded("batch result", lambda: get_state().batch_done(reqs))
    return result


def _hook_retract_decode(
    original: Callable[..., Any], batch: Any, *args: Any, **kwargs: Any
) -> Any:
    """SGLang's retraction is VTC's preemption: no second prefill charge."""
    result = original(batch, *args, **kwargs)
    retracted, _ratio, aborted = result
    _guarded("retraction", lambda: get_state().retracted(list(retracted), list(aborted)))
    return result


def _hook_abort_request(
    original: Callable[..., Any], scheduler: Any, *args: Any, **kwargs: Any
) -> Any:
    """Waiting requests an abort removed leave the core too (running ones finish)."""
    result = original(scheduler, *args, **kwargs)
    if _is_unified(scheduler):
        queue = scheduler.waiting_queue
        _guarded("abort", lambda: get_state().sync_waiting(queue))
    return result


_SCHEDULER = "sglang.srt.managers.scheduler.Scheduler"
HOOKS: dict[str, Callable[..., Any]] = {
    f"{_SCHEDULER}._add_request_to_queue": _hook_add_request_to_queue,
    f"{_SCHEDULER}._get_new_batch_prefill_raw": _hook_get_new_batch_prefill_raw,
    f"{_SCHEDULER}.process_batch_result": _hook_process_batch_result,
    f"{_SCHEDULER}.abort_request": _hook_abort_request,
    "sglang.srt.managers.schedule_policy.SchedulePolicy.calc_priority": _hook_calc_priority,
    "sglang.srt.managers.schedule_policy.PrefillAdder.add_one_req": _hook_add_one_req,
    "sglang.srt.managers.schedule_batch.ScheduleBatch.retract_decode": _hook_retract_decode,
}
"""Target (dotted path) -> AROUND hook, as registered by :func:`register`."""

_registered = False


def register() -> None:
    """The ``sglang.srt.plugins`` entry point: register the AROUND hooks.

    SGLang's ``load_plugins()`` calls this with no arguments and then applies
    the hooks (``HookRegistry.apply_hooks()``). Idempotent.

    Every ``VTC_*`` variable is validated first (:func:`vtc.config.check_env`);
    ``Engine.__init__`` loads the plugins before it parses its arguments, long
    before the model loads. ``load_plugins()`` logs and swallows an ``Exception``
    from a plugin and serves without it, so a malformed variable raises
    ``SystemExit`` (the :class:`vtc.config.ConfigError` as its cause), which
    stops the server with the message naming the variable.
    """
    global _registered
    if _registered:
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    try:
        check_env()  # the shared-counter variables too, not only this module's
        state = get_state()  # before any hook exists
    except ConfigError as e:
        logger.error("vtc: %s", e)
        raise SystemExit(f"vtc: invalid configuration, SGLang stops: {e}") from e
    for target, hook in HOOKS.items():
        HookRegistry.register(target, hook, HookType.AROUND)
    _registered = True
    # SGLang configures logging after its plugins load: this line shows only where
    # logging was set up before (an embedding program); VtcState.start logs the
    # one a server shows.
    logger.info("vtc: VTC fair scheduling hooks registered: %s", state.adapter.describe())
