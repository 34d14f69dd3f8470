"""Tests of the simulation harness: workloads, engine, metrics, CLI and the note's shapes."""

from __future__ import annotations

import dataclasses
import io
import itertools
import json
import math
import statistics
import sys

import numpy as np
import pytest

from vtc.reference import Scheduler as ReferenceScheduler
from vtc.sim import Options, RpmGate, metrics, reference_scheduler, simulate, workloads
from vtc.sim import experiments as X
from vtc.sim.__main__ import main
from vtc.sim.progress import Progress
from vtc.sim.report import Table, plot
from vtc.sim.workloads import ClientSpec, Request

M = 8192


def opts(**kw) -> Options:
    return Options(progress=False, **kw)


def rows_by(table: Table, key: str) -> dict:
    return {row[key]: row for row in table.rows}


# -- workloads -----------------------------------------------------------------


def test_workloads_are_deterministic_per_seed():
    a = workloads.overloaded([2.0, 1.0], 3000, M, seed=7)
    b = workloads.overloaded([2.0, 1.0], 3000, M, seed=7)
    c = workloads.overloaded([2.0, 1.0], 3000, M, seed=8)
    assert a == b
    assert a != c
    assert [r.arrival for r in a] == sorted(r.arrival for r in a)
    # adding a client leaves the others' requests unchanged
    d = workloads.overloaded([2.0, 1.0, 0.5], 3000, M, seed=7)
    assert [r for r in d if r.client != 2] == a


def test_poisson_rate_and_lengths():
    rate = 0.05
    reqs = workloads.generate([ClientSpec("a", rate)], 100_000, seed=1)
    assert abs(len(reqs) / 100_000 - rate) < 0.05 * rate
    assert all(64 <= r.prompt_len <= 512 and 32 <= r.output_len <= 384 for r in reqs)
    assert {r.client for r in reqs} == {"a"}


def _gap_cv(reqs: list[Request]) -> float:
    gaps = np.diff([r.arrival for r in reqs])
    return float(np.std(gaps) / np.mean(gaps))


def test_gamma_arrivals_are_burstier_than_poisson():
    poisson = workloads.generate([ClientSpec(0, 0.02)], 200_000, seed=2)
    gamma = workloads.generate([ClientSpec(0, 0.02, arrival="gamma", cv=4.0)], 200_000, seed=2)
    assert 0.9 < _gap_cv(poisson) < 1.1
    assert _gap_cv(gamma) > 3.0
    assert abs(len(gamma) / len(poisson) - 1) < 0.25


def test_ramp_rate_grows_linearly():
    steps = 40_000
    reqs = [r for r in workloads.ramp(steps, M, seed=3) if r.client == 1]
    quarters = np.bincount([4 * r.arrival // steps for r in reqs], minlength=4)
    # a linear ramp from 0 puts 1/16, 3/16, 5/16, 7/16 of the arrivals in the quarters
    assert list(quarters) == sorted(quarters)
    assert 4 < quarters[3] / quarters[0] < 12
    steady = [r for r in workloads.ramp(steps, M, seed=3) if r.client == 0]
    assert abs(len(steady) / steps - workloads.service_rate(M)) < 0.1 * workloads.service_rate(M)


def test_phases_shift_the_load():
    steps = 30_000
    reqs = workloads.phases([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], steps, M, seed=4)
    phase = {(r.client, r.arrival * 3 // steps) for r in reqs}
    assert (0, 0) in phase and (1, 0) not in phase
    assert (1, 1) in phase and (0, 1) not in phase
    assert {(0, 2), (1, 2)} <= phase


def test_length_mix_and_returning_shapes():
    mix = workloads.length_mix([(512, 32), (32, 512)], 1.0, 5000, M, seed=5)
    assert {(r.client, r.prompt_len, r.output_len) for r in mix} == {(0, 512, 32), (1, 32, 512)}
    reqs = workloads.returning(6600, M, return_step=6000, quiet=2000, seed=5)
    c0 = [r.arrival for r in reqs if r.client == 0]
    assert not [t for t in c0 if 4000 <= t < 6000]
    before, after = sum(t < 4000 for t in c0), sum(t >= 6000 for t in c0)
    assert after / 600 > 3 * before / 4000  # overloaded after the return, under share before
    with pytest.raises(ValueError):
        workloads.returning(2000, M, return_step=1500, quiet=2000)


def test_incumbent_fills_the_first_batch():
    reqs = workloads.incumbent(3000, 4096, seed=6)
    first = [r for r in reqs if r.arrival == 0]
    assert {r.client for r in first} == {0}
    assert sum(r.prompt_len for r in first) >= 4096
    assert min(r.arrival for r in reqs if r.client == 1) >= 1


def test_load_trace_replays_the_real_trace():
    path = workloads.find_trace()
    reqs = workloads.load_trace(path, 18.0)
    assert len(reqs) == 1500
    assert len({r.client for r in reqs}) == 27
    assert [r.arrival for r in reqs] == sorted(r.arrival for r in reqs)
    assert reqs[-1].arrival == 600 * 18
    slow = workloads.load_trace(path, 1.0)
    assert slow[-1].arrival == 600


def test_load_trace_from_csv(tmp_path, monkeypatch):
    p = tmp_path / "t.csv"
    p.write_text("arrival_s,client,prompt_len,output_len\n0.5,x,10,5\n0.25,y,20,7\n2.0,x,30,1\n")
    reqs = workloads.load_trace(p, 4.0)
    assert reqs == [Request(1, "y", 20, 7), Request(2, "x", 10, 5), Request(8, "x", 30, 1)]
    monkeypatch.setenv(workloads.TRACE_ENV, str(p))
    assert workloads.find_trace() == p
    bad = tmp_path / "bad.csv"
    bad.write_text("arrival_s,client,prompt_len\n0,x,1\n")
    with pytest.raises(ValueError, match="output_len"):
        workloads.load_trace(bad, 1.0)


# -- engine --------------------------------------------------------------------


def test_engine_timeline_of_a_single_request():
    reqs = [Request(2, "a", 10, 3), Request(2, "b", 90, 50)]
    res = simulate(reqs, 20, M=100, policy="vtc")
    # a: admitted at step 2, decodes at steps 2, 3, 4, finishes at 4.  b is admitted at
    # step 2 too (100 <= M) but preempted by that step's decode, readmitted once a
    # has left (step 5) and, its output capped at M - prompt = 10, finishes at 14.
    assert res.first_admit == [2, 2] and res.finish == [4, 14]
    assert res.preemptions == 1
    assert res.output_len == [3, 10]
    assert list(metrics.ttft(res, ["a"])) == [1.0]
    assert metrics.service(res, "a")[-1] == 10 + 2 * 3
    assert metrics.service(res, "b")[-1] == 90 + 2 * 10  # prefill charged once
    assert list(metrics.backlogged(res, "b")[:6]) == [0, 0, 0, 1, 1, 0]
    with pytest.raises(ValueError):
        simulate([Request(0, "a", 100, 5)], 5, M=100)


class CheckedScheduler(ReferenceScheduler):
    """The reference scheduler, asserting the harness finishes requests at their output length."""

    outputs: dict[int, int] = {}

    def finish(self, request_id):
        assert self._requests[request_id].generated == self.outputs[request_id]
        super().finish(request_id)


def test_engine_finishes_at_output_length_despite_preemption():
    reqs = workloads.overloaded([1.5, 1.5], 4000, 2048, seed=9)
    CheckedScheduler.outputs = {
        i: min(r.output_len, 2048 - r.prompt_len) for i, r in enumerate(reqs)
    }
    res = simulate(reqs, 4000, M=2048, policy="vtc", factory=CheckedScheduler)
    assert res.preemptions > 10
    assert sum(f >= 0 for f in res.finish) > 50


def test_rust_core_and_reference_agree_through_the_harness():
    reqs = workloads.returning(3000, 2048, return_step=2400, quiet=800, seed=10)
    for policy, rpm in (("vtc", None), ("lcf", None), ("fcfs", 30)):
        kw = dict(M=2048, policy=policy, rpm=rpm, minute=500, weights={0: 2.0})
        a = simulate(reqs, 3000, **kw)
        b = simulate(reqs, 3000, factory=reference_scheduler, **kw)
        assert a.first_admit == b.first_admit and a.finish == b.finish
        for c in a.clients:
            assert np.array_equal(metrics.service(a, c), metrics.service(b, c))


def test_work_accounting_matches_the_core():
    reqs = workloads.overloaded([1.0, 1.0, 1.0], 3000, 4096, seed=11)
    res = simulate(reqs, 3000, M=4096, policy="vtc", weights={1: 3.0})
    delivered = sum(metrics.tokens(res, c)[-1] for c in res.clients)
    assert math.isclose(delivered, res.work[-1], rel_tol=1e-9)
    assert math.isclose(metrics.throughput(res), res.work[-1] / 3000)


def test_rpm_gate_is_a_sliding_window_that_never_drops():
    gate = RpmGate(rpm=3, minute=10)
    for rid in range(20):
        gate.offer(rid, "a" if rid % 4 else "b")
    released: dict[str, list[int]] = {"a": [], "b": []}
    order = []
    for t in range(100):
        for rid in gate.release(t):
            released["a" if rid % 4 else "b"].append(t)
            order.append(rid)
    assert sorted(order) == list(range(20))
    for times in released.values():
        for t in range(100):
            assert sum(t - 10 < s <= t for s in times) <= 3
    assert released["b"] == [0, 0, 0, 10, 10]
    with pytest.raises(ValueError):
        RpmGate(0, 10)


def test_rpm_gate_in_the_engine_limits_admissions():
    reqs = workloads.overloaded([2.0, 1.0], 6000, M, seed=12)
    res = simulate(reqs, 6000, M=M, policy="fcfs", rpm=10, minute=2000)
    for c in (0, 1):
        admitted = [a for r, a in zip(reqs, res.first_admit) if r.client == c and a >= 0]
        assert len(admitted) == 30  # 10 per minute, three minutes, backlog never runs dry


# -- metrics -------------------------------------------------------------------


def _brute_drift(res, f, g) -> float:
    wf, wg = metrics.service(res, f), metrics.service(res, g)
    both = metrics.backlogged(res, f) & metrics.backlogged(res, g)
    worst, start = 0.0, None
    for t in range(res.steps):
        if not both[t]:
            start = None
            continue
        if start is None:
            start = t
        worst = max(worst, abs((wf[t + 1] - wf[start]) - (wg[t + 1] - wg[start])))
    return worst


def test_max_drift_matches_brute_force():
    reqs = workloads.phases([[1.0, 0.3, 0.0], [0.3, 1.0, 1.0]], 4000, 2048, seed=13)
    res = simulate(reqs, 4000, M=2048, policy="fcfs")
    for f, g in itertools.combinations(res.clients, 2):
        assert math.isclose(metrics.max_drift(res, f, g), _brute_drift(res, f, g))
    assert metrics.max_pair_drift(res) == max(
        _brute_drift(res, f, g) for f, g in itertools.combinations(res.clients, 2)
    )
    assert metrics.max_drift(res, 0, 1, end=2000) <= metrics.max_drift(res, 0, 1)


def test_service_difference_matches_its_definition():
    reqs = workloads.overloaded([0.2, 0.6, 1.2], 3000, 2048, seed=14)
    res = simulate(reqs, 3000, M=2048, policy="vtc")
    diff = metrics.service_difference(res, window=300, ticks=10)
    assert len(diff) == 10 and np.all(diff >= 0)
    lo, hi = 1200 - 150, 1200 + 150  # the window around tick 4
    y = {c: (metrics.service(res, c)[hi] - metrics.service(res, c)[lo]) / 300 for c in res.clients}
    r = {
        c: sum(
            res.wp * q.prompt_len + res.wq * out
            for q, out in zip(reqs, res.output_len)
            if q.client == c and lo <= q.arrival < hi
        )
        / 300
        for c in res.clients
    }
    top = max(y.values())
    expected = sum(min(top - y[c], abs(r[c] - y[c])) for c in res.clients)
    assert math.isclose(diff[4], expected)


def test_shares_latency_and_bound():
    reqs = workloads.overloaded([1.0, 1.0], 4000, M, seed=15)
    res = simulate(reqs, 4000, M=M, policy="vtc", weights={0: 1.0, 1: 3.0})
    share = metrics.shares(res)
    assert math.isclose(sum(share.values()), 1.0)
    assert 0.7 < share[1] < 0.8
    lat = metrics.ttft(res)
    assert len(lat) == sum(a >= 0 for a in res.first_admit) and lat.min() >= 1
    assert metrics.percentile(lat, 50) <= metrics.percentile(lat, 99)
    assert math.isnan(metrics.percentile(np.array([]), 50))
    assert metrics.bound_u(1.0, 2.0, 8192, 512) == 16384
    assert metrics.bound_u(1.0, 0.001, 8192, 512) == 512


# -- the shapes of docs/simulation.md's tables -----------------------------------


def test_drift_vtc_bounded_fcfs_unbounded():
    table = X.drift(opts(steps=12000)).tables[0]
    rows = rows_by(table, "scheduler")
    two_u = rows["vtc"]["max_drift"] / rows["vtc"]["drift_over_2U"]
    assert rows["vtc"]["max_drift"] <= two_u and rows["lcf"]["max_drift"] <= two_u
    fcfs = rows["fcfs"]
    assert fcfs["max_drift"] > 2 * two_u
    assert fcfs["max_drift"] > 20 * rows["vtc"]["max_drift"]
    assert fcfs["max_drift"] > 1.6 * fcfs["half_run_drift"]  # still growing
    assert rows["vtc"]["max_drift"] < 1.5 * max(rows["vtc"]["half_run_drift"], 1.0) + 2000
    tputs = [r["throughput"] for r in table.rows]
    assert max(tputs) < 1.05 * min(tputs)  # same work, different order


def test_returning_client_near_half_under_vtc_and_monopolizes_without_lift():
    rows = rows_by(X.returning(opts()).tables[0], "scheduler")
    assert 0.4 < rows["vtc"]["returning_share"] < 0.6
    assert rows["lcf"]["returning_share"] > 0.7
    assert rows["lcf"]["returning_share"] > rows["vtc"]["returning_share"] + 0.2
    assert rows["fcfs"]["returning_share"] < 0.1
    assert rows["vtc"]["steady_service"] > 1.5 * rows["lcf"]["steady_service"]


def test_drift_tracks_kv_budget_within_bound():
    sizes = (2048, 8192, 32768)
    table = X.kv_sweep(opts(steps=4000), sizes=sizes).tables[0]
    for row in table.rows:
        assert row["max_drift"] <= row["two_wq_M"]
        assert row["drift_over_2U"] <= 1.0
    inc = [r["max_drift"] for r in table.rows if r["workload"] == "incumbent"]
    assert inc == sorted(inc) and inc[-1] > 8 * inc[0]
    assert all(r["drift_over_2U"] > 0.1 for r in table.rows if r["workload"] == "incumbent")


def test_rpm_cannot_win_on_both_axes():
    table = X.rpm_sweep(opts(steps=10000), limits=(5, 20, 40, 80, None)).tables[0]
    vtc = rows_by(table, "scheduler")["vtc"]
    limited = [r for r in table.rows if r["scheduler"] == "fcfs+rpm"]
    for row in limited:
        assert not (
            row["max_drift"] <= vtc["max_drift"] and row["throughput"] > 0.9 * vtc["throughput"]
        )
        if row["max_drift"] <= 2 * vtc["max_drift"]:
            assert row["throughput"] < 0.5 * vtc["throughput"]
    tputs = [r["throughput"] for r in limited]
    assert tputs == sorted(tputs) and tputs[0] < 0.1 * vtc["throughput"]
    unlimited = rows_by(table, "rpm")["unlimited"]
    assert unlimited["max_drift"] > 20 * vtc["max_drift"]


def test_weighted_shares_follow_weights():
    table = X.weighted(opts(steps=8000)).tables[0]
    shares = [r["share"] for r in table.rows]
    assert shares == sorted(shares)
    for row in table.rows:
        assert abs(row["share"] - row["expected_share"]) < 0.02
    assert statistics.mean(r["ttft_p50"] for r in table.rows[:2]) > table.rows[-1]["ttft_p50"]


def test_priority_bands_serve_the_urgent_band_first_and_the_batch_band_fairly():
    rows = rows_by(X.priority(opts(steps=6000)).tables[0], "scheduler")
    bands, stock, plain = rows["vtc + bands"], rows["stock priority"], rows["vtc"]
    # urgent first: its latency is stock priority's, not plain VTC's
    assert bands["urgent_ttft_p50"] < plain["urgent_ttft_p50"] / 10
    assert bands["urgent_ttft_p99"] <= 2 * stock["urgent_ttft_p99"]
    assert bands["urgent_share"] > plain["urgent_share"] + 0.1  # not held to a third
    # fair inside the batch band: stock priority serves it by arrival
    assert abs(bands["batch_a_share_of_band"] - 0.5) < 0.05
    assert stock["batch_a_share_of_band"] > 0.65
    assert bands["drift_over_2U"] <= 1.0 < stock["drift_over_2U"]
    assert abs(bands["throughput"] - stock["throughput"]) / stock["throughput"] < 0.02
    # weighted bands: the urgent band held to its weight's share (it asks for about
    # half the machine), both bands within the bound, the batch band still fair
    w13, w11 = rows["vtc + bands 1:3"], rows["vtc + bands 1:1"]
    assert abs(w13["urgent_share"] - 0.25) < 0.02
    assert 0.45 < w11["urgent_share"] < 0.53
    for row in (w13, w11):
        assert row["band_drift_over_bound"] <= 1.0
        assert abs(row["batch_a_share_of_band"] - 0.5) < 0.05
    assert plain["band_drift_over_bound"] > 1.0  # plain VTC does not share by band


def test_trace_vtc_is_fairer_at_the_same_throughput():
    report = X.trace(opts())
    rows = rows_by(report.tables[0], "scheduler")
    for other in ("fcfs", "lcf", "rpm20"):
        assert rows["vtc"]["avg_diff"] < 0.8 * rows[other]["avg_diff"]
        assert rows["vtc"]["diff_var"] < rows[other]["diff_var"]
    assert rows["vtc"]["throughput"] >= 0.98 * rows["fcfs"]["throughput"]
    assert rows["rpm5"]["throughput"] < 0.7 * rows["vtc"]["throughput"]
    lat = rows_by(report.tables[1], "scheduler")
    assert lat["vtc"]["light_ttft_p99"] < 0.5 * lat["fcfs"]["light_ttft_p99"]


def test_scenarios_vtc_within_bound():
    table = X.scenarios(opts(steps=5000)).tables[0]
    for row in table.rows:
        assert row["max_drift"] >= 0
        if row["scheduler"] == "vtc":
            assert row["drift_over_2U"] <= 1.0
        assert math.isclose(sum(row["shares"]), 1.0)
    fcfs = [r for r in table.rows if r["scheduler"] == "fcfs" and r["workload"] == "overload-4"]
    assert fcfs[0]["drift_over_2U"] > 1.0


def test_locality_lpm_reuses_vtc_stays_fair_and_unique_prompts_gain_nothing():
    report = X.locality(opts(steps=3000))
    rows = {(r["workload"], r["scheduler"]): r for r in report.tables[0].rows}
    assert len(rows) == 6
    lpm, fcfs, vtc = (rows["prefix-heavy", s] for s in ("lpm", "fcfs", "vtc"))
    # longest prefix match computes a fraction of the prefill and serves the most
    assert lpm["hit_rate"] > fcfs["hit_rate"] + 0.2 and lpm["hit_rate"] > vtc["hit_rate"] + 0.2
    assert lpm["prefill_per_request"] < 0.5 * min(
        fcfs["prefill_per_request"], vtc["prefill_per_request"]
    )
    assert lpm["tokens_per_t"] > 1.3 * max(fcfs["tokens_per_t"], vtc["tokens_per_t"])
    assert lpm["requests_per_kt"] > max(fcfs["requests_per_kt"], vtc["requests_per_kt"])
    # ... and is unfair; VTC stays within its bound (charged for uncached tokens only)
    for workload in ("prefix-heavy", "no-sharing"):
        assert rows[workload, "vtc"]["drift_over_2U"] <= 1.0
        assert rows[workload, "fcfs"]["drift_over_2U"] > 1.0
        assert rows[workload, "lpm"]["max_drift"] > 2 * rows[workload, "vtc"]["max_drift"]
    # nothing shared: LPM has nothing to match and is FCFS; hits are only a preempted
    # request's own blocks
    assert rows["no-sharing", "lpm"] == {**rows["no-sharing", "fcfs"], "scheduler": "lpm"}
    for s in ("fcfs", "vtc"):
        assert rows["no-sharing", s]["hit_rate"] < 0.05
    for row in rows.values():
        assert math.isclose(sum(row["shares"]), 1.0)
        assert row["evicted"] > 0  # the cache is smaller than the prefixes
    for panel in report.panels:
        cache = panel.result.cache
        cache.check()
        assert 0 < cache.peak <= cache.capacity == 16384


def test_locality_window_rows_run_the_core_with_the_cache_lookup():
    """Locality VTC (vtc.Scheduler, locality_quantum=Q) gets more hits than VTC on
    shared prefixes, stays within its bound 2(U + Q) here, and loses nothing
    when nothing is shared."""
    report = X.locality(opts(steps=3000))
    assert [t.name for t in report.tables] == ["locality", "locality-window"]
    rows = {(r["workload"], r["scheduler"]): r for r in report.tables[1].rows}
    assert len(rows) == 10
    for workload in ("prefix-heavy", "no-sharing"):
        base = rows[workload, "vtc"]
        assert base["Q"] == 0 and base["speedup"] == 1.0
        for label in ("U/4", "U/2", "U", "2U"):
            row = rows[workload, f"vtc Q={label}"]
            assert row["drift_over_bound"] <= 1.0
            assert math.isclose(row["bound_over_2U"], 1 + row["Q"] / 32768)
            assert row["speedup"] >= 0.99
            assert math.isclose(sum(row["shares"]), 1.0)
            if workload == "prefix-heavy":
                assert row["hit_rate"] > base["hit_rate"] + 0.2
                assert row["speedup"] > 1.1


def test_locality_window_rows_are_the_same_through_the_reference():
    """The core's window chooses what vtc.reference's does: the same rows."""
    core = X.locality(opts(steps=1500)).tables[1].rows
    ref = X.locality(opts(steps=1500, factory=reference_scheduler)).tables[1].rows
    assert core == ref


# -- reporting and the command line ---------------------------------------------


def test_table_render_and_records():
    t = Table("t", "Title", ["scheduler", "max_drift", "returning_share", "rpm"])
    t.rows = [
        {"scheduler": "vtc", "max_drift": 12345.6, "returning_share": 0.5, "rpm": None},
        {"scheduler": "fcfs", "max_drift": float("nan"), "returning_share": 0.019, "rpm": 5},
    ]
    lines = t.render().splitlines()
    assert lines[0] == "Title"
    assert lines[1].split() == t.columns
    assert lines[3].split() == ["vtc", "12,346", "50.0%", "-"]
    assert lines[4].split() == ["fcfs", "-", "1.9%", "5"]
    assert t.records()[1] == {
        "scheduler": "fcfs",
        "max_drift": None,
        "returning_share": 0.019,
        "rpm": 5,
    }


def test_progress_bar_draws_only_when_enabled():
    buf = io.StringIO()
    bar = Progress("run", 100, enabled=True, stream=buf, delay=0.0)
    bar.update(50)
    bar.close()
    assert "run [" in buf.getvalue() and "100%" in buf.getvalue()
    quiet = io.StringIO()
    bar = Progress("run", 100, enabled=False, stream=quiet, delay=0.0)
    bar.update(50)
    bar.close()
    assert quiet.getvalue() == ""


def test_cli_json_and_plot(tmp_path, capsys):
    js, png = tmp_path / "d.json", tmp_path / "d.png"
    assert (
        main(["drift", "--steps", "3000", "--json", str(js), "--plot", str(png), "--no-progress"])
        == 0
    )
    out = capsys.readouterr().out
    assert "scheduler" in out and "max_drift" in out and "vtc" in out
    data = json.loads(js.read_text())
    assert [r["scheduler"] for r in data["drift"]] == ["fcfs", "lcf", "vtc"]
    assert set(data["drift"][0]) == {
        "scheduler",
        "half_run_drift",
        "max_drift",
        "drift_over_2U",
        "throughput",
    }
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_plot_without_matplotlib_names_the_extra(tmp_path, capsys, monkeypatch):
    # matplotlib comes with vtc[sim]: without it --plot stops before any experiment runs
    # (a None entry in sys.modules makes the import raise ImportError), and 'all' writes JSON.
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    png = tmp_path / "d.png"
    ran = []
    monkeypatch.setitem(X.EXPERIMENTS, "drift", lambda opts: ran.append(opts))
    assert main(["drift", "--plot", str(png), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--plot" in err and "pip install 'vtc[sim]'" in err
    assert ran == [] and not png.exists()
    with pytest.raises(ImportError, match=r"vtc\[sim\]"):
        plot([], png)

    out = tmp_path / "all"
    monkeypatch.setattr("vtc.sim.__main__.EXPERIMENTS", {"weighted": _weighted_small})
    assert main(["all", "--out", str(out), "--no-progress"]) == 0
    captured = capsys.readouterr()
    assert "no PNGs" in captured.err and "vtc[sim]" in captured.err
    assert sorted(p.suffix for p in out.iterdir()) == [".json"]


def _weighted_small(opts):
    return X.EXPERIMENTS["weighted"](dataclasses.replace(opts, steps=500))


def test_cli_reference_impl_and_errors(tmp_path, capsys):
    js = tmp_path / "w.json"
    assert (
        main(
            [
                "weighted",
                "--steps",
                "1500",
                "--impl",
                "reference",
                "--json",
                str(js),
                "--no-progress",
            ]
        )
        == 0
    )
    assert [r["weight"] for r in json.loads(js.read_text())["weighted"]] == [1.0, 2.0, 3.0, 4.0]
    assert main(["returning", "--steps", "1000", "--no-progress"]) == 2
    assert "quiet" in capsys.readouterr().err
    assert main(["trace", "--trace", str(tmp_path / "missing.csv"), "--no-progress"]) == 2


def test_cli_all_writes_a_results_folder(tmp_path):
    out = tmp_path / "results"
    assert main(["all", "--steps", "3000", "--out", str(out), "--no-progress"]) == 0
    names = {p.name for p in out.iterdir()}
    for table in (
        "drift",
        "returning",
        "kv_sweep",
        "rpm_sweep",
        "trace",
        "trace_latency",
        "weighted",
        "priority",
    ):
        assert f"{table}.json" in names
    for exp in X.EXPERIMENTS:
        assert f"{exp}.png" in names
    kv = json.loads((out / "kv_sweep.json").read_text())["kv_sweep"]
    assert [r["M"] for r in kv[:5]] == list(X.KV_SWEEP)
