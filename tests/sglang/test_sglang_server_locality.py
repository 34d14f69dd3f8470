"""VTC_LOCALITY_QUANTUM on a real SGLang server (issue 19, item 3): the window fed
by SGLang's radix cache computes fewer prefill tokens on a prefix-heavy workload
than plain VTC, and the two tenants stay within the window's bound.

The same workload runs on two servers with the plugin, Q = 0 (plain VTC) and
Q = 400: one running slot and a KV pool of 400 tokens, too small to keep both
tenants' 200-token prefixes and a request, so serving the other tenant evicts
a tenant's prefix. Everything measured is the server's own record: each response's
``meta_info`` (``prompt_tokens``, ``cached_tokens``, ``completion_tokens``, the
completion stamp ``response_sent_to_client_ts``, which orders admissions with one
slot) and the server log's start-up line.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from test_sglang_server import DEADLINE, Server, running
from tiny_model import make_tiny_llama

WP, WQ = 1.0, 2.0
#: token ids below the tiny model's vocabulary (512)
PREFIX = {"A": [10 + i for i in range(200)], "B": [250 + i for i in range(200)]}
NEW_TOKENS = 4
Q = 400.0


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A tiny random Llama (tests/sglang/tiny_model.py)."""
    return make_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


#: fresh servers tried when the blocker finished before every request was queued
ATTEMPTS = 3


def _serve(model_dir, tmp_path, q: float) -> tuple[dict[str, dict], list[str], str]:
    """Four requests each of A and B (A0 B0 A1 B1 ...), queued in that order behind a
    blocker; their meta_info, the order they were served, and the server log.

    The blocker can be at most ~390 tokens (the KV pool is 400), which a fast machine
    generates in about the time eight submissions take: when it finishes before all
    eight are queued, the run does not measure the window, and it is run again on a
    fresh server (its radix cache and counters as new)."""
    for attempt in range(1, ATTEMPTS + 1):
        served = _serve_once(model_dir, tmp_path / f"server-q{q:g}-{attempt}.log", q)
        if served is not None:
            return served
    pytest.fail(f"the blocker finished before the requests were queued, {ATTEMPTS} times")


def _serve_once(model_dir, log: Path, q: float) -> tuple[dict[str, dict], list[str], str] | None:
    """:func:`_serve` on one server; None if the blocker finished too soon."""
    args = ("--max-running-requests", "1", "--max-total-tokens", "400")
    env = {"VTC_LOG_INTERVAL": "0", "VTC_LOCALITY_QUANTUM": f"{q:g}"}
    plan = [(f"{t}{i}", t) for i in range(4) for t in "AB"]
    out: dict[str, Any] = {}
    threads = []
    with contextmanager(running)(Server(model_dir, log, plugin=True, env=env, args=args)) as s:
        threads.append(s.generate("blocker", 380, out, "blocker", prompt=[7] * 8))
        load = s.wait_for(
            "the blocker running (or finished)",
            lambda load: load["num_running_reqs"] == 1 or "blocker" in out,
        )
        behind = load["num_running_reqs"] == 1  # every request so far queued behind it
        for n, (name, tenant) in enumerate(plan, 1):
            if not behind:  # the blocker finished first: this run measures nothing
                break
            prompt = PREFIX[tenant] + [450 + n] + [470 + i for i in range(7)]
            threads.append(s.generate(tenant, NEW_TOKENS, out, name, prompt=prompt))
            load = s.poll(
                f"{n} queued (or the blocker finished)",
                s.load,
                lambda load, n=n: load["num_waiting_reqs"] >= n or "blocker" in out,
                every=0.01,
            )
            behind = load["num_waiting_reqs"] >= n
        if behind:
            for t in threads:
                t.join(DEADLINE)
            for name in ["blocker", *(p[0] for p in plan)]:
                assert isinstance(out.get(name), dict), f"{name}: {out.get(name)!r}\n{s.tail()}"
            text = log.read_text(errors="replace")
            metas = {name: out[name]["meta_info"] for name, _ in plan}
            order = sorted(metas, key=lambda n: metas[n]["response_sent_to_client_ts"])
            return metas, order, text
    for t in threads:  # the server stopped: their connections closed
        t.join(DEADLINE)
    return None


def computed(metas: dict[str, dict]) -> int:
    """Prompt tokens the server computed (not served from its radix cache)."""
    return sum(m["prompt_tokens"] - m["cached_tokens"] for m in metas.values())


def max_gap(metas: dict[str, dict], order: list[str]) -> tuple[float, float]:
    """Replay the counters from the server's records, admission by admission (one
    slot: the serving order): the largest |c_A - c_B| while both tenants had
    requests waiting, and the dearest request's cost C."""
    c = {"A": 0.0, "B": 0.0}
    cost = {
        n: WP * (m["prompt_tokens"] - m["cached_tokens"]) + WQ * m["completion_tokens"]
        for n, m in metas.items()
    }
    gap = 0.0
    for k, name in enumerate(order):
        c[name[0]] += cost[name]
        rest = {n[0] for n in order[k + 1 :]}
        if rest == {"A", "B"}:
            gap = max(gap, abs(c["A"] - c["B"]))
    return gap, max(cost.values())


def test_the_window_computes_fewer_prefill_tokens_within_its_bound(model_dir, tmp_path):
    plain, plain_order, plain_log = _serve(model_dir, tmp_path, 0.0)
    local, local_order, local_log = _serve(model_dir, tmp_path, Q)
    for metas in (plain, local):
        for m in metas.values():
            assert m["prompt_tokens"] == 208 and m["completion_tokens"] == NEW_TOKENS
    assert "locality window" not in plain_log
    assert f"locality window Q={Q:g} weighted tokens over SGLang's radix cache" in local_log
    # plain VTC alternates the tenants, and each evicts the other's prefix
    assert computed(local) < computed(plain), (plain_order, local_order, plain, local)
    hits = sum(m["cached_tokens"] >= 200 for m in local.values())
    assert hits >= 4, (local_order, local)
    gap, cost = max_gap(local, local_order)
    assert gap <= Q + cost, (gap, local_order)
    plain_gap, plain_cost = max_gap(plain, plain_order)
    assert plain_gap <= plain_cost, (plain_gap, plain_order)
    print(
        f"\nprefill tokens computed: plain VTC {computed(plain)} ({plain_order}), "
        f"Q={Q:g} {computed(local)} ({local_order}); max gap {plain_gap:g} vs {gap:g}"
    )
