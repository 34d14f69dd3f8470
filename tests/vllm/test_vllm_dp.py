"""vLLM data parallel on this CPU: ``vllm serve --data-parallel-size 2`` runs one
engine-core process per rank, each with its own ``vtc.vllm.VTCScheduler``, and
with ``VTC_REDIS_URL`` the ranks share counters through Redis as replicas of
their own (``VTC_REPLICA_ID``, plus ``-dp<k>`` on rank k > 0; issue 15, item 3).
For a dense model vLLM rewrites each rank's parallel config to one rank of one;
the ranks once synced under one id and overwrote each other's records.

Read from the engines' own records: the ranks' start-up lines in the server
log, the replicas and counters in Redis, and the per-tenant series on the API
server's ``/metrics`` (vLLM gives several engine processes one multiprocess
directory): the ranks' token counters add up to what the server reports.
"""

from __future__ import annotations

import concurrent.futures
import json
import re
import time
import urllib.request
from pathlib import Path

from test_vllm_e2e import settled_metrics, total, vllm_server

from vtc.distributed import RedisStore

REQUESTS_PER_TENANT = 6
PROMPT = list(range(3, 11))  # 8 tokens: no full KV block, so no prefix-cache hit
MAX_TOKENS = 32
DEADLINE = 600.0  # seconds, for a condition on the engines' records


def complete(url: str, model: Path, tenant: str) -> dict:
    body = {
        "model": str(model),
        "prompt": PROMPT,
        "max_tokens": MAX_TOKENS,
        "ignore_eos": True,
        "vllm_xargs": {"tenant": tenant},
    }
    req = urllib.request.Request(
        url + "/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=DEADLINE) as r:  # noqa: S310 (loopback)
        return json.load(r)["usage"]


def test_data_parallel_ranks_each_schedule_and_share_counters(tiny_llama, tmp_path, redis_server):
    env = {
        "VTC_REDIS_URL": redis_server.url,
        "VTC_REDIS_NAMESPACE": "dp-e2e",
        "VTC_REPLICA_ID": "replica",
        "VTC_SYNC_MS": "20",
    }
    log = tmp_path / "vllm.log"
    args = ("--data-parallel-size", "2")
    with vllm_server(tiny_llama, log, "vtc.vllm.VTCScheduler", None, args, env) as url:
        text = log.read_text(errors="replace")
        for rank, replica in ((0, "replica"), (1, "replica-dp1")):
            started = rf"EngineCore_DP{rank} .*VTC fair scheduling .*replica '{replica}'"
            assert re.search(started, text), f"rank {rank} did not start VTC as {replica}"

        tenants = ["A", "B"] * REQUESTS_PER_TENANT
        with concurrent.futures.ThreadPoolExecutor(len(tenants)) as pool:
            usages = list(pool.map(lambda t: complete(url, tiny_llama, t), tenants))
        assert all(u["completion_tokens"] == MAX_TOKENS for u in usages), usages
        assert all(u["prompt_tokens"] == len(PROMPT) for u in usages), usages
        # What each tenant was charged in all: wp = 1 per prompt token, wq = 2 per
        # generated one, weight 1.
        service = REQUESTS_PER_TENANT * (len(PROMPT) + 2 * MAX_TOKENS)

        store = RedisStore.from_url(redis_server.url, namespace="dp-e2e")
        end = time.monotonic() + DEADLINE
        while True:
            replicas, counters = store.replicas(), store.counters()
            ranks_seen = {r for r in ("replica", "replica-dp1") if r in replicas}
            if len(ranks_seen) == 2 and all(counters.get(t, 0.0) >= service for t in "AB"):
                break
            assert time.monotonic() < end, (replicas, counters, service)
            time.sleep(0.2)

        # The ranks' token counters add up across processes on /metrics.
        def decode(m: dict) -> dict[str, float]:
            return {
                t: total(m, "vtc_tenant_service_tokens_total", tenant=t, kind="decode")
                for t in "AB"
            }

        want = REQUESTS_PER_TENANT * MAX_TOKENS
        m = settled_metrics(url, lambda m: set(decode(m).values()) == {want}, DEADLINE)
        assert decode(m) == {t: want for t in "AB"}, decode(m)
        for t in "AB":
            prompt = total(m, "vtc_tenant_service_tokens_total", tenant=t, kind="prompt")
            assert prompt == REQUESTS_PER_TENANT * len(PROMPT)
