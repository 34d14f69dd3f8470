"""VTC_LOCALITY_QUANTUM on a real vLLM server (issue 19, item 3): the window fed by
vLLM's prefix cache computes fewer prefill tokens on a prefix-heavy workload than
plain VTC, and the two tenants stay within the window's bound.

The same workload runs on two servers with ``vtc.vllm.VTCScheduler``, Q = 0 (plain
VTC) and Q = 400: prefix caching on, one running request (``--max-num-seqs 1``) and
a KV cache of BLOCKS blocks of 32 tokens, too small to keep both tenants' 200-token
prefixes and a request, so serving the other tenant evicts a tenant's prefix.
Behind a blocker, four requests each of A and B wait, each its tenant's prefix and
8 tokens of its own. Everything measured is the server's own record: each
response's ``usage`` (``prompt_tokens_details.cached_tokens`` with
``--enable-prompt-tokens-details``: the tokens vLLM served from its cache) and
the scheduler's log line, written at every step (``VTC_LOG_INTERVAL``), which
gives each tenant's counter and its waiting and running requests.
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from test_vllm_e2e import STARTUP_TIMEOUT, scrape, total, vllm_server

WP, WQ = 1.0, 2.0
#: token ids below the tiny model's vocabulary (512)
PREFIX = {"A": [10 + i for i in range(200)], "B": [250 + i for i in range(200)]}
NEW_TOKENS = 4
BLOCKS = 12  # of 32 tokens (one is vLLM's null block): a request takes 7
BLOCKER_TOKENS = 300
Q = 400.0
DEADLINE = 600.0  # seconds, for any one condition or request
LINE = re.compile(r"VTC tenant counter \(service\) waiting/running: (.*)$", re.M)
ENTRY = re.compile(r"(\w+)=(-?\d+) \((\d+)\) (\d+)/(\d+)")


def _post(url: str, body: dict[str, Any], out: dict[str, Any], name: str) -> None:
    request = urllib.request.Request(
        url + "/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=DEADLINE) as response:  # noqa: S310
            out[name] = json.loads(response.read())
    except Exception as e:  # noqa: BLE001 (reported by the test)
        out[name] = repr(e)


def _wait_for(url: str, what: str, predicate: Any) -> None:
    """Scrape /metrics until ``predicate(samples)``, within DEADLINE."""
    end = time.monotonic() + DEADLINE
    while not predicate(scrape(url)):
        if time.monotonic() > end:
            raise AssertionError(f"vLLM never reached: {what}")
        time.sleep(0.05)


def _serve(model: Path, tmp_path: Path, q: float) -> tuple[dict[str, dict], str]:
    """Four requests each of A and B, queued behind a blocker; each one's usage, and
    the server log."""
    log = tmp_path / f"server-q{q:g}.log"
    args = (
        "--enable-prefix-caching",
        "--enable-prompt-tokens-details",
        "--block-size",
        "32",
        "--num-gpu-blocks-override",
        str(BLOCKS),
        "--max-num-seqs",
        "1",
        "--max-model-len",
        "320",
    )
    env = {"VTC_LOG_INTERVAL": "1e-9", "VTC_LOCALITY_QUANTUM": f"{q:g}"}
    plan = [(f"{t}{i}", t) for i in range(4) for t in "AB"]
    out: dict[str, Any] = {}
    with vllm_server(model, log, "vtc.vllm.VTCScheduler", None, args, env) as url:
        served = json.loads(urllib.request.urlopen(url + "/v1/models").read())["data"][0]["id"]

        def send(name: str, tenant: str, prompt: list[int], tokens: int) -> threading.Thread:
            body = {
                "model": served,
                "prompt": prompt,
                "max_tokens": tokens,
                "ignore_eos": True,
                "vllm_xargs": {"tenant": tenant},
            }
            thread = threading.Thread(target=_post, args=(url, body, out, name), daemon=True)
            thread.start()
            return thread

        threads = [send("blocker", "blocker", [7] * 8, BLOCKER_TOKENS)]
        _wait_for(url, "the blocker running", lambda m: total(m, "vllm:num_requests_running") == 1)
        for n, (name, tenant) in enumerate(plan, 1):
            prompt = PREFIX[tenant] + [450 + n] + [470 + i for i in range(7)]
            threads.append(send(name, tenant, prompt, NEW_TOKENS))
        _wait_for(url, "8 queued", lambda m: total(m, "vllm:num_requests_waiting") >= len(plan))
        for thread in threads:
            thread.join(DEADLINE)
        for name in ["blocker", *(p[0] for p in plan)]:
            assert isinstance(out.get(name), dict), f"{name}: {out.get(name)!r}; see {log}"
    text = log.read_text(errors="replace")
    return {name: out[name]["usage"] for name, _ in plan}, text


def computed(usage: dict[str, dict]) -> int:
    """Prompt tokens the server computed (not served from its prefix cache)."""
    return sum(u["prompt_tokens"] - cached(u) for u in usage.values())


def cached(u: dict[str, Any]) -> int:
    return (u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0


def steps(log: str) -> list[dict[str, tuple[int, int, int]]]:
    """The scheduler's per-step log lines: tenant -> (counter, waiting, running)."""
    return [
        {m[0]: (int(m[1]), int(m[3]), int(m[4])) for m in ENTRY.findall(line)}
        for line in LINE.findall(log)
    ]


def order_and_gap(log: str) -> tuple[list[str], float, bool]:
    """From the scheduler's log: the tenants in the order they were admitted (one
    slot: a tenant's waiting count drops by one), the largest |c_A - c_B| while both
    had requests waiting, and whether all eight requests waited together behind the
    blocker."""
    order: list[str] = []
    gap = 0.0
    together = False
    last: dict[str, tuple[int, int, int]] = {}
    for line in steps(log):
        for tenant in "AB":
            if tenant in line and tenant in last and line[tenant][1] < last[tenant][1]:
                order += [tenant] * (last[tenant][1] - line[tenant][1])
        if all(line.get(t, (0, 0, 0))[1] >= 1 for t in "AB"):
            gap = max(gap, abs(line["A"][0] - line["B"][0]))
            together |= line["A"][1] == line["B"][1] == 4
        last = line
    return order, gap, together


@pytest.mark.timeout(2 * (STARTUP_TIMEOUT + 4 * DEADLINE))
def test_the_window_computes_fewer_prefill_tokens_within_its_bound(tiny_llama, tmp_path, capsys):
    plain, plain_log = _serve(tiny_llama, tmp_path, 0.0)
    local, local_log = _serve(tiny_llama, tmp_path, Q)
    for usage in (plain, local):
        for u in usage.values():
            assert u["prompt_tokens"] == 208 and u["completion_tokens"] == NEW_TOKENS, usage
    assert "locality window" not in plain_log
    assert f"locality window Q={Q:g} weighted tokens over vLLM's prefix cache" in local_log
    cost = WP * 208 + WQ * NEW_TOKENS  # the dearest request: nothing cached
    plain_order, plain_gap, plain_together = order_and_gap(plain_log)
    local_order, gap, together = order_and_gap(local_log)
    assert plain_together and together, "the eight requests did not all wait behind the blocker"
    assert len(plain_order) == len(local_order) == 8, (plain_order, local_order)
    with capsys.disabled():
        print(
            f"\nvLLM prefill tokens computed: plain VTC {computed(plain)} "
            f"({''.join(plain_order)}), Q={Q:g} {computed(local)} ({''.join(local_order)}); "
            f"max |c_A - c_B| while both wait {plain_gap:g} vs {gap:g} (C = {cost:g})"
        )
    # plain VTC alternates the tenants, and each evicts (most of) the other's prefix
    assert computed(local) < computed(plain), (plain_order, local_order, plain, local)
    hits = sum(cached(u) >= 192 for u in local.values())  # the prefix's 6 full blocks
    assert hits >= 4, (local_order, local)
    assert gap <= Q + cost, (gap, local_order)
    assert plain_gap <= cost, (plain_gap, plain_order)
