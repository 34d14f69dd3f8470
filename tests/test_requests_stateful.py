"""A hypothesis state machine over :class:`vtc.adapter.Requests`, the layer both
engine shells drive, against a plain model of what it must keep.

Every call an engine shell makes (submit, admit the head, skip it, put back,
release, the four ways of charging, scheduling passes, the engine's enqueue and
the waiting set's safety net) in random order, with the
awkward arguments engines pass: keys whose hashes collide (``-1`` and ``-2``,
``1`` and ``2**61``), prompt lengths and priorities out of range, cached lengths
beyond the prompt, charges of unknown, repeated, waiting and set-aside requests,
output steps that are uniform or not. After every call:

* each tracked request is in the state the model says, under one core id of its
  own, and nothing untracked is left in the core (nothing lost or duplicated);
* the answers to the engine's hot questions (``num_waiting``; ``head``, kept
  across calls by a change count) equal the core's answers now;
* each tenant's raw tokens in the core (``client_tokens``) are the model's: the
  prompt less its cached part at the first admission only, every produced token
  once (a token produced while not running is owed and charged at the next
  admission, or found again by the next cumulative count); and its weighted
  service is those tokens at the prices, each divided by the weight in force when
  it was charged (weights change between calls, as a reload changes them);
* an observer was told exactly those tokens (metrics and traces count from it),
  and a tenant the idle sweep forgets had nothing tracked;
* the core's own invariants hold.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

import vtc
from helpers import Clock, Out, remove_tree
from vtc.adapter import ASIDE, RUNNING, WAITING, Adapter, Observer
from vtc.config import EngineConfig
from vtc.metrics import TenantMetrics

M = 64
# 1 and 2**61 hash alike, and so do -1 and -2: the second of a pair gets the next free id
KEYS = st.sampled_from([1, 2**61, -1, -2, 7, "a", "b", ("t", 3), 2**61 + 1])
TENANTS = st.sampled_from(["x", "y", "z"])
PROMPTS = st.sampled_from([1, 5, 16, M, 0, -3, M + 7, 2.7, True])
PRIORITIES = st.sampled_from([0, 0, 1, -1, 2**70, -(2**70)])
CACHED = st.sampled_from([0, 1, 3, M * 2, -5])
TOKENS = st.integers(-1, 4)


class Tally(Observer):
    """What the observers are told, per tenant: prompt and decode tokens."""

    def __init__(self):
        self.prompt: Counter[str] = Counter()
        self.decode: Counter[str] = Counter()

    def admitted(self, t, prompt_tokens):
        self.prompt[t.tenant] += prompt_tokens

    def charged(self, produced):
        for t, n in produced:
            self.decode[t.tenant] += n

    def forgot(self, tenants):
        for tenant in tenants:
            del self.prompt[tenant], self.decode[tenant]


@dataclass(frozen=True)
class Payload:
    n: int


@dataclass
class Req:
    tenant: str
    prompt: int  # as the core holds it: clamped to [1, M]
    state: str = WAITING
    owed: int = 0  # produced while not running, charged at the next admission
    admitted: bool = False
    charged: int = 0  # the last cumulative count charged (charge_totals)


class RequestsMachine(RuleBasedStateMachine):
    @initialize()
    def start(self):
        self.core = vtc.Scheduler(M=M)
        self.tally = Tally()
        self.adapter = Adapter(self.core, EngineConfig(), observers=[self.tally])
        self.requests = self.adapter.requests
        self.model: dict[object, Req] = {}
        self.prompt: Counter[str] = Counter()
        self.decode: Counter[str] = Counter()
        self.service: dict[str, float] = {t: 0.0 for t in ("x", "y", "z")}
        self.weights: dict[str, float] = {}  # set by set_weight (1 otherwise)
        self.in_pass = False
        self.scheduling = None  # the scheduling pass entered, if any
        self.serial = 0

    # -- helpers ---------------------------------------------------------------------
    def new_request(self) -> Payload:
        """An engine's request object: numbered, so a rule can pick some by it."""
        self.serial += 1
        return Payload(self.serial)

    def keys_in(self, state: str) -> list[object]:
        return [k for k, r in self.model.items() if r.state == state]

    def charge_decode(self, tenant: str, n: int) -> None:
        """The model of ``n`` generated tokens of ``tenant`` charged: its raw count, and
        its weighted service at the weight in force (``wq * n / weight``)."""
        self.decode[tenant] += n
        self.service[tenant] += self.core.wq * n / self.weights.get(tenant, 1.0)

    def produce(self, key, n: int) -> None:
        """The model of a charge of ``n`` tokens to ``key`` by charge_keys/outputs."""
        r = self.model.get(key)
        if r is None or n <= 0:
            return
        if r.state == RUNNING:
            self.charge_decode(r.tenant, n)
        else:
            r.owed += n

    def admit_head(self, cached: int) -> None:
        t = self.requests.head()
        r = self.model[t.key]
        assert r.state == WAITING
        self.requests.admit(t, cached)
        if not r.admitted:
            n = r.prompt - min(max(cached, 0), r.prompt)
            self.prompt[r.tenant] += n
            self.service[r.tenant] += self.core.wp * n / self.weights.get(r.tenant, 1.0)
            r.admitted = True
        self.charge_decode(r.tenant, r.owed)
        r.owed, r.state = 0, RUNNING

    def forgotten(self, tenant: str) -> None:
        """``tenant`` was forgotten, its tokens in the model with it."""

    # -- the engine's calls ------------------------------------------------------------
    @rule(key=KEYS, tenant=TENANTS, prompt=PROMPTS, priority=PRIORITIES)
    def submit(self, key, tenant, prompt, priority):
        if key in self.model:
            try:
                self.requests.submit(key, self.new_request(), tenant, prompt, priority)
            except ValueError:
                return
            raise AssertionError(f"{key!r} tracked twice")
        self.requests.submit(key, self.new_request(), tenant, prompt, priority)
        self.model[key] = Req(tenant, min(max(int(prompt), 1), M))

    @precondition(lambda self: self.core.num_waiting > 0)
    @rule(cached=CACHED)
    def admit(self, cached):
        self.admit_head(cached)

    @precondition(lambda self: self.core.num_waiting > 0)
    @rule()
    def set_aside(self):
        t = self.requests.head()
        self.requests.set_aside(t)
        self.model[t.key].state = ASIDE

    @precondition(lambda self: bool(self.model))
    @rule(data=st.data())
    def put_back(self, data):
        key = data.draw(st.sampled_from(sorted(self.model, key=repr)))
        self.requests.put_back(self.requests.get(key))
        r = self.model[key]
        r.state = WAITING

    @precondition(lambda self: bool(self.model))
    @rule(data=st.data())
    def put_back_all(self, data):
        keys = data.draw(st.lists(st.sampled_from(sorted(self.model, key=repr)), unique=True))
        self.requests.put_back_all([self.requests.get(k) for k in keys])
        for k in keys:
            self.model[k].state = WAITING

    @rule(key=KEYS, finished=st.booleans())
    def release(self, key, finished):
        t = self.requests.release(key, finished)
        assert (t is None) == (key not in self.model)
        self.model.pop(key, None)

    @rule(keys=st.lists(KEYS, max_size=5), done=st.sampled_from([None, "even", "none"]))
    def release_finished(self, keys, done):
        # a step's finishes: keys repeat or are untracked; ``done`` picks which
        # requests the engine says finished (by the request object it holds)
        says = {None: None, "even": lambda r: r.n % 2 == 0, "none": lambda r: False}[done]
        picked = [
            k
            for k in dict.fromkeys(keys)
            if k in self.model and (says is None or says(self.requests.get(k).request))
        ]
        released = self.requests.release_finished(keys, says)
        assert [t.key for t in released] == picked
        for k in picked:
            del self.model[k]

    @rule(produced=st.lists(st.tuples(KEYS, TOKENS), max_size=6))
    def charge_keys(self, produced):
        self.requests.charge_keys(produced)
        for key, n in produced:
            self.produce(key, n)

    @rule(produced=st.lists(st.tuples(KEYS, TOKENS), max_size=6))
    def charge_outputs(self, produced):
        # outputs of untracked keys too (released with output in flight), whose
        # key_id may be a tracked request's id (1 and 2**61): never charged
        outs = [Out(k, max(n, 0)) for k, n in produced]
        self.requests.charge_outputs(outs)
        for key, n in produced:
            self.produce(key, n)

    @precondition(lambda self: bool(self.keys_in(RUNNING)))
    @rule(
        n=st.integers(1, 3), every=st.booleans(), tokens=st.sampled_from([None, "outputs", "all"])
    )
    def charge_running(self, n, every, tokens):
        """A decode step of running requests only, each once (``running=True``):
        every running request with the same count (uniform), or all but one. With
        ``tokens``, the step's token lists too: one per output (as vLLM's sampled
        tokens are), or one per running request, one more than the outputs when
        one request had none (as for a request vLLM scheduled but made no output
        for): only the outputs' tokens are charged."""
        running = self.keys_in(RUNNING)
        keys = running if every else running[1:]
        lists = {None: None, "outputs": keys, "all": running}[tokens]
        self.requests.charge_outputs(
            [Out(k, n) for k in keys],
            running=True,
            tokens=None if lists is None else [[0] * n for _ in lists],
        )
        for key in keys:
            self.produce(key, n)

    @rule(totals=st.lists(st.tuples(KEYS, st.integers(0, 12)), max_size=6))
    def charge_totals(self, totals):
        self.requests.charge_totals(totals)
        for key, total in totals:
            r = self.model.get(key)
            if r is not None and r.state == RUNNING and total > r.charged:
                self.charge_decode(r.tenant, total - r.charged)
                r.charged = total

    @rule(key=KEYS, tenant=TENANTS, prompt=PROMPTS, charged=st.integers(0, 5))
    def enqueue(self, key, tenant, prompt, charged):
        """The engine put a request in its waiting queue (SGLang's path): one the core
        holds goes back to waiting, any other arrives."""
        self.adapter.enqueue(key, self.new_request(), [tenant], prompt, charged=charged)
        r = self.model.get(key)
        if r is not None:
            r.state = WAITING
        else:
            self.model[key] = Req(tenant, min(max(int(prompt), 1), M), charged=charged)

    @rule(keys=st.lists(KEYS, unique=True, max_size=5), tenant=TENANTS)
    def sync_waiting(self, keys, tenant):
        """The safety net: the engine's waiting queue is ``keys``."""
        for key, r in list(self.model.items()):
            if r.state == WAITING and key not in keys:
                del self.model[key]
        waiting = {key: key for key in keys}
        self.requests.sync_waiting(waiting, lambda key: self.enqueue(key, tenant, 4, 0))

    @rule(tenant=TENANTS, weight=st.sampled_from([0.25, 1.0, 3.0]))
    def set_weight(self, tenant, weight):
        """A weights reload: the next charges of ``tenant`` use ``weight``."""
        self.core.set_weight(tenant, weight)
        self.weights[tenant] = weight

    @rule(on=st.booleans())
    def selecting(self, on):
        """A scheduling pass starts (or ends), entered as an engine enters one."""
        if on and self.scheduling is None:
            self.scheduling = self.adapter.selecting()
            self.scheduling.__enter__()
        elif not on and self.scheduling is not None:
            self.scheduling.__exit__(None, None, None)
            self.scheduling = None
        self.in_pass = self.scheduling is not None

    def teardown(self):
        if getattr(self, "scheduling", None) is not None:
            self.scheduling.__exit__(None, None, None)  # (a pass the run left open)

    @precondition(lambda self: not self.in_pass)
    @rule(tenant=TENANTS, by=st.sampled_from([1.0, 100.0]))
    def raise_counter(self, tenant, by):
        """What a shared counters' sync does between passes: a counter rises."""
        self.core.raise_counter(tenant, self.core.counter(tenant) + by)

    @rule()
    def forget_idle(self):
        """The sweep every FORGET_EVERY arrivals: only tenants with nothing tracked
        go, and their token counts with them (the core's and the observers')."""
        before = set(self.core.clients())
        self.adapter.tenancy.forget_idle()
        gone = before - set(self.core.clients())
        event(f"forgot {len(gone)} tenants")
        for tenant in gone:
            assert all(r.tenant != tenant for r in self.model.values()), tenant
            self.forgotten(tenant)
            self.service[tenant] = 0.0
            self.weights.pop(tenant, None)
            self.prompt.pop(tenant, None)
            self.decode.pop(tenant, None)

    # -- what must hold after every call -------------------------------------------------
    @invariant()
    def states_are_the_models_and_nothing_is_lost(self):
        requests, core = self.requests, self.core
        assert len(requests) == len(self.model)
        rids = set()
        for key, r in self.model.items():
            t = requests.get(key)
            assert t is not None and t.key == key and requests.find(t.rid) is t
            assert requests.status(t) == r.state, (key, r)
            rids.add(t.rid)
        assert len(rids) == len(self.model)
        waiting = len(self.keys_in(WAITING))
        running = len(self.keys_in(RUNNING))
        assert core.num_running == running
        assert requests.num_aside == len(self.keys_in(ASIDE))
        # each id in the core is a tracked one
        assert set(core.running()) <= rids
        assert core.num_waiting == waiting

    @invariant()
    def cached_answers_are_the_cores(self):
        requests, core = self.requests, self.core
        assert requests.num_waiting() == core.num_waiting
        rid = core.peek()
        head = requests.head()
        assert (head is None) == (rid is None)
        if head is not None:
            assert head.rid == rid

    @invariant()
    def tokens_are_charged_once(self):
        for tenant in ("x", "y", "z"):
            have = self.core.client_tokens(tenant)
            assert have == (self.prompt[tenant], self.decode[tenant]), tenant
            assert self.core.weight(tenant) == self.weights.get(tenant, 1.0), tenant
            service = self.core.service(tenant)
            assert math.isclose(service, self.service[tenant], rel_tol=1e-9), (tenant, service)
        assert +self.tally.prompt == +self.prompt
        assert +self.tally.decode == +self.decode
        self.core._check_invariants()


def series(registry: CollectorRegistry, name: str) -> dict[tuple, float]:
    """The samples of ``name``, by their labels."""
    return {
        tuple(sorted(sample.labels.items())): sample.value
        for family in registry.collect()
        for sample in family.samples
        if sample.name == name
    }


def by_label(samples: dict[tuple, float], key: str) -> Counter[str]:
    """``samples`` summed over tenants, by the label ``key``."""
    out: Counter[str] = Counter()
    for labels, v in samples.items():
        out[dict(labels)[key]] += v
    return out


class MetricsMachine(RequestsMachine):
    """The same calls with the per-tenant Prometheus series on (two tenant labels for
    three tenants, so the rest is summed under ``_other`` and labels move), refreshed
    at every engine step: the token counters grew by exactly the tokens charged
    since the last refresh (a counter's increase, as Prometheus reads it: a series
    that ends, when its tenant loses its label or is forgotten, and is made again
    when its tenant is labelled again goes on from its total,
    ``vtc.metrics.ENDED_KEPT_PER_LABEL``), and the request gauges summed over
    tenants are the core's waiting and running counts. Labels are chosen at every
    refresh, or at most every 2 s (``relabel_interval``)."""

    @initialize(relabel_interval=st.sampled_from([0.0, 2.0]))
    def start(self, relabel_interval):
        super().start()
        self.relabel_interval = relabel_interval
        self.clock = Clock()
        self.registry = CollectorRegistry()
        self.metrics = TenantMetrics(
            self.registry,
            max_tenants=2,
            interval=0.0,
            relabel_interval=self.relabel_interval,
            window=5.0,
            clock=self.clock,
        )
        self.adapter.observers.append(self.metrics)
        self.ever: Counter[str] = Counter()  # tokens charged, forgotten tenants' too
        self.reader = self.registry  # where the series are read: the registry itself

    def forgotten(self, tenant: str) -> None:
        self.ever["prompt"] += self.prompt[tenant]
        self.ever["decode"] += self.decode[tenant]

    def charged_so_far(self) -> Counter[str]:
        return Counter(
            prompt=self.ever["prompt"] + sum(self.prompt.values()),
            decode=self.ever["decode"] + sum(self.decode.values()),
        )

    @rule(seconds=st.sampled_from([0.0, 0.5, 1.0, 7.0]))
    def step_done(self, seconds):
        self.clock.now += seconds
        self.adapter.step_done()  # a refresh (interval 0)
        tokens = series(self.reader, "vtc_tenant_service_tokens_total")
        before = getattr(self, "tokens", {})
        grown = by_label({k: v - before.get(k, 0.0) for k, v in tokens.items()}, "kind")
        charged, last = self.charged_so_far(), getattr(self, "charged", Counter())
        for kind in ("prompt", "decode"):
            assert grown[kind] == charged[kind] - last[kind], (kind, before, tokens)
        # a series absent now (ended) keeps its last value: made again, it goes on
        # from there (at most 3 tenants x 3 counter series: none of their totals
        # dropped, ENDED_KEPT_PER_LABEL x max_tenants are kept)
        self.tokens, self.charged = {**before, **tokens}, charged
        requests = by_label(series(self.reader, "vtc_tenant_requests"), "state")
        assert requests["running"] == self.core.num_running
        assert requests["waiting"] == self.core.num_waiting + self.requests.num_aside


RequestsMachine.TestCase.settings = settings(
    max_examples=400, stateful_step_count=50, deadline=None
)
TestRequests = RequestsMachine.TestCase
MetricsMachine.TestCase.settings = RequestsMachine.TestCase.settings
TestRequestsWithMetrics = MetricsMachine.TestCase


class DirectoryMetricsMachine(MetricsMachine):
    """The same, with the series in a prometheus_client multiprocess directory (vtc's
    own files, vtc.multiproc, as vLLM and SGLang serve them), read back by
    prometheus_client's collector as a server's ``/metrics`` reads them: each refresh
    writes values into files that label swaps and forgotten tenants rewrite
    (compaction), and a value remembers where its entry is between writes."""

    @initialize(relabel_interval=st.sampled_from([0.0, 2.0]))
    def start(self, relabel_interval):
        self.directory = tempfile.mkdtemp(prefix="vtc-prom-")
        self.saved_env = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = self.directory  # read by TenantMetrics
        super().start(relabel_interval)
        assert self.metrics._families.files is not None  # into the directory
        self.reader = CollectorRegistry()
        MultiProcessCollector(self.reader, path=self.directory)

    def teardown(self):
        super().teardown()
        if getattr(self, "directory", None) is None:
            return
        if self.saved_env is None:
            os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
        else:
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = self.saved_env
        remove_tree(Path(self.directory))  # (its worker may still make a spare)


DirectoryMetricsMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=50, deadline=None
)
TestRequestsWithMetricsInADirectory = DirectoryMetricsMachine.TestCase
