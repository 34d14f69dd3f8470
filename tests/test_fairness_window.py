"""vtc._core.FairnessWindow: the per-tenant metrics' Jain's index, counter spread and
tenants' gains over a sliding window, computed in the core, against the Python computation
``vtc.metrics`` did before (kept here as the reference) over random workloads."""

from __future__ import annotations

import math
import random
from itertools import repeat

import pytest

import vtc
from helpers import FairnessReference as Reference
from vtc._core import FairnessWindow
from vtc.metrics import _by_name, _label, jain_index


def same(got, want) -> bool:
    (j, spread, n), (rj, rspread, rn) = got, want
    if (j is None) != (rj is None):
        return False
    if j is not None and not (math.isnan(j) and math.isnan(rj)):
        if j != pytest.approx(rj, rel=1e-12):
            return False
    return spread == rspread and n == rn


def same_gains(fw, ref, core) -> None:
    """``gains`` and ``above`` agree with the reference's gains (the labels' window)
    for every tenant and a few bars."""
    want = ref.gains(core)
    keys = list(core.services())
    assert dict(zip(map(str, keys), fw.gains(core, keys))) == want
    assert math.isnan(fw.gains(core, ["nobody"])[0])
    for bar in [-math.inf, 0.0, math.inf, math.nan, *list(want.values())[:3]]:
        above = {str(k): v for k, v in fw.above(core, bar)}
        assert above == {t: v for t, v in want.items() if v > bar}, bar


@pytest.mark.parametrize("seed", range(12))
def test_the_core_window_is_the_python_computation(seed):
    """Differential: random submissions (str and int keys, weights), admissions,
    decodes, finishes, cancels, preemptions, set-asides, forgets (and returns under
    the same key), refreshes at random times (some at the same time, a few back in
    time): the core's figures equal the reference's, the snapshots as many."""
    rng = random.Random(seed)
    window = [1.0, 5.0, 30.0, math.inf][seed % 4]
    core = vtc.Scheduler(M=400, wp=1.0, wq=2.0)
    fw, ref = FairnessWindow(window), Reference(window)
    tenants = [f"t{i}" for i in range(rng.randint(2, 15))] + [100, 101]
    rid, now, aside = 0, 0.0, []
    for _ in range(500):
        op = rng.random()
        if op < 0.3:
            rid += 1
            core.submit(rid, rng.choice(tenants), rng.randint(1, 40))
        elif op < 0.4:
            core.schedule()
        elif op < 0.55:
            running = core.running()
            if running:
                core.decode(running, rng.randint(1, 10))
        elif op < 0.62:
            running = core.running()
            if running:
                core.finish(rng.choice(running))
        elif op < 0.66:
            running = core.running()
            if running:
                core.preempt(rng.choice(running))
        elif op < 0.7 and rid:
            if core.status(r := rng.randint(1, rid)) is not None:
                core.cancel(r)
        elif op < 0.74:
            r = core.set_aside()
            if r is not None:
                aside.append(r)
        elif op < 0.77 and aside:
            r = aside.pop()
            if core.status(r) == "aside":
                core.put_back(r)
        elif op < 0.8:
            core.forget_idle()
        elif op < 0.82:
            core.set_weight(rng.choice(tenants), rng.choice([0.5, 1.0, 3.0]))
        else:
            now += rng.choice([0.0, 0.1, 0.5, 1.0, 4.0])
            t = now - 3.0 if rng.random() < 0.02 else now
            got, want = fw.refresh(core, t), ref.refresh(core, t)
            assert same(got, want), (got, want)
            assert fw.snapshots == len(ref.history)
            same_gains(fw, ref, core)


def test_the_first_refresh_has_no_jain_and_the_figures_of_a_small_case():
    core = vtc.Scheduler(M=25, wp=1.0, wq=1.0)
    for rid, tenant in ((1, "a"), (2, "a"), (3, "b"), (4, "b")):
        core.submit(rid, tenant, 10)
    fw = FairnessWindow(10.0)
    assert fw.refresh(core, 0.0) == (None, 0.0, 2)  # both wait, neither served yet
    running = core.schedule()
    assert len(running) == 2  # one each; the second ones wait
    core.decode([running[0]], 6)  # one gets 6 more tokens than the other
    jain, spread, n = fw.refresh(core, 1.0)
    assert n == 2 and spread == 6.0
    assert jain == pytest.approx(jain_index([16.0, 10.0]))
    assert fw.snapshots == 2 and fw.window == 10.0
    assert fw.gains(core, ["a", "b"]) == [16.0, 10.0]  # the start: before any service
    assert fw.above(core, 12.0) == [("a", 16.0)]


@pytest.mark.parametrize("window", [0.0, -1.0, math.nan])
def test_a_window_must_be_positive(window):
    with pytest.raises(vtc.InvalidArgumentError, match="window"):
        FairnessWindow(window)


def test_bad_arguments_raise_type_errors():
    with pytest.raises(TypeError):
        FairnessWindow("30")  # type: ignore[arg-type]
    fw = FairnessWindow(30.0)
    with pytest.raises(TypeError, match="scheduler"):
        fw.refresh(object(), 0.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="now"):
        fw.refresh(vtc.Scheduler(M=10), "now")  # type: ignore[arg-type]
    assert fw.refresh(vtc.Scheduler(M=10), math.nan) == (None, 0.0, 0)
    with pytest.raises(TypeError):
        fw.gains(vtc.Scheduler(M=10), [1.5])  # type: ignore[list-item]
    with pytest.raises(TypeError):
        fw.gains(vtc.Scheduler(M=10), 7)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="bar"):
        fw.above(vtc.Scheduler(M=10), "high")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="scheduler"):
        fw.above(object(), 0.0)  # type: ignore[arg-type]
    assert "FairnessWindow(window=30.0" in repr(fw)


def relabel_reference(fw, core, names, limit, factor):
    """``FairnessWindow.relabel`` as ``TenantMetrics._relabel`` computed it in Python
    before (from ``gains`` and ``above``, which the test above checks)."""
    got = dict(zip(names, map(max, fw.gains(core, names), repeat(0.0))))
    dropped = []
    while len(got) > limit:
        worst = min(got, key=lambda t: (got[t], _by_name(t)))
        del got[worst]
        dropped.append(names.index(worst))
    free = limit - len(got)
    bar = -math.inf if free or not got else min(got.values()) * factor
    rows = sorted((-v, _by_name(t), t) for t, v in fw.above(core, bar) if t not in got)
    held, kept, clash = {_label(t): t for t in got}, [], None
    for row in rows:
        label = _label(row[-1])
        if label not in held:
            held[label] = row[-1]
            kept.append(row)
        elif clash is None:
            clash = (held[label], row[-1])
    taken = [t for *_, t in kept[:free]]
    incumbents = sorted(got, key=lambda t: (-got[t], _by_name(t)), reverse=True)
    swaps = []
    for (minus, _, new), old in zip(kept[free:], incumbents):
        if -minus <= got[old] * factor:
            break
        swaps.append((new, names.index(old)))
    return dropped, taken, swaps, clash


def labelled_sample(rng, keys):
    """A random labelled set as the metrics keep one: keys of the core, no two with
    the same label value."""
    by_label = {}
    for k in rng.sample(keys, rng.randint(0, len(keys))):
        by_label.setdefault(_label(k), k)
    return list(by_label.values())


@pytest.mark.parametrize("ints", [True, False])
@pytest.mark.parametrize("seed", range(8))
def test_relabel_is_the_python_computation(seed, ints):
    """Differential: random workloads over names and (``ints``) int keys whose label
    values collide (``7`` and ``"7"``), tenants forgotten and back, refreshes at random
    times; for random labelled sets, limits (under, at and over the set's size) and
    margins, ``relabel`` returns what the Python did: the tenants over the limit, those
    taking free labels, the swaps, and the first candidate passed over (names only:
    the candidates beyond the limit left unordered)."""
    rng = random.Random(seed)
    core = vtc.Scheduler(M=300)
    fw = FairnessWindow([2.0, 10.0, math.inf][seed % 3])
    tenants = [f"t{i}" for i in range(rng.randint(3, 30))]
    if ints:
        tenants += [7, "7", 8, "08", -3, "-3"]
    rid, now, seen = 0, 0.0, [0, 0, 0, 0]
    for _ in range(400):
        op = rng.random()
        if op < 0.35:
            rid += 1
            core.submit(rid, rng.choice(tenants), rng.randint(1, 30))
        elif op < 0.45:
            core.schedule()
        elif op < 0.65:
            running = core.running()
            if running:
                core.decode(rng.sample(running, rng.randint(1, len(running))), rng.randint(1, 9))
        elif op < 0.75:
            running = core.running()
            if running:
                core.finish(rng.choice(running))
        elif op < 0.78:
            core.forget_idle()
        else:
            now += rng.choice([0.0, 0.5, 1.0, 3.0])
            fw.refresh(core, now)
            keys = list(core.services())
            for _ in range(4):
                names = labelled_sample(rng, keys)
                limit = max(1, len(names) + rng.randint(-3, 2))
                factor = rng.choice([1.0, 1.5, 2.0])
                got = fw.relabel(core, names, limit, factor)
                assert got == relabel_reference(fw, core, names, limit, factor)
                for i, part in enumerate(got):
                    seen[i] += bool(part)
    assert all(seen[:3]), seen  # drops, free labels and swaps each exercised
    assert bool(seen[3]) == ints  # collisions: only with int keys


def test_relabel_of_a_small_case_and_its_bad_arguments():
    core = vtc.Scheduler(M=1000)
    for rid, (tenant, tokens) in enumerate([("a", 50), ("b", 10), (7, 40), ("7", 30)]):
        core.submit(rid, tenant, tokens)
    core.schedule()
    fw = FairnessWindow(30.0)
    fw.refresh(core, 0.0)  # no start: every gain is the whole service
    # one label held by b: a free label goes to a (most served), then 7 (40 > 2 * 10
    # took b's label), "7" passed over: 7 holds its label value
    assert fw.relabel(core, ["b"], 2, 2.0) == ([], ["a"], [(7, 0)], (7, "7"))
    assert fw.relabel(core, ["a", "b", 7], 2, 2.0) == ([1], [], [], None)  # b goes
    assert fw.relabel(core, [], 0, 2.0) == ([], [], [], (7, "7"))  # no label to take
    with pytest.raises(vtc.InvalidArgumentError, match="limit"):
        fw.relabel(core, [], -1, 2.0)
    with pytest.raises(TypeError, match="factor"):
        fw.relabel(core, [], 1, "2")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="scheduler"):
        fw.relabel(object(), [], 1, 2.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        fw.relabel(core, [1.5], 1, 2.0)  # type: ignore[list-item]
