"""vtc's Prometheus series in a prometheus_client multiprocess directory, in files of
their own, so that a removed series leaves ``/metrics``.

vLLM and SGLang serve the metrics of their scheduler processes through
prometheus_client's multiprocess directory (``PROMETHEUS_MULTIPROC_DIR``): each
process writes its values to mmapped files (``counter_<pid>.db``,
``gauge_<mode>_<pid>.db``, ...) and the serving process's collector reads every
``*.db`` file of the directory, taking a file's type (and a gauge's mode) from
its name. prometheus_client never removes a value from those files (``remove()``
only warns), so every tenant ever labelled would stay on ``/metrics`` until the
server restarts.

:class:`SeriesFiles` keeps vtc's values in files named the same way but with a
process part of their own, ``<type>_<pid>-vtc.db``, which only vtc writes (the
engine's own values stay in prometheus_client's files). Its :attr:`value_class`
stands in for prometheus_client's value class while vtc's metrics and their
children are created (:meth:`SeriesFiles.creating`).

Invariant: after :meth:`SeriesFiles.compact`, each of vtc's files holds exactly
the series not removed, each with the value last written. A file is rewritten
whole under a name the collector does not read (``….db.new``) and put in place
by one rename, so a scrape reads the old file or the new one, never both and
never half of one: no counter is counted twice, none goes back.

What blocks on the filesystem is done off the caller's thread (the engine's),
by a thread of each :class:`SeriesFiles` (:class:`_Worker`): closing a replaced
file, which frees its inode and can wait on the disk (2.4-2.8 ms on a busy ext4
disk, for ~60 µs of CPU), and making the file the next rewrite of a type fills
(created, sized and mapped ahead: a spare, ``….db.next``). A rewrite on the
caller's thread is then a copy into the spare's map and the rename; the files
are what they were when :meth:`SeriesFiles.compact` returns, as before. Without
a spare ready (the first rewrite of a type, or the thread behind) the caller
makes the file itself. The spares no rewrite took are removed when their
:class:`SeriesFiles` is collected or the process exits normally (a killed one
leaves them; the collector never reads them).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import itertools
import logging
import mmap
import os
import queue
import struct
import threading
import weakref
from collections import deque
from collections.abc import Iterable, Iterator
from json.encoder import encode_basestring_ascii
from typing import Any

from prometheus_client import values
from prometheus_client.mmap_dict import mmap_key

__all__ = ["SeriesFiles"]

_log = logging.getLogger("vtc")
_SPARE_NAMES = itertools.count()  # spares' names: unique in a process (its pid in them)

_INT = struct.Struct("i")
_DOUBLES = struct.Struct("dd")
_INITIAL_SIZE = 1 << 16  # prometheus_client's first size of a file (then doubled)
_EXIT_WAIT_S = 5.0  # at the interpreter's exit, the most each worker is waited for

# This process's pid, kept by a fork hook: a write compares it instead of asking the
# kernel (os.getpid() is a system call, ~0.2 µs, at every value written). A child made
# by os.fork (multiprocessing's fork and forkserver methods included) runs the hook;
# a spawned process imports this module afresh.
_PID = os.getpid()


def _forked() -> None:
    global _PID
    _PID = os.getpid()


os.register_at_fork(after_in_child=_forked)

# Every worker's thread while it runs, with its job queue. The threads are daemons (an
# engine's exit never hangs on them), so the interpreter would stop them wherever they
# are; at exit each is asked to end and waited for (a bounded time): it removes the
# spares it made, which the directory would otherwise keep (it outlives the process, and
# a restarted engine has another pid).
_RUNNING: dict[threading.Thread, queue.SimpleQueue[Any]] = {}


@atexit.register
def _finish_workers() -> None:
    running = [(t, jobs) for t, jobs in list(_RUNNING.items()) if t.is_alive()]
    for _, jobs in running:
        jobs.put(None)
    for thread, _ in running:
        thread.join(_EXIT_WAIT_S)


# A series' key in the files is prometheus_client's mmap_key: the JSON of its metric
# name, sample name, labels (keys sorted) and help, ~2.3 us each (json.dumps). A
# relabelling makes ~100-140 series, each the same as the last of its family but for
# the tenant label, whose value sorts last (its name does: "kind", "state" <
# "tenant") and so sits at one place in the JSON: the key is made from the family's
# template around that place and the tenant's JSON string (~0.1 us), the same
# string mmap_key makes (tests/test_multiproc.py compares them).
_PLACEHOLDER = "\x00vtc-tenant\x00"  # never in a family's own names, labels or help
_PLACEHOLDER_JSON = encode_basestring_ascii(_PLACEHOLDER)


@functools.lru_cache(maxsize=256)
def _key_template(
    metric_name: str, name: str, labelnames: tuple[str, ...], rest: tuple[str, ...], help_text: str
) -> tuple[str, str] | None:
    """The key of a series with these names, labels ``("tenant", *rest)`` and help, cut
    around its tenant value's JSON; None if the placeholder is not there once (then
    :func:`series_key` calls mmap_key)."""
    key = mmap_key(metric_name, name, labelnames, (_PLACEHOLDER, *rest), help_text)
    if key.count(_PLACEHOLDER_JSON) != 1:
        return None
    head, tail = key.split(_PLACEHOLDER_JSON)
    return head, tail


def series_key(
    metric_name: str, name: str, labelnames: tuple[str, ...], labelvalues: Any, help_text: str
) -> str:
    """prometheus_client's ``mmap_key`` of a series (a family's template filled with the
    tenant label's value when the first label is the tenant)."""
    if labelnames[:1] == ("tenant",):
        template = _key_template(metric_name, name, labelnames, tuple(labelvalues[1:]), help_text)
        if template is not None:
            return template[0] + encode_basestring_ascii(labelvalues[0]) + template[1]
    return mmap_key(metric_name, name, labelnames, labelvalues, help_text)


def entry_head(key: str) -> bytes:
    """The bytes of a file entry before its value: the key's length (4 bytes) and the
    key (UTF-8), padded with spaces so that the value is 8-byte aligned."""
    encoded = key.encode("utf-8")
    return _INT.pack(len(encoded)) + encoded + b" " * (8 - (len(encoded) + 4) % 8)


class _File:
    """One of vtc's files, in prometheus_client's mmap format (its ``MmapedDict``): a
    4-byte count of the bytes used and 4 of padding, then entries, each
    :func:`entry_head` then the value and a timestamp (two doubles). Only vtc writes
    it, so the position of each value is known from the layout: the file is written
    whole in one write (no per-entry file access) and values are then updated in place.

    Invariant: the header counts only whole entries (an entry is written before the
    header grows over it), so a reader never sees half of one."""

    def __init__(self, path: str, entries: Iterable[Any] = (), spare: bool = False) -> None:
        """Write ``entries`` (their ``head``, ``key``, ``value``, ``timestamp``) to
        ``path``, created or truncated, and map it. ``spare``: a file of zeros
        (``entries`` ignored) that :meth:`fill` writes later."""
        data, positions = (bytearray(8), {}) if spare else _layout(entries)
        used = len(data)
        size = _INITIAL_SIZE
        while size < used:
            size *= 2
        self._f = open(path, "w+b")  # noqa: SIM115 - kept open with its map
        try:
            # a spare's zeros written, not a hole: its pages are there when filled
            self._f.write(bytes(size) if spare else data)
            self._f.truncate(size)
            self._f.flush()
            self._m = mmap.mmap(self._f.fileno(), size)
        except BaseException:
            self._f.close()
            raise
        self.path = path
        self._size = size
        self._used = used
        self._positions = positions

    def fill(self, entries: Iterable[Any]) -> None:
        """Lay ``entries`` out in a spare (one copy into its map; the file grows if
        they need more room)."""
        data, positions = _layout(entries)
        used = len(data)
        if used > self._size:
            self._grow(used)
        self._m[0:used] = data
        self._used = used
        self._positions = positions

    def write_value(self, key: str, head: bytes, value: float, timestamp: float) -> int:
        """Set ``key``'s value, appending its entry if the file has none; the value's
        position (it stays there while the file is in place: :meth:`_grow` maps the
        file again, with the same layout)."""
        pos = self._positions.get(key)
        if pos is None:
            pos = self._append(head)
            self._positions[key] = pos
        _DOUBLES.pack_into(self._m, pos, value, timestamp)
        return pos

    def _append(self, head: bytes) -> int:
        """A new entry (value 0) at the end; its value's position."""
        end = self._used + len(head) + 16
        if end > self._size:
            self._grow(end)
        start = self._used
        self._m[start:end] = head + bytes(16)
        self._m[0:4] = _INT.pack(end)  # after the entry: a reader sees it whole or not
        self._used = end
        return start + len(head)

    def _grow(self, end: int) -> None:
        """Double the file's size until ``end`` bytes fit, and map it again."""
        size = self._size
        while size < end:
            size *= 2
        self._m.close()
        self._f.truncate(size)
        self._m = mmap.mmap(self._f.fileno(), size)
        self._size = size

    def deleted(self) -> bool:
        """Whether the file is no longer in any directory (unlinked, or its directory
        removed): still mapped and written, but no scrape reads it."""
        return os.fstat(self._f.fileno()).st_nlink == 0

    def close(self) -> None:
        self._m.close()
        self._f.close()  # the file's last reference: a replaced one's inode freed here


def _layout(entries: Iterable[Any]) -> tuple[bytearray, dict[str, int]]:
    """The bytes of a file holding ``entries``, header included, and the position of
    each entry's value by key."""
    parts = [bytes(8)]
    positions: dict[str, int] = {}
    used = 8
    pack = _DOUBLES.pack
    for e in entries:
        head = e.head
        used += len(head)
        positions[e.key] = used
        parts += (head, pack(e.value, e.timestamp))
        used += 16
    data = bytearray(b"".join(parts))
    data[0:4] = _INT.pack(used)
    return data, positions


class _Worker:
    """A :class:`SeriesFiles`' thread for what blocks on the filesystem (module doc):
    it closes the files handed to :meth:`close` and makes the spares asked for by
    :meth:`prepare`, each then in :attr:`ready` (``(prefix, file)``). Jobs asked for
    while :meth:`holding` are handed over at its end, in one go: the thread wakes
    once, after the caller's rewrites, not between them (each wake takes the GIL
    from the caller a few times). It holds none of the caller's locks (a fork while
    it works leaves the child nothing held); the thread starts with the first job
    and ends when its SeriesFiles is collected."""

    def __init__(self, owner: SeriesFiles) -> None:
        self.jobs: queue.SimpleQueue[list[tuple[Any, ...]] | None] = queue.SimpleQueue()
        self.ready: deque[tuple[str, _File | None]] = deque()  # None: making it failed
        self.spares: dict[str, _File] = {}  # the owner's: removed with it
        self._thread: threading.Thread | None = None
        self._held: list[tuple[Any, ...]] | None = None
        weakref.finalize(owner, self.jobs.put, None)

    def close(self, file: _File) -> None:
        self._submit(("close", file))

    def prepare(self, prefix: str, path: str) -> None:
        self._submit(("prepare", prefix, path))

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        self._held = held = []
        try:
            yield
        finally:
            self._held = None
            if held:
                self._start()
                self.jobs.put(held)

    def _submit(self, job: tuple[Any, ...]) -> None:
        if self._held is not None:
            self._held.append(job)
        else:
            self._start()
            self.jobs.put([job])

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=_work,
                args=(self.jobs, self.ready, self.spares),
                name="vtc-metrics-files",
                daemon=True,
            )
            _RUNNING[self._thread] = self.jobs
            self._thread.start()


def _work(
    jobs: queue.SimpleQueue[list[tuple[Any, ...]] | None],
    ready: deque[tuple[str, _File | None]],
    spares: dict[str, _File],
) -> None:
    """:class:`_Worker`'s thread (no reference to its SeriesFiles, which it outlives
    until the ``None`` its collection, or the interpreter's exit, sends: then the
    spares no rewrite took are removed)."""
    try:
        _work_until_told(jobs, ready, spares)
    finally:
        _RUNNING.pop(threading.current_thread(), None)


def _work_until_told(
    jobs: queue.SimpleQueue[list[tuple[Any, ...]] | None],
    ready: deque[tuple[str, _File | None]],
    spares: dict[str, _File],
) -> None:
    logged: set[tuple[str, type]] = set()  # each kind of failure is logged once
    while True:
        batch = jobs.get()
        if batch is None:
            break
        for job in batch:
            try:
                if job[0] == "close":
                    job[1].close()
                else:
                    ready.append((job[1], _File(job[2], spare=True)))
            except Exception as e:  # a full disk, the directory gone: the caller makes its own
                if (job[0], type(e)) not in logged:
                    logged.add((job[0], type(e)))
                    _log.warning(  # the caller does without: not an error
                        "vtc metrics: %s of a multiprocess file failed", job[0], exc_info=True
                    )
                if job[0] == "prepare":
                    ready.append((job[1], None))  # asked again at the next rewrite
    for spare in [file for _, file in ready if file is not None] + list(spares.values()):
        with contextlib.suppress(Exception):
            spare.close()
            os.unlink(spare.path)


class _Value:
    """One series' value (a counter, a gauge, a histogram bucket or sum), kept in
    memory and written through to its :class:`SeriesFiles`; the interface of
    prometheus_client's values (``inc``, ``set``, ``get``)."""

    _multiprocess = True
    files: SeriesFiles  # set on the subclass each SeriesFiles makes

    def __init__(
        self,
        typ: str,
        metric_name: str,
        name: str,
        labelnames: Any,
        labelvalues: Any,
        help_text: str,
        multiprocess_mode: str = "",
        **_kwargs: Any,
    ) -> None:
        self.prefix = f"{typ}_{multiprocess_mode}" if typ == "gauge" else typ
        labelnames = tuple(labelnames)
        self.key = series_key(metric_name, name, labelnames, labelvalues, help_text)
        self.head = entry_head(self.key)  # the key as its file entry starts
        self.tenant: str | None = labelvalues[0] if labelnames[:1] == ("tenant",) else None
        self.value = 0.0
        self.timestamp = 0.0
        # where its last write went: the file, the value's position in it, and the
        # SeriesFiles' layout generation then (SeriesFiles.write)
        self.file: _File | None = None
        self.pos = 0
        self.layout = -1
        self.files.add(self)

    def inc(self, amount: float) -> None:
        self.files.write(self, amount, 0.0, add=True)

    def set(self, value: float, timestamp: float | None = None) -> None:
        self.files.write(self, value, timestamp or 0.0)

    def set_exemplar(self, exemplar: Any) -> None:  # not kept in multiprocess mode
        return

    def get(self) -> float:
        return self.value

    def get_exemplar(self) -> None:
        return None


class _Creating:
    """:meth:`SeriesFiles.creating`'s block (a class, not a generator: a relabelling
    enters ~100 of them, one per series made)."""

    __slots__ = ("files", "saved")

    def __init__(self, files: SeriesFiles) -> None:
        self.files = files

    def __enter__(self) -> None:
        self.files._lock.acquire()
        self.saved = values.ValueClass
        values.ValueClass = self.files.value_class

    def __exit__(self, *exc: object) -> None:
        values.ValueClass = self.saved
        self.files._lock.release()


class SeriesFiles:
    """vtc's values of this process in ``directory`` (the module doc)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._lock = threading.RLock()
        self._pid = os.getpid()
        self._files: dict[str, _File] = {}  # file prefix -> its open file
        self._series: dict[str, dict[str, _Value]] = {}  # file prefix -> key -> value
        self._tenants: dict[str, list[_Value]] = {}  # tenant label -> its values
        self._stale: set[str] = set()  # prefixes whose file still holds removed series
        self._asked: set[str] = set()  # prefixes whose spare the worker is making
        self._worker = _Worker(self)
        self._spares = self._worker.spares  # prefix -> the file its next rewrite fills
        self._layout = 0  # the generation of the files' layout (write's fast path)
        self._warned_deleted = False
        self.value_class = type("Value", (_Value,), {"files": self})

    def creating(self) -> _Creating:
        """prometheus_client's metrics created in this block (and the children made
        by ``labels()``) keep their values here. Metrics read the value class when
        they make a value, from the module: it is swapped for the block."""
        return _Creating(self)

    def path(self, prefix: str) -> str:
        """The file of ``prefix`` (``counter``, ``gauge_livesum``, ...) for this process."""
        return os.path.join(self.directory, f"{prefix}_{self._pid}-vtc.db")

    # -- values --------------------------------------------------------------------------
    # A file that holds removed series (its prefix in _stale) is rewritten whole at the
    # next compact(), with every value as it is then: a series added or a value set
    # meanwhile is written there, not appended to the old file and then copied (a label
    # swap adds ~6 series of the new tenant, a refresh then sets them, between the
    # old tenant's removal and the compaction at the refresh's end).
    def add(self, value: _Value) -> None:
        with self._lock:
            if self._pid != _PID:
                self._follow_fork()
            series = self._series.setdefault(value.prefix, {})
            if value.key in series:  # another value had this series: its writes end
                self._layout += 1
            series[value.key] = value
            if value.tenant is not None:
                self._tenants.setdefault(value.tenant, []).append(value)
            if value.prefix not in self._stale:
                self._write_entry(value)

    # A refresh writes ~150 values. A value written once knows where its entry is
    # (its file and position) as long as the layout generation it saw is current;
    # everything that moves an entry or makes a value's write wrong bumps it: a
    # rewrite (new file, new positions), a removal (the series must not be written
    # until the compaction: its file is stale), a fork (the parent's files). A file
    # that grows keeps its positions (its map is read at each write).
    def write(self, value: _Value, new: float, timestamp: float, add: bool = False) -> None:
        """Set ``value`` to ``new`` (``add``: add ``new`` to it, after a fork to the
        child's value, from zero)."""
        with self._lock:
            if self._pid != _PID:
                self._follow_fork()
            if add:
                new += value.value
            value.value, value.timestamp = new, timestamp
            if value.layout == self._layout:
                _DOUBLES.pack_into(value.file._m, value.pos, new, timestamp)  # type: ignore[union-attr]
                return
            self._write_moved(value)

    # A refresh's ~150 writes as one call: one lock, one fork check, the fast path's
    # names bound once (~70 ns a write warm, against ~290 through write()).
    def write_all(
        self, writes: Iterable[tuple[_Value, float, float | None]], add: bool = False
    ) -> None:
        """:meth:`write` of each ``(value, new, timestamp)`` (None: no timestamp) in
        ``writes``, in order."""
        with self._lock:
            if self._pid != _PID:
                self._follow_fork()
            layout, pack = self._layout, _DOUBLES.pack_into
            for value, new, timestamp in writes:
                if add:
                    new += value.value
                timestamp = timestamp or 0.0
                value.value, value.timestamp = new, timestamp
                if value.layout == layout:
                    pack(value.file._m, value.pos, new, timestamp)  # type: ignore[union-attr]
                else:
                    self._write_moved(value)
                    layout = self._layout  # a file made or rewritten: a new layout

    def _write_moved(self, value: _Value) -> None:
        """Write ``value`` whose entry may have moved since its last write: to its entry
        found again, or, while its file holds removed series, at the compaction; a
        value whose series another value or a removal ended is not written."""
        prefix = value.prefix
        if prefix not in self._stale and self._series[prefix].get(value.key) is value:
            self._write_entry(value)

    def _write_entry(self, value: _Value) -> None:
        """Write ``value`` to its file (appending its entry if new) and remember where."""
        file = self._file(value.prefix)  # may rewrite it: a new layout
        value.pos = file.write_value(value.key, value.head, value.value, value.timestamp)
        value.file = file
        value.layout = self._layout

    def remove(self, tenant: str) -> None:
        """Remove every series labelled ``tenant`` (from the files at :meth:`compact`)."""
        with self._lock:
            for value in self._tenants.pop(tenant, ()):
                series = self._series.get(value.prefix, {})
                if series.get(value.key) is value:
                    del series[value.key]
                    self._stale.add(value.prefix)
                    self._layout += 1

    def remove_tenants(self) -> None:
        """Remove the series of every tenant."""
        with self._lock:
            for tenant in list(self._tenants):
                self.remove(tenant)

    def compact(self) -> None:
        """Rewrite the files that still hold removed series, and those deleted under
        it (:meth:`_find_deleted`)."""
        with self._lock:
            if self._pid != _PID:
                self._follow_fork()
            self._find_deleted()
            if not self._stale:
                return
            with self._worker.holding():
                for prefix in sorted(self._stale):
                    self._rewrite(prefix)
            self._stale.clear()

    def tenants(self) -> set[str]:
        """The tenants with series."""
        with self._lock:
            return set(self._tenants)

    # -- files ---------------------------------------------------------------------------
    # A file of vtc's deleted under it (by a tmp cleaner that empties or removes the
    # directory, or by hand) stays mapped: its values go on being written into it and
    # no scrape sees them. Found by its link count (an fstat a file, ~0.6 µs, at each
    # compaction: a refresh's end; the engine refreshes while it steps), it is rewritten
    # like a file holding removed series, every value as it is now, in the directory
    # made again if it went too: vtc's series are back on /metrics, counters at their
    # totals. (prometheus_client's own files, the engine's series, are not its to
    # write again.)
    def _find_deleted(self) -> None:
        gone = sorted(prefix for prefix, file in self._files.items() if file.deleted())
        if not gone:
            return
        if not self._warned_deleted:
            self._warned_deleted = True
            _log.warning(
                "vtc metrics: vtc's files %s in the multiprocess directory %s were deleted "
                "while in use; written again (the engine's own files there are not: its "
                "series stay off /metrics until it restarts)",
                ", ".join(gone),
                self.directory,
            )
        self._stale.update(gone)

    def _file(self, prefix: str) -> _File:
        file = self._files.get(prefix)
        return self._rewrite(prefix) if file is None else file

    def _rewrite(self, prefix: str) -> _File:
        """Write ``prefix``'s series to a new file and put it in place of the old one
        (a file left by an earlier process with this pid included): the spare the
        worker made for it if ready, filled; the old file closed by the worker, which
        then makes the next spare."""
        path = self.path(prefix)
        worker = self._worker
        while worker.ready:  # the spares made since the last rewrite
            made, spare = worker.ready.popleft()
            self._asked.discard(made)
            if spare is not None:
                self._spares[made] = spare
        entries = self._series.get(prefix, {}).values()
        file = self._spares.pop(prefix, None)
        if file is not None and file.deleted():  # with its directory, or by hand
            worker.close(file)
            file = None
        if file is None:
            new = path + ".new"  # not *.db: the collector never reads it
            try:
                file = _File(new, entries)
            except FileNotFoundError:  # the directory was removed: made again
                os.makedirs(self.directory, exist_ok=True)
                file = _File(new, entries)
        else:
            new = file.path
            try:
                file.fill(entries)
            except BaseException:
                file.close()
                with contextlib.suppress(OSError):
                    os.unlink(new)
                raise
        try:
            os.replace(new, path)
        except BaseException:
            file.close()
            with contextlib.suppress(OSError):
                os.unlink(new)
            raise
        file.path = path
        old = self._files.get(prefix)
        self._files[prefix] = file
        self._layout += 1
        if old is not None:
            worker.close(old)
        if prefix not in self._asked:
            self._asked.add(prefix)
            # not *.db either; a name of this SeriesFiles' own (another in this
            # process may write the same type's file: a test, a new registry)
            worker.prepare(prefix, f"{path}.{next(_SPARE_NAMES)}.next")
        return file

    def _follow_fork(self) -> None:
        """In a process forked from the one that made the values (its callers' check:
        ``self._pid != _PID``), start again from zero in files of its own, as
        prometheus_client's values do: the parent's files still count what the parent
        wrote."""
        self._pid = _PID
        self._layout += 1
        self._files.clear()  # the parent's: not closed here, the parent writes them
        self._stale.clear()
        self._asked.clear()  # the parent's spares, worker's jobs and thread are the parent's
        self._worker = _Worker(self)
        self._spares = self._worker.spares
        for series in self._series.values():
            for value in series.values():
                value.value = value.timestamp = 0.0
