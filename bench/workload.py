"""A deterministic engine-step workload shared by the side-by-side benchmark.

One ``Engine.step()`` is what a serving engine asks of its scheduler per
iteration, in engine mode (the engine owns memory):

1. ``decode(running_ids, 1)``: every running request generated one token
   (``running_ids`` is a numpy view kept by the engine, no per-request call);
2. ``finish`` every request that reached its output length;
3. ``submit`` one new request (random client) per finished one, so the
   backlog stays constant;
4. ``schedule()``: admit until the KV budget ``M`` is full.

Prompt and output lengths and the arrival stream come from a seeded
generator, so every scheduler sees the same requests; since all three
implement the same rules they also make the same admissions (checked by
``test_baselines_agree``).
"""

from __future__ import annotations

import numpy as np

PROMPT = (64, 512)
OUTPUT = (32, 384)


class Engine:
    def __init__(
        self,
        sched,
        clients: int,
        waiting: int,
        seed: int = 0,
        keys=None,
        refills: int = 200_000,
        ids: str = "array",
    ) -> None:
        # ids: how the running ids are kept and passed to decode, "array" (a view of
        # an int64 numpy array) or "list" (a Python list, as an engine holds them)
        if ids not in ("array", "list"):
            raise ValueError(f"ids must be 'array' or 'list', got {ids!r}")
        self.as_list = ids == "list"
        self.s = sched
        self.C = clients
        self.keys = keys if keys is not None else list(range(clients))
        self.rng = np.random.default_rng(seed)
        n = waiting + refills  # request ids: the backlog, then one refill per finish
        self.prompt = self.rng.integers(PROMPT[0], PROMPT[1] + 1, size=n).tolist()
        self.output = self.rng.integers(OUTPUT[0], OUTPUT[1] + 1, size=n).tolist()
        self.client = self.rng.integers(0, clients, size=n).tolist()
        self.next_rid = 0
        self.t = 0
        self.calendar: dict = {}  # step -> rids finishing then
        self.ids = [] if self.as_list else np.zeros(1 << 16, dtype=np.int64)
        self.slot: dict = {}  # rid -> position in ids
        self.n = 0
        self.admitted: list = []
        # the initial backlog: round-robin over clients so every one is backlogged
        for i in range(waiting):
            self.client[i] = i % clients
            self._submit()
        self._admit(self.s.schedule())

    def _submit(self) -> None:
        rid = self.next_rid
        self.next_rid += 1
        self.s.submit(rid, self.keys[self.client[rid]], self.prompt[rid])

    def _admit(self, rids) -> None:
        ids, slot, cal = self.ids, self.slot, self.calendar
        for rid in rids:
            if self.as_list:
                ids.append(rid)
            else:
                ids[self.n] = rid
            slot[rid] = self.n
            self.n += 1
            cal.setdefault(self.t + self.output[rid], []).append(rid)
        self.admitted.extend(rids)

    def step(self) -> None:
        s = self.s
        s.decode(self.ids if self.as_list else self.ids[: self.n], 1)
        self.t += 1
        done = self.calendar.pop(self.t, ())
        ids, slot = self.ids, self.slot
        for rid in done:
            s.finish(rid)
            # swap-remove from the running array
            k = slot.pop(rid)
            self.n -= 1
            if k != self.n:
                last = int(ids[self.n])
                ids[k] = last
                slot[last] = k
            if self.as_list:
                ids.pop()
            self._submit()
        self._admit(s.schedule())
