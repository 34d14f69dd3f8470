"""Helpers the shared-counter tests on a real Redis have in common: a wait for a
condition, charging tenants through a scheduler, and a store that records (and can
lose) sync replies."""

from __future__ import annotations

import itertools

import vtc
from helpers import DEADLINE_S, wait_for  # noqa: F401 - tests/helpers.py, for these tests
from vtc import distributed as D

_rid = itertools.count(1 << 40)  # request ids no test file picks by itself


def serve_all(s: vtc.Scheduler, tokens: dict[str, int]) -> None:
    """One request per tenant, submitted together (so none lifts another), admitted and
    finished: each tenant is charged its ``tokens`` prompt tokens (wp = 1)."""
    rids = {}
    for tenant, n in tokens.items():
        rids[tenant] = next(_rid)
        s.submit(rids[tenant], tenant, n)
    admitted = s.schedule()
    assert set(rids.values()) <= set(admitted)
    for rid in rids.values():
        s.finish(rid)


class Recording:
    """A store that records each request and reply; ``drop`` loses the next reply(ies)
    after the script ran (the store applied the request; the replica never hears)."""

    def __init__(self, inner: D.RedisStore) -> None:
        self.inner = inner
        self.prefix = inner.prefix
        self.requests: list[D.SyncRequest] = []
        self.replies: list[D.SyncReply] = []
        self.drop = 0

    def sync(self, req: D.SyncRequest) -> D.SyncReply:
        self.requests.append(req)
        reply = self.inner.sync(req)
        if self.drop:
            self.drop -= 1
            raise TimeoutError("the reply was lost")
        self.replies.append(reply)
        return reply

    def counters(self):
        return self.inner.counters()

    def backlog(self):
        return self.inner.backlog()
