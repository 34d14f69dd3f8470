"""Two pure-Python VTC baselines for the side-by-side benchmark.

Both implement the same rules as ``vtc.Scheduler`` (policy ``"vtc"``, weight 1
for every client) restricted to the engine-mode calls the benchmark drives:
``submit``, ``schedule``, ``decode(ids, 1)`` and ``finish``. Selection key is
``(counter, submit seq of the client's head request)``; the lift on becoming
backlogged is to the least counter of the backlogged clients (or, with none,
to the counter of the client that most recently left the backlog).

* :class:`HeapqVTC` -- the straightforward fast Python version: a ``heapq`` of
  ``(counter, head_seq, version, client)`` with lazy deletion (an entry is
  live iff its version is the client's current one) and periodic compaction.
* :class:`ArtifactVTC` -- the paper artifact's approach: a dict of counters and
  a ``min`` over the backlogged clients on every admission (and lift), O(C).

``test_engine_step.py::test_baselines_agree`` checks that both produce the
same admissions and counters as ``vtc.Scheduler`` on a small workload.
"""

from __future__ import annotations

import heapq
from collections import deque


class _Base:
    def __init__(self, M: int, wp: float = 1.0, wq: float = 2.0) -> None:
        self.M = M
        self.wp = wp
        self.wq = wq
        self.counter: dict = {}
        self.queues: dict = {}  # client -> deque of (seq, rid, prompt)
        self.req: dict = {}  # running rid -> [client, footprint]
        self.occupancy = 0
        self.seq = 0
        self.last_left = None

    def _floor(self):  # least counter over backlogged clients, or None
        raise NotImplementedError

    def _rekey(self, c) -> None:  # client c's key changed (it is backlogged)
        pass

    def _left(self, c) -> None:  # client c left the backlog
        pass

    def _select(self):  # the backlogged client with the least key
        raise NotImplementedError

    def submit(self, rid: int, client, prompt_len: int) -> None:
        q = self.queues.get(client)
        if q is None:
            q = self.queues[client] = deque()
            self.counter[client] = 0.0
        self.seq += 1
        if not q:
            f = self._floor()
            if f is None and self.last_left is not None:
                f = self.counter[self.last_left]
            if f is not None and f > self.counter[client]:
                self.counter[client] = f
            q.append((self.seq, rid, prompt_len))
            self._rekey(client)
        else:
            q.append((self.seq, rid, prompt_len))

    def schedule(self) -> list:
        out = []
        while True:
            c = self._select()
            if c is None:
                break
            q = self.queues[c]
            _, rid, prompt = q[0]
            if self.occupancy + prompt > self.M:
                break
            q.popleft()
            self.occupancy += prompt
            self.req[rid] = [c, prompt]
            self.counter[c] += self.wp * prompt
            if q:
                self._rekey(c)
            else:
                self.last_left = c
                self._left(c)
            out.append(rid)
        return out

    def decode(self, ids, tokens: int = 1) -> None:
        if not isinstance(ids, list):
            ids = ids.tolist()
        req = self.req
        per_client: dict = {}
        for rid in ids:
            r = req[rid]
            r[1] += tokens
            c = r[0]
            per_client[c] = per_client.get(c, 0) + tokens
        self.occupancy += tokens * len(ids)
        wq = self.wq
        counter = self.counter
        queues = self.queues
        for c, t in per_client.items():
            counter[c] += wq * t
            if queues[c]:
                self._rekey(c)

    def finish(self, rid: int) -> None:
        _, footprint = self.req.pop(rid)
        self.occupancy -= footprint


class HeapqVTC(_Base):
    """heapq with lazy deletion: O(log C) per re-key, amortised compaction."""

    def __init__(self, M: int, wp: float = 1.0, wq: float = 2.0) -> None:
        super().__init__(M, wp, wq)
        self.heap: list = []
        self.version: dict = {}
        self.live: set = set()

    def _valid(self, e) -> bool:
        return self.version.get(e[3]) == e[2]

    def _clean_top(self) -> None:
        heap = self.heap
        while heap and not self._valid(heap[0]):
            heapq.heappop(heap)

    def _floor(self):
        self._clean_top()
        return self.heap[0][0] if self.heap else None

    def _rekey(self, c) -> None:
        v = self.version.get(c, 0) + 1
        self.version[c] = v
        if c not in self.live:
            self.live.add(c)
        heapq.heappush(self.heap, (self.counter[c], self.queues[c][0][0], v, c))
        if len(self.heap) > 4 * len(self.live) + 64:
            self.heap = [e for e in self.heap if self._valid(e)]
            heapq.heapify(self.heap)

    def _left(self, c) -> None:
        self.version[c] += 1  # invalidates its entries
        self.live.discard(c)

    def _select(self):
        self._clean_top()
        return self.heap[0][3] if self.heap else None


class ArtifactVTC(_Base):
    """Dict of counters; min over backlogged clients on every admission: O(C)."""

    def __init__(self, M: int, wp: float = 1.0, wq: float = 2.0) -> None:
        super().__init__(M, wp, wq)
        self.backlogged: dict = {}  # insertion-ordered set

    def _floor(self):
        if not self.backlogged:
            return None
        counter = self.counter
        return min(counter[c] for c in self.backlogged)

    def _rekey(self, c) -> None:
        self.backlogged[c] = None

    def _left(self, c) -> None:
        del self.backlogged[c]

    def _select(self):
        best = None
        best_key = None
        counter = self.counter
        queues = self.queues
        for c in self.backlogged:
            k = (counter[c], queues[c][0][0])
            if best_key is None or k < best_key:
                best, best_key = c, k
        return best
