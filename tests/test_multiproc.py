"""vtc.multiproc.SeriesFiles: vtc's series in a prometheus_client multiprocess
directory, in files of their own from which removed series leave; read back with
the collector the engines' ``/metrics`` use (``MultiProcessCollector``)."""

from __future__ import annotations

import contextlib
import gc
import os
import subprocess
import sys
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, values
from prometheus_client.mmap_dict import mmap_key
from prometheus_client.multiprocess import MultiProcessCollector

from helpers import DEADLINE_S, remove_tree, wait_for
from vtc import multiproc
from vtc.multiproc import SeriesFiles, series_key


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


# vtc's families' shapes: (metric name, sample name, label names, other label values, help)
FAMILY_SHAPES = [
    ("vtc_tenant_service_tokens", "vtc_tenant_service_tokens_total", ("tenant", "kind"),
     ("prompt",), "Tokens charged to a tenant"),
    ("vtc_tenant_counter", "vtc_tenant_counter", ("tenant",), (), "A tenant's virtual counter"),
    ("vtc_tenant_requests", "vtc_tenant_requests", ("tenant", "state"), ("waiting",),
     "A tenant's requests by state"),
    # labels whose names sort before the tenant's, and one with JSON's special characters
    ("m", "m_total", ("tenant", "a", "zz"), ("x", 'q"\\\n\u00e9'), 'help "quoted"\n'),
]  # fmt: skip


@given(st.sampled_from(FAMILY_SHAPES), st.text())
def test_a_series_key_is_prometheus_clients_mmap_key(shape, tenant):
    """The key made from a family's template (``series_key``) is the one prometheus_client
    makes and reads, for any tenant name: quotes, backslashes, control characters, non-ASCII
    and the template's own placeholder included."""
    metric_name, name, labelnames, rest, help_text = shape
    values_ = (tenant, *rest)
    assert series_key(metric_name, name, labelnames, values_, help_text) == mmap_key(
        metric_name, name, labelnames, values_, help_text
    )


@pytest.mark.parametrize("tenant", ["\x00vtc-tenant\x00", '"\x00vtc-tenant\x00"', "", "🦀\ud800"])
def test_a_series_key_with_the_templates_placeholder_or_odd_characters(tenant):
    for metric_name, name, labelnames, rest, help_text in FAMILY_SHAPES:
        values_ = (tenant, *rest)
        assert series_key(metric_name, name, labelnames, values_, help_text) == mmap_key(
            metric_name, name, labelnames, values_, help_text
        )


def test_a_series_key_without_a_leading_tenant_label_is_mmap_key():
    for labelnames, values_ in [((), ()), (("kind", "tenant"), ("prompt", "t"))]:
        assert series_key("m", "m", labelnames, values_, "h") == mmap_key(
            "m", "m", labelnames, values_, "h"
        )


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
    # the files the collector reads (*.db; beside them the spares, *.next: module doc)
    assert sorted(p.name for p in directory.glob("*.db")) == [
        f"counter_{os.getpid()}-vtc.db",
        f"gauge_livesum_{os.getpid()}-vtc.db",
    ]
    assert {p.suffix for p in directory.iterdir()} <= {".db", ".next"}


@pytest.mark.filterwarnings("ignore:Removal of labels")  # prometheus_client in multiprocess mode
def test_a_value_written_again_lands_where_its_entry_is_now(directory):
    """A value remembers where its entry is between writes (``SeriesFiles.write``'s fast
    path): after its file grew, was rewritten by a compaction, after another tenant's
    removal and after its own series was made again, each write still shows in the
    files, and a removed series' writes never do."""
    files = SeriesFiles(str(directory))
    tokens, waiting = served(files, CollectorRegistry())
    with files.creating():
        a, gone = tokens.labels("a"), waiting.labels("gone")
    a.inc(1)
    gone.set(4)
    with files.creating():  # the counter file grows past its first 64 KiB, mapped again
        for i in range(700):
            tokens.labels(f"tenant-with-a-longer-name-{i:04}").inc(1)
    assert (directory / f"counter_{os.getpid()}-vtc.db").stat().st_size > 1 << 16
    a.inc(2)
    assert collect(directory)[("t_tokens_total", frozenset({("tenant", "a")}))] == 3
    files.remove("gone")
    gone.set(5)  # removed, not compacted yet: its file is stale, not written
    a.inc(4)
    files.compact()  # both files rewritten: new positions
    a.inc(8)
    seen = collect(directory)
    assert seen[("t_tokens_total", frozenset({("tenant", "a")}))] == 15
    assert ("t_waiting", frozenset({("tenant", "gone")})) not in seen
    gone.set(6)  # still removed: never written again
    assert ("t_waiting", frozenset({("tenant", "gone")})) not in collect(directory)
    tokens.remove("a")  # prometheus_client forgets the child, vtc's files keep it...
    with files.creating():
        again = tokens.labels("a")  # ...until a new one has the series
    again.inc(1)
    a.inc(100)  # the old child: not the series any more
    assert collect(directory)[("t_tokens_total", frozenset({("tenant", "a")}))] == 1


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


# -- what blocks on the filesystem is off the caller's thread (module doc) ---------------


def churn(files: SeriesFiles, tokens: Counter, i: int) -> None:
    """A tenant labelled, then removed and the files compacted (rewritten)."""
    with files.creating():
        tokens.labels(f"one-off-{i}").inc(1)
    files.remove(f"one-off-{i}")
    files.compact()


def test_a_replaced_file_is_closed_off_the_callers_thread(directory, monkeypatch):
    """Closing a replaced file frees its inode, which can wait on the disk: the
    worker's thread closes it, not the thread that compacts (the engine's)."""
    closed: list[threading.Thread] = []
    close = multiproc._File.close

    def recorded(self):
        closed.append(threading.current_thread())
        close(self)

    monkeypatch.setattr(multiproc._File, "close", recorded)
    files = SeriesFiles(str(directory))
    tokens, _ = served(files, CollectorRegistry())
    for i in range(3):
        churn(files, tokens, i)
    wait_for(lambda: len(closed) >= 3, "the three replaced counter files closed")
    assert threading.current_thread() not in closed


def test_a_rewrite_fills_a_spare_made_off_the_callers_thread(directory, monkeypatch):
    """Once the worker made a type's spare, a rewrite of that type creates no file on
    the caller's thread (it fills the spare and renames it), and the values read back."""
    made: list[tuple[threading.Thread, str]] = []
    init = multiproc._File.__init__

    def recorded(self, path, *args, **kwargs):
        made.append((threading.current_thread(), path))
        init(self, path, *args, **kwargs)

    monkeypatch.setattr(multiproc._File, "__init__", recorded)
    files = SeriesFiles(str(directory))
    tokens, _ = served(files, CollectorRegistry())
    with files.creating():
        stays = tokens.labels("stays")
    stays.inc(2)
    churn(files, tokens, 0)  # the first rewrite asks for the next spare
    counter = files.path("counter")
    wait_for(
        lambda: (
            any(p.startswith(counter) and p.endswith(".next") for _, p in made)
            and files._worker.ready
        ),
        "the counter file's spare made",
    )
    made.clear()
    churn(files, tokens, 1)
    stays.inc(3)
    assert threading.current_thread() not in [t for t, _ in made]
    assert collect(directory) == {("t_tokens_total", frozenset({("tenant", "stays")})): 5}


def test_rewrites_stay_right_while_the_worker_is_behind(directory, monkeypatch):
    """With the worker stuck on a close, rewrites make their own files: every
    compaction still leaves exactly the series not removed, and once the worker
    goes on every replaced file is closed."""
    release = threading.Event()
    closed: list[object] = []
    close = multiproc._File.close

    def slow(self):
        release.wait(DEADLINE_S)
        close(self)
        closed.append(self)

    monkeypatch.setattr(multiproc._File, "close", slow)
    files = SeriesFiles(str(directory))
    tokens, waiting = served(files, CollectorRegistry())
    with files.creating():
        stays = tokens.labels("stays")
        waiting.labels("stays").set(4)
    try:
        for i in range(20):
            stays.inc(1)
            churn(files, tokens, i)
            assert collect(directory) == {
                ("t_tokens_total", frozenset({("tenant", "stays")})): i + 1,
                ("t_waiting", frozenset({("tenant", "stays")})): 4,
            }
    finally:
        release.set()
    wait_for(lambda: len(closed) >= 20, "the 20 replaced counter files closed")


def test_spares_are_removed_with_their_series_files(directory):
    files = SeriesFiles(str(directory))
    tokens, _ = served(files, CollectorRegistry())
    churn(files, tokens, 0)
    wait_for(lambda: list(directory.glob("*.next")), "a spare made")
    del files, tokens
    gc.collect()
    wait_for(lambda: not list(directory.glob("*.next")), "the spares removed")
    assert collect(directory) == {}  # the counter file left as it was: no series


# run in a process of its own, from this directory (its helpers and this module's)
EXITS_WITH_SPARES = """
import sys
from prometheus_client import CollectorRegistry
from helpers import wait_for
from test_multiproc import churn, served
from vtc.multiproc import SeriesFiles

files = SeriesFiles(sys.argv[1])
tokens, _ = served(files, CollectorRegistry())
churn(files, tokens, 0)
wait_for(lambda: files._worker.ready, "a spare made")
# exits here with files alive: only the interpreter's exit can remove the spares
"""


def test_a_process_that_exits_leaves_no_spares(directory):
    """An engine's process that exits normally with its metrics alive (as vLLM's and
    SGLang's scheduler processes do) removes its spares (``*.next``): the directory
    outlives it, and a restarted engine has another pid, so nothing else would."""
    done = subprocess.run(
        [sys.executable, "-c", EXITS_WITH_SPARES, str(directory)],
        cwd=os.path.dirname(os.path.abspath(__file__)),  # on the path of "-c"
        capture_output=True,
        text=True,
        timeout=4 * DEADLINE_S,
    )
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in directory.iterdir() if p.suffix != ".db") == []
    assert [p.name for p in directory.glob("counter_*-vtc.db")]  # its series file stays


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_rewrites_its_own_files(directory):
    """A child forked after the worker started (its thread is not in the child) writes
    and rewrites files of its own: from zero, as prometheus_client's values do."""
    files = SeriesFiles(str(directory))
    tokens, _ = served(files, CollectorRegistry())
    with files.creating():
        stays = tokens.labels("stays")
    stays.inc(7)
    churn(files, tokens, 0)
    wait_for(lambda: files._worker.ready, "the parent's spare made")
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            stays.inc(2)
            for i in range(1, 4):
                churn(files, tokens, i)
            files._worker.jobs.put(None)  # its spares removed before it exits
            files._worker._thread.join(DEADLINE_S)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    stays.inc(1)
    churn(files, tokens, 9)
    assert {p.name for p in directory.glob("*.db")} == {
        f"counter_{os.getpid()}-vtc.db",
        f"counter_{pid}-vtc.db",
    }
    assert collect(directory) == {("t_tokens_total", frozenset({("tenant", "stays")})): 7 + 1 + 2}


# ops of the differential test below: make a tenant's series, remove a tenant, compact,
# and a batch of writes (tenant, counter amount, gauge value)
_TENANTS = st.sampled_from(["a", "b", "c", "d"])
_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("make"), _TENANTS),
        st.tuples(st.just("remove"), _TENANTS),
        st.tuples(st.just("compact")),
        st.tuples(
            st.just("writes"),
            st.lists(st.tuples(_TENANTS, st.integers(0, 9), st.integers(0, 9)), max_size=6),
        ),
    ),
    max_size=25,
)


@pytest.mark.filterwarnings("ignore:Removal of labels")  # prometheus_client in multiprocess mode
@given(ops=_OPS)
def test_writes_in_one_call_read_back_as_written_one_by_one(tmp_path_factory, ops):
    """``SeriesFiles.write_all`` (a refresh's writes in one call) leaves the files as the
    same writes through ``write`` one by one do: after removals (a stale file, a removed
    series' value), compactions and a series made again."""
    seen = []
    for batched in (False, True):
        directory = tmp_path_factory.mktemp("prom")
        files = SeriesFiles(str(directory))
        tokens, waiting = served(files, CollectorRegistry())
        made: dict[str, tuple] = {}  # tenant -> its two values, the last made
        for op in ops:
            if op[0] == "make":
                with files.creating():
                    made[op[1]] = (tokens.labels(op[1])._value, waiting.labels(op[1])._value)
            elif op[0] == "remove":
                files.remove(op[1])  # its values stay in `made`: written to, never seen
                for family in (tokens, waiting):
                    with contextlib.suppress(KeyError):  # not made, or removed already
                        family.remove(op[1])
            elif op[0] == "compact":
                files.compact()
            else:
                writes = [(made[t], n, g) for t, n, g in op[1] if t in made]
                if batched:
                    files.write_all([(v[0], n, None) for v, n, _ in writes], add=True)
                    files.write_all([(v[1], g, 2.5) for v, _, g in writes])
                else:
                    for v, n, _ in writes:
                        files.write(v[0], n, 0.0, add=True)
                    for v, _, g in writes:
                        files.write(v[1], g, 2.5)
        files.compact()
        seen.append(collect(directory))
    assert seen[0] == seen[1]


@pytest.mark.parametrize("how", ["files", "directory"])
def test_files_deleted_under_it_are_written_again(directory, monkeypatch, caplog, how):
    """vtc's files deleted while in use (a tmp cleaner emptying or removing the
    directory) are found at the next compaction and written again, in the directory
    made again, with every value as it is now (the writes meanwhile included): not
    left mapped and written where no scrape reads them. Logged once."""
    files = SeriesFiles(str(directory))
    tokens, waiting = served(files, CollectorRegistry())
    with files.creating():
        a, w = tokens.labels("a"), waiting.labels("a")
    a.inc(3)
    w.set(2)
    churn(files, tokens, 0)  # a rewrite: the worker makes spares, which go too
    wait_for(lambda: files._worker.ready, "a spare made")
    expected = {
        ("t_tokens_total", frozenset({("tenant", "a")})): 10,
        ("t_waiting", frozenset({("tenant", "a")})): 5,
    }

    for i in range(2):
        if how == "directory":
            remove_tree(directory)
        else:
            for path in directory.iterdir():
                path.unlink()
            assert collect(directory) == {}
        a.inc(7 if i == 0 else 0)
        w.set(5)
        files.compact()
        assert collect(directory) == expected
        churn(files, tokens, 1 + i)  # rewritten again from there (a spare or not)
        assert collect(directory) == expected
    deleted = [r for r in caplog.records if "were deleted while in use" in r.getMessage()]
    assert len(deleted) == 1 and str(directory) in deleted[0].getMessage()


def test_a_file_the_worker_cannot_make_is_logged_once(directory, monkeypatch, caplog):
    """The worker's spares failing at every rewrite (a full disk, the directory gone)
    log once, not at each rewrite; the rewrites make their own files meanwhile."""
    init = multiproc._File.__init__

    def no_spares(self, path, entries=(), spare=False):
        if spare:
            raise OSError(28, "No space left on device")
        init(self, path, entries, spare)

    monkeypatch.setattr(multiproc._File, "__init__", no_spares)
    files = SeriesFiles(str(directory))
    tokens, _ = served(files, CollectorRegistry())
    with files.creating():
        tokens.labels("stays").inc(1)
    for i in range(4):
        churn(files, tokens, i)
        wait_for(lambda: files._worker.ready, "the spare's failure reported")
    assert collect(directory) == {("t_tokens_total", frozenset({("tenant", "stays")})): 1}
    thread = files._worker._thread  # not another test's worker, still running
    failed = [
        r
        for r in caplog.records
        if "prepare of a multiprocess file" in r.getMessage() and r.thread == thread.ident
    ]
    assert len(failed) == 1
