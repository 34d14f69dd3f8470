"""Random calls to every public method of ``vtc.Scheduler``, ``SyncLedger`` and
``FairnessWindow``, with ordinary and odd arguments (negative, huge, NaN, wrong types,
empty id lists, mutated snapshots, prefix lookups that raise): no call may panic or
raise ``InternalError``; a call that raises leaves the scheduler as it was
(``snapshot()`` and ``state_version`` equal), and a call that changes the snapshot
changes ``state_version``; the core's invariants hold after every call. Seeded, so a
failure replays. (It found ``decode([], -1)`` breaking the bound on generated counts.)"""

from __future__ import annotations

import random

import numpy as np
import pytest

import vtc
from vtc._core import FairnessWindow, SyncLedger

ODD = [
    0, 1, -1, 2**63 - 1, 2**63, -(2**63), 2**64, 10**30, 0.5, float("nan"), float("inf"),
    -0.0, True, None, "a", "", "\x00", "\ud800", b"x", [], [1], (1,), {}, {1: 2},
    np.int64(3), np.float64(2.5), np.array([1, 2]), np.array([], dtype=np.int64),
    np.array([1.5]), object(), 1e300, -1e300,
]  # fmt: skip
TENANTS = ["c1", "c2", "c3", 1, 2, 3]


class Output:
    def __init__(self, request_id, new_token_ids):
        self.request_id, self.new_token_ids = request_id, new_token_ids


class Probe:
    def __init__(self, seed: int) -> None:
        self.r = random.Random(seed)

    def value(self):
        r = self.r.random()
        if r < 0.5:
            return self.r.randrange(0, 40)
        if r < 0.65:
            return self.r.choice(TENANTS)
        return self.r.choice(ODD)

    def ids(self):
        r = self.r.random()
        n = self.r.randrange(0, 6)
        if r < 0.6:
            return [self.r.randrange(0, 40) for _ in range(n)]
        if r < 0.8:
            dtype = self.r.choice([np.int64, np.int32, np.uint64, np.float64])
            return np.array([self.r.randrange(0, 40) for _ in range(n)], dtype=dtype)
        return self.value()

    def scheduler(self) -> vtc.Scheduler:
        r, kw = self.r, {}
        if r.random() < 0.3:
            kw["predictor"] = "mean"
        if r.random() < 0.2:
            kw["client_cap"] = r.choice([1, 50, 0.5])
        if r.random() < 0.2:
            kw["band_weights"] = {0: 1.0, 1: 3.0}
        if r.random() < 0.2:
            kw["locality_quantum"] = r.choice([0.0, 100.0])
        if r.random() < 0.3:
            kw["wp"] = r.choice([1.0, 2.0, 0.5])
        elif r.random() < 0.2:
            kw["cost"] = r.choice([vtc.QuadraticCost(), vtc.ContextCost(1.0, 2.0, 0.01)])
        try:
            return vtc.Scheduler(r.choice([100, 1000, 10**6]), **kw)
        except vtc.InvalidArgumentError:  # a combination the core refuses
            return vtc.Scheduler(1000)

    def lookup(self):
        k = self.r.randrange(4)
        if k == 0:
            return lambda rid: self.r.randrange(0, 300)
        if k == 1:
            return lambda rid: self.value()
        if k == 2:

            def fails(rid):
                raise RuntimeError("lookup failed")

            return fails
        return None

    def mutated(self, data: bytes) -> bytes:
        b = bytearray(data)
        for _ in range(self.r.randrange(1, 4)):
            if b and self.r.random() < 0.7:
                b[self.r.randrange(len(b))] = self.r.randrange(256)
            elif b:
                del b[self.r.randrange(len(b)) :]
        return bytes(b)

    def call(self, s: vtc.Scheduler, ledger: SyncLedger, window: FairnessWindow) -> None:
        """One random call."""
        r, v = self.r, self.value
        op = r.randrange(31)
        if op < 4:
            s.submit(r.randrange(0, 40), r.choice(TENANTS), r.randrange(0, 300))
        elif op == 4:
            s.submit(v(), v(), v(), v())
        elif op == 5:
            s.submit(r.randrange(40), r.choice(TENANTS), r.randrange(1, 300),
                     r.choice([None, 0, 5]), r.choice([None, 0, 10, 200]),
                     r.choice([None, 0, 1, -5]))  # fmt: skip
        elif op < 9:
            s.schedule()
        elif op < 12:
            ids = self.ids() if r.random() < 0.3 else s.running()[: r.randrange(0, 8)]
            s.decode(ids, r.choice([1, 2, 0, v(), r.choice(ODD), self.ids()]))
        elif op == 12:
            s.decode()
        elif op < 15:
            s.decode_all(r.choice([None, 1, 2, v()]))
        elif op == 15:
            getattr(s, r.choice(["finish", "cancel", "preempt", "put_back"]))(v())
        elif op == 16:
            s.pop(r.choice([None, v()]))
        elif op == 17:
            r.choice([s.peek, s.set_aside, s.forget_idle, s.changes])()
        elif op == 18:
            s.set_weight(v(), v())
        elif op == 19:
            s.raise_counter(v(), v())
        elif op == 20:
            s.raise_counters({v(): v()} if r.random() < 0.5 else v())
        elif op == 21:
            s.set_band_weights(r.choice([None, {0: 1.0, 1: 2.0}, {v(): v()}, v()]))
        elif op == 22:
            getattr(s, r.choice(["generated", "client_tokens", "credit", "status"]))(v())
        elif op == 23:
            outs = [Output(v(), self.ids()) for _ in range(r.randrange(0, 3))]
            s.decode_outputs(outs, {}, missing=r.choice(["hash", "hash-str", "skip", "raise", v()]))
        elif op == 24:
            if r.random() < 0.7:
                s.decode_uniform([Output(rid, [1]) for rid in s.running()])
            else:
                s.decode_uniform(v())
        elif op == 25:
            s.set_prefix_lookup(self.lookup())
        elif op == 26:
            restored = vtc.Scheduler.from_snapshot(self.mutated(s.snapshot()))
            restored._check_invariants()
        elif op == 27:
            s.changes(r.choice([0, 1, 2, -1, 99, v()]))
            s.reset_changes(r.choice([None, 0, 1, v()]))
        elif op == 28:
            n = r.randrange(6)
            if n == 0:
                ledger.read(s, r.random() < 0.5)
            elif n == 1:
                ledger.push_json()
                ledger.acknowledge()
            elif n == 2:
                ledger.forget([v() for _ in range(r.randrange(0, 3))])
            elif n == 3:
                ledger.take_changed(
                    r.choice([b'["s:c1","i:2"]', b"{}", b'["s:c1"]', b"[1]", b'["x"]', b"\xff["]),
                    r.choice([b"1.5,2", b"", b"nan,1", b"1e400,3", b"abc", b"5"]),
                )
            elif n == 4:
                ledger.raise_pulled(s, r.choice([None, {"c1": 1e9}, {v(): v()}]))
            else:
                ledger.reset(s)
            ledger.check()
        else:
            n = r.randrange(3)
            if n == 0:
                window.refresh(s, r.choice([r.random() * 100, v()]))
            elif n == 1:
                window.gains(s, [v() for _ in range(r.randrange(0, 3))])
            else:
                window.above(s, v())


@pytest.mark.parametrize("seed", range(8))
def test_random_calls_never_panic_nor_change_anything_when_they_fail(seed):
    probe = Probe(seed)
    for _ in range(60):
        s = probe.scheduler()
        ledger, window = SyncLedger(probe.r.randrange(2)), FairnessWindow(10.0)
        for step in range(200):
            before, version = s.snapshot(), s.state_version
            try:
                probe.call(s, ledger, window)
            except vtc.InternalError as e:  # pragma: no cover - a defect
                pytest.fail(f"seed {seed} step {step}: InternalError {e}")
            except Exception as e:  # noqa: BLE001 - any error is allowed (a panic is no
                # Exception: PyO3's PanicException derives from BaseException, and fails here)
                if s.snapshot() != before or s.state_version != version:  # pragma: no cover
                    pytest.fail(f"seed {seed} step {step}: {type(e).__name__} {e} changed state")
            # a change of the state is a new version (what keeps an answer relies on it)
            assert s.snapshot() == before or s.state_version != version, f"seed {seed} {step}"
            s._check_invariants()
