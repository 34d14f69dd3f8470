"""vtc.multiproc.SeriesFiles: vtc's series in a prometheus_client multiprocess
directory, in files of their own from which removed series leave; read back with
the collector the engines' ``/metrics`` use (``MultiProcessCollector``)."""

from __future__ import annotations

import os
import threading

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, values
from prometheus_client.multiprocess import MultiProcessCollector

from vtc.multiproc import SeriesFiles


@pytest.fixture
def directory(tmp_path, monkeypatch):
    d = tmp_path / "prom"
    d.mkdir()
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(d))
    return d


def collect(directory) -> dict[tuple[str, frozenset], float]:
    reader = CollectorRegistry()
    MultiProcessCollector(reader, path=str(directory))
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in reader.collect()
        for s in family.samples
    }


def served(files: SeriesFiles, registry: CollectorRegistry) -> tuple[Counter, Gauge]:
    with files.creating():
        tokens = Counter("t_tokens", "tokens", ["tenant"], registry=registry)
        waiting = Gauge(
            "t_waiting", "waiting", ["tenant"], registry=registry, multiprocess_mode="livesum"
        )
    return tokens, waiting


def test_removed_series_leave_the_directory_and_the_rest_keep_their_values(directory):
    files = SeriesFiles(str(directory))
    tokens, waiting = served(files, CollectorRegistry())
    with files.creating():
        for tenant, n in (("a", 3), ("b", 5), ("c", 7)):
            tokens.labels(tenant).inc(n)
            waiting.labels(tenant).set(n)
    files.remove("b")
    seen = collect(directory)
    assert seen[("t_tokens_total", frozenset({("tenant", "b")}))] == 5  # until compacted
    files.compact()
    seen = collect(directory)
    assert {dict(labels)["tenant"] for _, labels in seen} == {"a", "c"}
    assert seen[("t_tokens_total", frozenset({("tenant", "c")}))] == 7
    assert seen[("t_waiting", frozenset({("tenant", "a")}))] == 3
    assert sorted(p.name for p in directory.iterdir()) == [
        f"counter_{os.getpid()}-vtc.db",
        f"gauge_livesum_{os.getpid()}-vtc.db",
    ]


def test_the_engines_own_values_stay_in_prometheus_client_files(directory, monkeypatch):
    monkeypatch.setattr(values, "ValueClass", values.MultiProcessValue())
    registry = CollectorRegistry()
    engine = Counter("engine_requests", "the engine's own", ["tenant"], registry=registry)
    engine.labels("a").inc(2)  # made outside creating(): prometheus_client's files
    files = SeriesFiles(str(directory))
    tokens, _ = served(files, registry)
    with files.creating():
        tokens.labels("a").inc(1)
    files.remove("a")
    files.compact()
    seen = collect(directory)
    assert seen == {("engine_requests_total", frozenset({("tenant", "a")})): 2}
    assert values.ValueClass is not files.value_class  # restored after the block


def test_a_file_left_by_an_earlier_process_with_this_pid_is_replaced(directory):
    stale = SeriesFiles(str(directory))
    tokens, _ = served(stale, CollectorRegistry())
    with stale.creating():
        tokens.labels("old").inc(9)
    files = SeriesFiles(str(directory))  # a new process that got the same pid
    tokens, _ = served(files, CollectorRegistry())
    with files.creating():
        tokens.labels("new").inc(1)
    assert collect(directory) == {("t_tokens_total", frozenset({("tenant", "new")})): 1}


def test_a_scrape_during_compactions_never_sees_a_series_missing_or_going_back(directory):
    """One tenant's counter grows while other tenants come and go and the file is
    rewritten after each; a reader collecting all the while must always find it,
    never smaller than before (a file read half-written, or two files at once,
    would show it missing, doubled or reset)."""
    files = SeriesFiles(str(directory))
    tokens, _ = served(files, CollectorRegistry())
    key = ("t_tokens_total", frozenset({("tenant", "stays")}))
    with files.creating():
        stays = tokens.labels("stays")
    stays.inc(1)
    done = threading.Event()
    seen: list[float | None] = []

    def scrape() -> None:
        while not done.is_set() or len(seen) < 20:
            seen.append(collect(directory).get(key))

    reader = threading.Thread(target=scrape)
    reader.start()
    try:
        for i in range(400):
            with files.creating():
                for j in range(5):
                    tokens.labels(f"one-off-{i}-{j}").inc(1)
            stays.inc(1)
            for j in range(5):
                files.remove(f"one-off-{i}-{j}")
            files.compact()
    finally:
        done.set()
        reader.join(timeout=120)
    seen.append(collect(directory).get(key))
    assert len(seen) >= 20 and None not in seen
    assert seen == sorted(seen) and seen[-1] == 401
    assert files.tenants() == {"stays"}


def test_the_files_read_back_with_prometheus_clients_own_readers(directory):
    """vtc lays its files out itself (one write per rewrite, values updated in place):
    prometheus_client's readers (the collector's, and ``MmapedDict`` opening one) read
    every value written, across growth past the first 64 KiB and appends after a
    rewrite, with keys of every padding length and non-ASCII tenant names."""
    from prometheus_client.mmap_dict import MmapedDict

    files = SeriesFiles(str(directory))
    tokens, waiting = served(files, CollectorRegistry())
    names = [f"t{'x' * (i % 9)}-{i}-é" for i in range(700)]  # > 64 KiB of entries

    def labelled(names):  # children made by labels() in this block: vtc's values
        with files.creating():
            return [(tokens.labels(tenant=n), waiting.labels(tenant=n)) for n in names]

    children = labelled(names[:300])
    for i in range(300):
        children[i][0].inc(i + 0.5)
    files.remove(names[0])
    files.compact()  # rewritten: 299 entries laid out in one write
    children += labelled(names[300:])  # appended to the rewritten files
    for i in range(300, len(names)):
        children[i][0].inc(i + 0.5)  # appended, the file grows
        children[i][1].set(-i)
    children[1][0].inc(1.0)  # in place
    path = files.path("counter")
    assert os.path.getsize(path) > 1 << 16
    want = {name: i + 0.5 for i, name in enumerate(names) if i > 0}
    want[names[1]] += 1.0
    got = {}
    for key, value, _, _ in MmapedDict.read_all_values_from_file(path):
        got[key] = value
    assert len(got) == len(want)
    reopened = MmapedDict(path, read_mode=True)
    try:
        assert {k: v for k, v, _ in reopened.read_all_values()} == got
    finally:
        reopened.close()
    seen = collect(directory)
    for name, value in want.items():
        assert seen[("t_tokens_total", frozenset({("tenant", name)}))] == value
    for i, name in enumerate(names[300:], start=300):
        assert seen[("t_waiting", frozenset({("tenant", name)}))] == -i
