"""End to end: request priorities through a real ``vllm serve`` with VTC (issue 17).

``vllm serve --scheduling-policy priority --scheduler-cls vtc.vllm.VTCScheduler``
on the tiny Llama of ``test_vllm_e2e``. Two batch tenants queue BATCH_PROMPTS
prompts each at priority 1, far more than the MAX_NUM_SEQS batch slots; once the
engine has served both for a while, an urgent tenant sends URGENT_PROMPTS prompts
at priority 0 (the OpenAI API's ``priority`` field). Everything is read from
what the engine recorded: the per-tenant trace, written every step
(``VTC_TRACE_INTERVAL=0``), and the ``vtc_*`` series on ``/metrics``.

Strict bands: from the urgent tenant's arrival to the completion of its last
prompt, the batch band gets only what its requests already running at the
arrival still generate (at most MAX_NUM_SEQS x MAX_TOKENS), plus what batch
requests admitted into slots the urgent tenant no longer needs generate while
its last prompts finish (fewer than MAX_NUM_SEQS more requests). Plain VTC
would lift the urgent tenant to the floor and give it about a third of the
slots, and the batch band would generate about twice the urgent tenant's
tokens in that time (1,024 here, against the 448 allowed); FCFS would serve
the whole batch backlog first.

Weighted bands (``VTC_PRIORITY_WEIGHTS="0=1,1=3"``, the second case): the bands
share the machine 1:3 instead, so while the urgent tenant is served the batch
band keeps generating, about three times the urgent tenant's tokens.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from test_vllm_e2e import (
    MAX_NUM_SEQS,
    MAX_TOKENS,
    PROMPT_LEN,
    REQUEST_TIMEOUT,
    RUN_DEADLINE,
    STARTUP_TIMEOUT,
    _get,
    read_trace,
    settled_metrics,
    total,
    vllm_server,
)

BATCH = ("batch-a", "batch-b")
BATCH_PROMPTS = 40  # per batch tenant, in one HTTP request at priority 1
URGENT_PROMPTS = 8  # in one HTTP request at priority 0
BATCH_SERVED_FIRST = 2 * MAX_NUM_SEQS * MAX_TOKENS  # batch tokens before the urgent tenant


async def _complete(
    session: aiohttp.ClientSession, url: str, model: str, tenant: str, prompts: int, priority: int
) -> dict[str, Any]:
    rng = random.Random(f"{tenant}-{priority}")
    body = {
        "model": model,
        "prompt": [[rng.randrange(3, 500) for _ in range(PROMPT_LEN)] for _ in range(prompts)],
        "max_tokens": MAX_TOKENS,
        "ignore_eos": True,
        "priority": priority,
        "vllm_xargs": {"tenant": tenant},
    }
    async with session.post(url + "/v1/completions", json=body) as response:
        text = await response.text()
        assert response.status == 200, f"{tenant}: HTTP {response.status}: {text[:200]}"
        return json.loads(text)["usage"]


async def _wait_for(predicate: Any, deadline: float, what: str) -> None:
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"workload stuck waiting for {what}")
        await asyncio.sleep(0.05)


async def _workload(url: str, model: str, trace: Path) -> dict[str, Any]:
    deadline = time.monotonic() + RUN_DEADLINE
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT)
    connector = aiohttp.TCPConnector(limit=0, force_close=True)

    def last() -> dict[str, Any]:
        records = read_trace(trace)
        return records[-1] if records else {"tokens": {}, "queued": {}}

    def batch_backlogged_and_served() -> bool:
        record = last()
        served = sum(record["tokens"].get(t, 0) for t in BATCH)
        backlogged = all(record["queued"].get(t, 0) > MAX_NUM_SEQS for t in BATCH)
        return backlogged and served >= BATCH_SERVED_FIRST

    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        batch = [
            asyncio.create_task(_complete(session, url, model, t, BATCH_PROMPTS, 1)) for t in BATCH
        ]
        await _wait_for(batch_backlogged_and_served, deadline, "the batch band")
        usage = await _complete(session, url, model, "urgent", URGENT_PROMPTS, 0)
        for task in batch:  # still queued: the client goes away, vLLM aborts them
            task.cancel()
        await asyncio.gather(*batch, return_exceptions=True)
    return usage


@pytest.mark.timeout(STARTUP_TIMEOUT + RUN_DEADLINE + 180)
@pytest.mark.parametrize("bands", ["strict", "weighted"])
def test_an_urgent_tenant_overtakes_a_backlogged_batch_band(
    tiny_llama: Path, tmp_path: Path, bands: str
) -> None:
    log, trace = tmp_path / "priority.log", tmp_path / "priority.trace"
    args = ("--scheduling-policy", "priority")
    env = {"VTC_TRACE_INTERVAL": "0"}
    if bands == "weighted":
        env["VTC_PRIORITY_WEIGHTS"] = "0=1,1=3"
    with vllm_server(tiny_llama, log, "vtc.vllm.VTCScheduler", trace, args, env) as url:
        model = json.loads(_get(url + "/v1/models"))["data"][0]["id"]
        usage = asyncio.run(_workload(url, model, trace))
        urgent_tokens = URGENT_PROMPTS * MAX_TOKENS
        metrics = settled_metrics(
            url,
            lambda m: (
                total(m, "vtc_tenant_service_tokens_total", tenant="urgent", kind="decode")
                >= urgent_tokens
                and total(m, "vtc_tenant_requests") == 0
            ),
        )
    assert usage["completion_tokens"] == urgent_tokens
    records = read_trace(trace)
    arrived = next(i for i, r in enumerate(records) if r["queued"].get("urgent", 0) > 0)
    done = next(i for i, r in enumerate(records) if r["tokens"].get("urgent", 0) >= urgent_tokens)
    before, after = records[arrived - 1], records[done]
    # The urgent tenant met a batch band with requests waiting for every slot ...
    assert all(before["queued"].get(t, 0) > MAX_NUM_SEQS for t in BATCH), before
    # ... still waiting when its last prompt finished ...
    assert all(after["queued"].get(t, 0) > MAX_NUM_SEQS for t in BATCH), after
    batch_tokens = sum(after["tokens"].get(t, 0) - before["tokens"].get(t, 0) for t in BATCH)
    if bands == "strict":
        # ... it overtook them: the band got only what finished around it
        assert batch_tokens <= (2 * MAX_NUM_SEQS - 1) * MAX_TOKENS, (batch_tokens, before, after)
    else:
        # ... the bands shared the slots 1:3: the batch band kept the larger part
        assert batch_tokens >= 1.5 * urgent_tokens, (batch_tokens, before, after)
    # The engine's /metrics say what the core charged the urgent tenant.
    charged = total(metrics, "vtc_tenant_service_tokens_total", tenant="urgent", kind="decode")
    assert charged == urgent_tokens
    prompt = total(metrics, "vtc_tenant_service_tokens_total", tenant="urgent", kind="prompt")
    assert prompt == URGENT_PROMPTS * PROMPT_LEN
    text = log.read_text(errors="replace")
    if bands == "strict":
        assert "request priorities are strict bands" in text
    else:
        assert "request priorities are weighted bands (0=1, 1=3; others 1)" in text
