"""A real SGLang server on this CPU, with the plugin and without (issue 18).

``python -m sglang.launch_server`` serves a tiny random Llama made here (no
download) on SGLang's CPU engine with ``--attention-backend torch_native``;
``tests/sglang/standin`` stands in for ``sgl_kernel``'s CPU build, whose
functions this path never calls (each raises if it is). One request runs at a
time (``--max-running-requests 1``), so the order in which the server finishes
requests is the order it admitted them (unless one is preempted).

Everything asserted is read from the server's own records: the queue from
``/v1/loads``, completion times from each response's
``meta_info.response_sent_to_client_ts`` (stamped by the server), tokens and
preemptions (``num_retractions``) from ``meta_info``, the plugin's charges from
its series on ``/metrics``. The client only submits: on two busy cores it may be
late, and nothing here depends on its timing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tiny_model import make_tiny_llama

from redis_server import free_port  # tests/, on the path (conftest)

HERE = Path(__file__).resolve().parent
STANDIN = HERE / "standin"
#: a server starts in 40-65 s here, up to 150 s on a loaded machine
START_DEADLINE = 600.0
# SGLang's log line once its warm-up request is served (sglang/srt/entrypoints/http_server.py)
READY_LINE = "The server is fired up and ready to roll!"
#: a condition on the server's records (a queue length, a response)
DEADLINE = 600.0
PROMPT = [11, 22, 33, 44, 55, 66, 77, 88]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A tiny random Llama (float32, 2 layers), saved as a Hugging Face model."""
    return make_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


class Server:
    """One ``sglang.launch_server`` process group, its log in a file."""

    def __init__(
        self,
        model: Path,
        log: Path,
        *,
        plugin: bool,
        env: dict[str, str],
        args: tuple[str, ...] = ("--max-running-requests", "1"),
    ) -> None:
        self.plugin = plugin
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        environ = dict(os.environ)
        environ.update(
            SGLANG_USE_CPU_ENGINE="1",
            OMP_NUM_THREADS="1",
            PYTHONPATH=os.pathsep.join([str(STANDIN), *filter(None, [environ.get("PYTHONPATH")])]),
            # SGLang loads every installed plugin unless SGLANG_PLUGINS names some.
            SGLANG_PLUGINS="vtc" if plugin else "stock-sglang-no-plugin",
        )
        environ.update(env)  # a test's own values win, SGLANG_PLUGINS and PYTHONPATH too
        cmd = [
            sys.executable,
            "-m",
            "sglang.launch_server",
            "--model-path",
            str(model),
            "--device",
            "cpu",
            "--skip-tokenizer-init",
            "--attention-backend",
            "torch_native",
            "--dtype",
            "float32",
            "--max-total-tokens",
            "4096",
            *args,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
        ]
        self._out = open(log, "w")  # noqa: SIM115 - closed in stop()
        # Its own process group (to stop it whole) but this session: a new session is
        # a new scheduler autogroup, whose busy server can starve this client for
        # seconds at a time on this kernel (see tests/vllm/test_vllm_e2e.py).
        self.proc = subprocess.Popen(
            cmd, env=environ, stdout=self._out, stderr=subprocess.STDOUT, process_group=0
        )

    def tail(self, n: int = 60) -> str:
        lines = self.log.read_text(errors="replace").splitlines()
        return "\n".join(lines[-n:])

    def get(self, path: str, timeout: float = 10.0) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=timeout) as r:
            return json.load(r)

    def wait_ready(self) -> None:
        """Until SGLang answers ``/model_info`` and has served its own warm-up
        request: ``launch_server`` sends one (``input_ids`` [10, 11, 12]) once the
        HTTP server is up, so ``/model_info`` can answer first, and a warm-up
        still queued on a busy machine would be counted by a test's
        ``num_waiting_reqs`` wait and race its submissions. SGLang logs
        READY_LINE after the warm-up (or at once with --skip-server-warmup)."""
        deadline = time.monotonic() + START_DEADLINE
        answered = False
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"SGLang exited with {self.proc.returncode}:\n{self.tail()}")
            if not answered:
                try:
                    self.get("/model_info")
                    answered = True
                except (OSError, urllib.error.URLError, ValueError):
                    time.sleep(0.5)
                    continue
            if READY_LINE in self.log.read_text(errors="replace"):
                return
            time.sleep(0.5)
        what = "finish its warm-up" if answered else "answer /model_info"
        pytest.fail(f"SGLang did not {what} in {START_DEADLINE:.0f} s:\n{self.tail()}")

    def load(self) -> dict[str, int]:
        (load,) = self.get("/v1/loads")["loads"]
        return load

    def poll(self, what: str, read, cond, every: float):
        """Call ``read()`` every ``every`` seconds until ``cond`` holds for what it
        returned (which is returned), failing if the server exits or DEADLINE passes:
        a wait for a condition, the interval only spaces the reads."""
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:
            got = read()
            if cond(got):
                return got
            if self.proc.poll() is not None:
                pytest.fail(f"SGLang exited while waiting for {what}:\n{self.tail()}")
            time.sleep(every)
        pytest.fail(f"SGLang never reached {what} (last read {got}):\n{self.tail()}")

    def wait_for(self, what: str, cond) -> dict[str, int]:
        """Poll ``/v1/loads`` until ``cond(load)`` holds."""
        return self.poll(what, self.load, cond, every=0.05)

    def generate(
        self,
        tenant: str,
        max_new_tokens: int,
        out: dict,
        name: str,
        prompt: list[int] = PROMPT,
        priority: int | None = None,
        ignore_eos: bool = True,
    ) -> threading.Thread:
        """POST /generate from a thread (request id ``name``, SGLang's ``priority`` if
        given); its response lands in ``out[name]``."""
        body: dict[str, Any] = {
            "rid": name,
            "input_ids": prompt,
            "sampling_params": {
                "max_new_tokens": max_new_tokens,
                "temperature": 0.0,
                "ignore_eos": ignore_eos,
                "custom_params": {"tenant": tenant},
            },
        }
        if priority is not None:
            body["priority"] = priority

        def post() -> None:
            req = urllib.request.Request(
                self.url + "/generate",
                data=json.dumps(body).encode(),
                headers={"Content-Type": "application/json"},
            )
            try:
                with urllib.request.urlopen(req, timeout=DEADLINE) as r:
                    out[name] = json.load(r)
            except Exception as e:  # reported by the test that reads out[name]
                out[name] = e

        thread = threading.Thread(target=post, name=name, daemon=True)
        thread.start()
        return thread

    def post(self, path: str, body: dict) -> None:
        req = urllib.request.Request(
            self.url + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=60) as r:
            r.read()

    def metrics(self) -> dict[tuple[str, frozenset], float]:
        """The server's /metrics: {(name, {(label, value)}): value}."""
        from prometheus_client.parser import text_string_to_metric_families

        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as r:
            text = r.read().decode()
        return {
            (sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }

    def wait_for_metrics(self, what: str, cond) -> dict[tuple[str, frozenset], float]:
        """Poll /metrics until ``cond(metrics)`` holds."""
        return self.poll(f"{what} on /metrics", self.metrics, cond, every=0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=60)
        self._out.close()


def running(server: Server) -> Iterator[Server]:
    """``server`` once it answers, stopped afterwards, whatever the test did: a
    fixture's ``yield from`` (as ``running_redis`` in tests/redis_server.py)."""
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module", params=["vtc", "stock"])
def server(request, model_dir, tmp_path_factory) -> Iterator[Server]:
    """One running slot; tenant weights from a file the plugin re-reads when it changes
    (checked every 0.05 s of steps; only tenants named in it are weighted)."""
    plugin = request.param == "vtc"
    here = tmp_path_factory.mktemp(f"sglang-{request.param}")
    log, weights = here / "server.log", here / "weights.json"
    weights.write_text(json.dumps({"gold": 4}))
    env = {
        "VTC_LOG_INTERVAL": "0",
        "VTC_WEIGHTS_FILE": str(weights),
        "VTC_WEIGHTS_RELOAD": "0.05",
    }
    s = Server(model_dir, log, plugin=plugin, env=env)
    s.weights_file = weights
    yield from running(s)


# The blocker's tokens: it must outlast the plan's submissions, each only once the one
# before is seen queued. At ~850 tokens a second (this CPU, one running request) 400
# lasted ~0.45 s, and a `make test` saw the 8th request of a plan queued at the
# blocker's 387th token: the next /v1/loads read came after the blocker finished, and
# the wait for "8 queued" hung until its timeout. 1,600 (the tiny model's positions
# are 2,048) give ~2 s; and a wait for a request queued ends when the blocker has
# finished, so that a plan outrun by it fails on its order, not after ten minutes.
BLOCKER_TOKENS = 1600


def _wait_until_queued(server: Server, n: int, out: dict[str, Any]) -> None:
    """Until the server has ``n`` requests waiting (or the blocker finished)."""
    server.wait_for(
        f"{n} queued (or the blocker finished)",
        lambda load: load["num_waiting_reqs"] >= n or "blocker" in out,
    )


def submit_in_order(
    server: Server,
    plan: list[tuple],
    blocker_priority: int | None = None,
    option: str = "priority",
) -> dict[str, Any]:
    """Submit ``plan`` (name, tenant, max_new_tokens[, the value of
    :meth:`Server.generate`'s keyword ``option``: its priority, or its prompt]) behind
    a blocker that keeps the one running slot busy, each request only once the
    server has queued the one before: the server's arrival order is the plan's.
    Returns the responses."""
    out: dict[str, Any] = {}
    threads = [
        server.generate("blocker", BLOCKER_TOKENS, out, "blocker", priority=blocker_priority)
    ]
    server.wait_for("the blocker running", lambda load: load["num_running_reqs"] == 1)
    for i, (name, tenant, tokens, *value) in enumerate(plan):
        threads.append(server.generate(tenant, tokens, out, name, **dict(zip([option], value))))
        _wait_until_queued(server, i + 1, out)
    for t in threads:
        t.join(DEADLINE)
    for name in ["blocker", *(p[0] for p in plan)]:
        assert isinstance(out.get(name), dict), f"{name}: {out.get(name)!r}\n{server.tail()}"
    return out


def test_a_late_tenant_is_served_between_the_early_tenants_requests(server):
    """Six requests of tenant A, then two of B, all queued behind a blocker.
    Stock SGLang serves them first come, first served: B waits for all of A.
    With the plugin B's counter is A's at its first request, so B is served
    as soon as A has had as much: B0 among the first three, B1 among the first
    five (max-min fair order A0 B0 A1 B1 A2 A3 A4 A5, ties going to A)."""
    plan = [(f"A{i}", "A", 48) for i in range(6)] + [(f"B{i}", "B", 48) for i in range(2)]
    out = submit_in_order(server, plan)
    for name, _, tokens in plan:
        meta = out[name]["meta_info"]
        assert meta["completion_tokens"] == tokens and len(out[name]["output_ids"]) == tokens
        assert meta["prompt_tokens"] == len(PROMPT)

    def sent(name: str) -> float:
        return out[name]["meta_info"]["response_sent_to_client_ts"]

    done = sorted((p[0] for p in plan), key=sent)
    assert sent("blocker") < sent(done[0])
    if not server.plugin:
        assert done == [f"A{i}" for i in range(6)] + ["B0", "B1"]
    else:
        assert done.index("B0") <= 2 and done.index("B1") <= 4, done
        assert [n for n in done if n.startswith("A")] == [f"A{i}" for i in range(6)]
        assert done.index("B0") < done.index("B1")


def _weighted_order(plan: list[tuple], weights: dict[str, float]) -> list[str]:
    """The order vtc.reference admits ``plan`` (queued in order behind a running
    blocker, one request at a time) with these tenant weights."""
    from vtc import reference

    ref = reference.Scheduler(M=4096, wp=1.0, wq=2.0)
    for tenant, weight in weights.items():
        ref.set_weight(tenant, weight)
    ref.submit(0, "blocker", len(PROMPT))
    ref.pop()
    for i, (_, tenant, _tokens, prompt) in enumerate(plan, 1):
        ref.submit(i, tenant, len(prompt))
    order = []
    while (rid := ref.pop()) is not None:
        ref.decode([rid], [plan[rid - 1][2]])
        ref.finish(rid)
        order.append(plan[rid - 1][0])
    return order


def test_weights_from_the_file_apply_and_a_changed_file_is_reloaded(server):
    """Round 1: light tenant L (weight 1) queues two requests, then gold (weight 4 in
    the weights file) six, behind a blocker. Stock SGLang serves them by arrival;
    the plugin gives gold four requests per one of L (L0 H0 H1 H2 H3 L1 H4 H5),
    where unweighted VTC would alternate. Then the file is rewritten to weigh tenant
    plat 4 too; once the plugin says it reloaded the file, round 2 runs the same
    plan with plat for gold and is served in the same weighted order. Prompts differ
    in their first token, so no request is a prefix-cache hit of another."""
    rounds = []
    for heavy, light, first in (("gold", "L", 300), ("plat", "T", 400)):
        plan = [(f"{light}{i}", light, 48, [first + i, *PROMPT[1:]]) for i in range(2)]
        plan += [(f"{heavy}{i}", heavy, 48, [first + 10 + i, *PROMPT[1:]]) for i in range(6)]
        rounds.append(plan)
    weights = {"gold": 4.0}
    for n, plan in enumerate(rounds):
        if n == 1:
            weights = {"gold": 4.0, "plat": 4.0}
            server.weights_file.write_text(json.dumps(weights))
            if server.plugin:
                _wait_for_reload(server)
        out = submit_in_order(server, plan, option="prompt")
        assert all(out[p[0]]["meta_info"]["cached_tokens"] == 0 for p in plan)
        assert all(_sent(out, "blocker") < _sent(out, p[0]) for p in plan)
        done = sorted((p[0] for p in plan), key=lambda n: _sent(out, n))
        if not server.plugin:
            assert done == [p[0] for p in plan], done  # first come, first served
            continue
        assert done == _weighted_order(plan, weights), (n, done)
        assert done != _weighted_order(plan, {}), done  # the weight made the difference
    if server.plugin:
        text = server.log.read_text(errors="replace")
        assert "VTC: weights reloaded from VTC_WEIGHTS_FILE" in text and "plat 1 -> 4" in text


def _sent(out: dict, name: str) -> float:
    return out[name]["meta_info"]["response_sent_to_client_ts"]


def _wait_for_reload(server: Server) -> None:
    """Probe requests (the plugin checks the file after a step) until the server log
    says the weights were reloaded."""

    def probe() -> str:
        out: dict[str, Any] = {}
        server.generate("probe", 2, out, f"probe-{time.monotonic_ns()}").join(DEADLINE)
        return server.log.read_text(errors="replace")

    server.poll("the weights reloaded", probe, lambda text: "plat 1 -> 4" in text, every=0.1)


# Servers used by one test are function-scoped: an idle SGLang scheduler still spins
# a core, and a module-scoped one would keep spinning until the module ends.
@pytest.fixture(params=["vtc", "stock"])
def priority_server(request, model_dir, tmp_path_factory) -> Iterator[Server]:
    """One running slot, SGLang's priority scheduling (larger values first, no
    priority preemption: the blocker keeps its slot)."""
    plugin = request.param == "vtc"
    log = tmp_path_factory.mktemp(f"sglang-priority-{request.param}") / "server.log"
    args = (
        "--max-running-requests",
        "1",
        "--enable-priority-scheduling",
        "--disable-priority-preemption",
        "--schedule-policy",
        "fcfs",
    )
    s = Server(model_dir, log, plugin=plugin, env={"VTC_LOG_INTERVAL": "0"}, args=args)
    yield from running(s)


def test_an_urgent_tenant_goes_first_and_the_batch_band_stays_fair(priority_server):
    """Four requests of batch tenant A, then two of B, at priority 1, then two of the
    urgent tenant U at priority 5, all queued behind a blocker. Both servers serve U
    first. Stock SGLang then takes the batch band by arrival (B waits for all of A);
    with the plugin B is served as soon as A has had as much, inside the band
    (A0 B0 A1 B1 A2 A3, ties going to A's earlier head)."""
    server = priority_server
    plan = [(f"A{i}", "A", 48, 1) for i in range(4)] + [(f"B{i}", "B", 48, 1) for i in range(2)]
    plan += [(f"U{i}", "U", 48, 5) for i in range(2)]
    out = submit_in_order(server, plan, blocker_priority=1)
    for name, _, tokens, _ in plan:
        assert out[name]["meta_info"]["completion_tokens"] == tokens

    def sent(name: str) -> float:
        return out[name]["meta_info"]["response_sent_to_client_ts"]

    done = sorted((p[0] for p in plan), key=sent)
    assert sent("blocker") < sent(done[0])
    if server.plugin:
        assert done == ["U0", "U1", "A0", "B0", "A1", "B1", "A2", "A3"], done
    else:
        assert done == ["U0", "U1", "A0", "A1", "A2", "A3", "B0", "B1"], done


def test_greedy_output_is_a_real_forward_of_the_model(server, model_dir):
    """The served tokens equal transformers' own greedy generate on the same model:
    the CPU engine really runs the model (the stand-in computes nothing)."""
    import torch
    from transformers import LlamaForCausalLM

    out: dict[str, Any] = {}
    server.generate("check", 16, out, "check").join(DEADLINE)
    assert isinstance(out.get("check"), dict), out.get("check")
    model = LlamaForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    with torch.no_grad():
        want = model.generate(
            torch.tensor([PROMPT]), max_new_tokens=16, do_sample=False, min_new_tokens=16
        )[0, len(PROMPT) :].tolist()
    assert out["check"]["output_ids"] == want


def test_the_server_log_says_whether_vtc_orders_the_queue(server):
    """The start-up line is logged once SGLang has set up its logging (a line
    logged when the plugin loads would be lost), with SGLang's KV pool size."""
    out: dict[str, Any] = {}
    server.generate("probe", 1, out, "probe").join(DEADLINE)
    assert isinstance(out.get("probe"), dict), out.get("probe")
    text = server.log.read_text(errors="replace")
    line = "vtc: VTC fair scheduling orders this scheduler's waiting queue: M=4096 tokens"
    if server.plugin:
        assert text.count(line) == 1, server.tail()
    else:
        assert "VTC fair scheduling" not in text


# -- the plugin's own records on SGLang's /metrics (--enable-metrics) -------------------


@pytest.fixture(scope="module")
def metrics_server(model_dir, tmp_path_factory) -> Iterator[Server]:
    """The plugin with SGLang's --enable-metrics: its per-tenant series on SGLang's
    own /metrics, refreshed at every step; two requests run at a time."""
    log = tmp_path_factory.mktemp("sglang-metrics") / "server.log"
    s = Server(
        model_dir,
        log,
        plugin=True,
        env={"VTC_LOG_INTERVAL": "0", "VTC_METRICS_INTERVAL": "0"},
        args=("--max-running-requests", "2", "--enable-metrics"),
    )
    yield from running(s)


def tokens(m: dict, tenant: str, kind: str) -> float:
    key = ("vtc_tenant_service_tokens_total", frozenset({("tenant", tenant), ("kind", kind)}))
    return m.get(key, 0.0)


def requests_of(m: dict, tenant: str) -> tuple[float, float]:
    """(waiting, running) of ``tenant``; a tenant without series has none."""
    return tuple(
        m.get(("vtc_tenant_requests", frozenset({("tenant", tenant), ("state", s)})), 0.0)
        for s in ("waiting", "running")
    )


def test_metrics_charge_what_the_server_computed_and_prefix_hits_are_free(metrics_server):
    """Two requests of P share a 64-token prefix, one after the other: SGLang's
    radix cache serves the second's prefix (meta_info.cached_tokens), and the
    plugin charges only the prompt tokens SGLang computed. Every tenant's
    series equal the server's own counts once nothing is left in flight."""
    server = metrics_server
    prefix = list(range(1, 65))
    out: dict[str, Any] = {}
    for i in range(2):
        server.generate("P", 5, out, f"P{i}", prompt=prefix + [100 + i] * 8).join(DEADLINE)
    server.generate("Q", 7, out, "Q0", prompt=[300 + i for i in range(20)]).join(DEADLINE)
    metas = {name: r["meta_info"] for name, r in out.items()}
    assert metas["P0"]["cached_tokens"] == 0 and metas["P1"]["cached_tokens"] >= 64

    m = server.wait_for_metrics(
        "P and Q settled",
        lambda m: (
            tokens(m, "Q", "decode") == 7 and requests_of(m, "P") == requests_of(m, "Q") == (0, 0)
        ),
    )
    for tenant, names in (("P", ["P0", "P1"]), ("Q", ["Q0"])):
        computed = sum(metas[n]["prompt_tokens"] - metas[n]["cached_tokens"] for n in names)
        assert tokens(m, tenant, "prompt") == computed, (tenant, metas)
        assert tokens(m, tenant, "decode") == sum(metas[n]["completion_tokens"] for n in names)
    assert tokens(m, "P", "prompt") < 2 * 72  # the hit was not charged
    bound = m[("vtc_fairness_bound", frozenset())]
    assert bound == 2 * max(1 * 72, 2 * 4096)  # 2 max(wp L, wq M), M = SGLang's KV pool


def test_aborted_requests_leave_no_state_and_are_charged_what_they_got(metrics_server):
    """Two long requests fill both running slots and a third waits; all three are
    aborted through SGLang's /abort_request (the waiting one first). Afterwards the
    plugin holds nothing for them, the waiting one was never charged, and each
    running one was charged its prompt and the tokens the server reports."""
    server = metrics_server
    out: dict[str, Any] = {}
    threads = []
    for name in ("R1", "R2", "W"):
        threads.append(server.generate(name, 1500, out, name, prompt=[7] * 10 + [len(name)] * 6))
        server.wait_for_metrics(f"{name} tracked", lambda m, n=name: sum(requests_of(m, n)) == 1)
    server.wait_for_metrics(
        "R1 and R2 running, W waiting",
        lambda m: (
            requests_of(m, "R1") == requests_of(m, "R2") == (0, 1) and requests_of(m, "W") == (1, 0)
        ),
    )
    for name in ("W", "R1", "R2"):
        server.post("/abort_request", {"rid": name})
    for t in threads:
        t.join(DEADLINE)
    metas = {}
    for name in ("R1", "R2", "W"):
        assert isinstance(out.get(name), dict), out.get(name)
        metas[name] = out[name]["meta_info"]
        assert metas[name]["finish_reason"]["type"] == "abort", metas[name]
    assert metas["W"]["completion_tokens"] == 0

    # A scrape reads the scheduler process's series while it may be refreshing
    # them (one gauge after another), so wait until all of them say it.
    m = server.wait_for_metrics(
        "nothing in flight",
        lambda m: (
            all(requests_of(m, n) == (0, 0) for n in ("R1", "R2", "W"))
            and m[("vtc_tenants_active", frozenset())] == 0
            and tokens(m, "R2", "decode") >= metas["R2"]["completion_tokens"]
        ),
    )
    assert tokens(m, "W", "prompt") == tokens(m, "W", "decode") == 0
    for name in ("R1", "R2"):
        meta = metas[name]
        assert tokens(m, name, "prompt") == meta["prompt_tokens"] - meta["cached_tokens"]
        # measured equal here; a step already under way when the abort lands may add one
        got = tokens(m, name, "decode")
        assert meta["completion_tokens"] <= got <= meta["completion_tokens"] + 1, (name, got, meta)


# -- priority preemption: an urgent arrival evicts a running batch request --------------


@pytest.fixture
def preemption_server(model_dir, tmp_path_factory) -> Iterator[Server]:
    """The plugin, one running slot, SGLang's priority scheduling with its priority
    preemption (on by default: no --disable-priority-preemption), and its metrics.
    An arrival preempts a running request whose priority is more than the threshold
    (SGLang's default, 10) below its own. No radix cache: a preempted request's
    prompt is no cache hit when it is admitted again, so a second prompt charge
    would show on /metrics (with the cache it would be charged as a hit, 0)."""
    log = tmp_path_factory.mktemp("sglang-preemption") / "server.log"
    args = (
        "--max-running-requests",
        "1",
        "--enable-priority-scheduling",
        "--priority-scheduling-preemption-threshold",
        "10",
        "--schedule-policy",
        "fcfs",
        "--disable-radix-cache",
        "--enable-metrics",
    )
    env = {"VTC_LOG_INTERVAL": "0", "VTC_METRICS_INTERVAL": "0"}
    s = Server(model_dir, log, plugin=True, env=env, args=args)
    yield from running(s)


def test_an_urgent_arrival_preempts_a_running_batch_request_charged_once(preemption_server):
    """Batch tenant B's long request (priority 1) runs in the one slot; once the
    server's metrics show it generating, urgent tenant U's request (priority 20)
    arrives. SGLang preempts B's request (its meta_info counts one retraction), runs
    U's to completion, then admits B's again, which recomputes its prompt and what
    it had generated (no cache hit). The plugin records the preemption, and charges
    B its prompt once and each token it generated once: a re-admitted request pays
    no prompt. B's request is long enough to be still running when U's arrives even
    if this client is late by seconds."""
    server = preemption_server
    batch_prompt = [200 + i for i in range(24)]  # no prefix shared with U's
    urgent_prompt = [400 + i for i in range(12)]
    batch_tokens, urgent_tokens = 1800, 16
    out: dict[str, Any] = {}
    threads = [server.generate("B", batch_tokens, out, "B0", prompt=batch_prompt, priority=1)]
    server.wait_for_metrics(
        "B0 running and generating",
        lambda m: requests_of(m, "B") == (0, 1) and tokens(m, "B", "decode") >= 8,
    )
    threads.append(
        server.generate("U", urgent_tokens, out, "U0", prompt=urgent_prompt, priority=20)
    )
    for t in threads:
        t.join(DEADLINE)
    for name in ("B0", "U0"):
        assert isinstance(out.get(name), dict), f"{name}: {out.get(name)!r}\n{server.tail()}"
    metas = {name: out[name]["meta_info"] for name in ("B0", "U0")}
    assert metas["B0"]["completion_tokens"] == batch_tokens, metas["B0"]
    assert metas["U0"]["completion_tokens"] == urgent_tokens, metas["U0"]

    # 1. SGLang finished U's request first, though B's was running when it came.
    sent = {name: meta["response_sent_to_client_ts"] for name, meta in metas.items()}
    assert sent["U0"] < sent["B0"], metas
    # 2. SGLang preempted B's request once (and U's never); the plugin saw it.
    assert metas["B0"]["num_retractions"] == 1, metas["B0"]
    assert metas["U0"]["num_retractions"] == 0, metas["U0"]
    m = server.wait_for_metrics(
        "B and U settled",
        lambda m: (
            tokens(m, "B", "decode") >= batch_tokens
            and requests_of(m, "B") == requests_of(m, "U") == (0, 0)
        ),
    )
    preemptions = ("vtc_tenant_preemptions_total", frozenset({("tenant", "B")}))
    assert m.get(preemptions) == 1, {k: v for k, v in m.items() if "preempt" in k[0]}
    assert m.get(("vtc_tenant_preemptions_total", frozenset({("tenant", "U")})), 0) == 0
    # 3. B paid its prompt once (SGLang computed it twice) and each token once.
    assert metas["B0"]["prompt_tokens"] == len(batch_prompt)
    assert metas["B0"]["cached_tokens"] == metas["U0"]["cached_tokens"] == 0, metas
    assert tokens(m, "B", "prompt") == len(batch_prompt), metas["B0"]
    assert tokens(m, "B", "decode") == batch_tokens
    assert tokens(m, "U", "prompt") == len(urgent_prompt)
    assert tokens(m, "U", "decode") == urgent_tokens


# -- retraction: SGLang's KV pool runs out while several requests decode ----------------


@pytest.fixture(scope="module")
def retraction_server(model_dir, tmp_path_factory) -> Iterator[Server]:
    """The plugin with a KV pool of 256 tokens and four running slots. SGLang admits a
    request reserving ``new_token_ratio`` of its remaining output, unless it ignores
    EOS (then all of it); with ``--schedule-conservativeness 0.05`` that ratio starts
    near 0, so several requests that do not ignore EOS are admitted together and the
    pool runs out while they decode: SGLang retracts one (back to its waiting queue,
    its KV freed) and recomputes it later. No radix cache, so a recomputed prompt is
    no cache hit: a second prompt charge would show on /metrics."""
    log = tmp_path_factory.mktemp("sglang-retraction") / "server.log"
    args = (
        "--max-running-requests",
        "4",
        "--max-total-tokens",
        "256",
        "--schedule-conservativeness",
        "0.05",
        "--disable-radix-cache",
        "--enable-metrics",
    )
    env = {"VTC_LOG_INTERVAL": "0", "VTC_METRICS_INTERVAL": "0"}
    s = Server(model_dir, log, plugin=True, env=env, args=args)
    yield from running(s)


def test_retraction_under_a_small_kv_pool_charges_nothing_twice(retraction_server):
    """Rounds of four requests of two tenants (16-token prompts, up to 150 new tokens,
    EOS not ignored) until SGLang has retracted one (``meta_info.num_retractions``).
    SGLang admits a request only if its prompt and *all* its output fit beside what
    runs, so two overlap when the second arrives before the first has decoded ~70
    tokens, and two that grow to 166 tokens each exhaust the pool. A starved client
    may send them late, so a round without a retraction is repeated, at most four
    times.
    Every tenant is then charged exactly the prompt tokens SGLang computed once and
    the tokens each request returned, and the plugin counted each retraction as a
    preemption of that tenant."""
    server = retraction_server
    metas: dict[str, dict] = {}
    tenant_of: dict[str, str] = {}
    for rnd in range(4):
        out: dict[str, Any] = {}
        names = {f"X{rnd}-{i}": f"X{rnd}{i % 2}" for i in range(4)}
        tenant_of.update(names)
        threads = [
            server.generate(
                tenant, 150, out, name, prompt=[40 + 8 * rnd + i] * 16, ignore_eos=False
            )
            for i, (name, tenant) in enumerate(names.items())
        ]
        for t in threads:
            t.join(DEADLINE)
        for name in sorted(out):
            assert isinstance(out[name], dict), f"{name}: {out[name]!r}\n{server.tail()}"
            metas[name] = out[name]["meta_info"]
        assert len(out) == 4, sorted(out)
        if sum(metas[n]["num_retractions"] for n in out) > 0:
            break
    retracted = {n: m["num_retractions"] for n, m in metas.items() if m["num_retractions"]}
    assert retracted, f"SGLang never retracted a request in 4 rounds:\n{server.tail()}"

    tenants = sorted(set(tenant_of.values()))

    def of(tenant: str) -> list[dict]:
        return [m for n, m in metas.items() if tenant_of[n] == tenant]

    def settled(m: dict) -> bool:
        return all(
            tokens(m, t, "decode") == sum(x["completion_tokens"] for x in of(t))
            and requests_of(m, t) == (0, 0)
            for t in tenants
        )

    m = server.wait_for_metrics("every tenant's tokens", settled)
    for t in tenants:
        assert tokens(m, t, "prompt") == sum(x["prompt_tokens"] - x["cached_tokens"] for x in of(t))
        assert all(x["cached_tokens"] == 0 for x in of(t))  # recomputed, not a hit
        preempted = m.get(("vtc_tenant_preemptions_total", frozenset({("tenant", t)})), 0.0)
        assert preempted == sum(x["num_retractions"] for x in of(t)), (t, retracted)
