"""A provisional pop decided, for ``calls_probe.sh``: each loop submits a request,
pops it (``WaitingQueue.pop_request``), decides the pop and finishes the request.
``MODE=native`` decides it with the native ``WaitingQueue.settle``, ``MODE=python``
with the Python method it replaced (vLLM's ``settle`` before optimisation 43's step
3, over the native ``_pending`` property), ``MODE=admit`` calls ``Requests.admit``
directly (the floor: no deciding at all), ``MODE=none`` leaves the pop pending
(cleared by the release). The differences between modes are what deciding costs."""

import os

import vtc
from vtc._core import WaitingQueue
from vtc.adapter import Requests

CALLS = int(os.environ.get("CALLS", "0"))
MODE = os.environ.get("MODE", "native")
RUN, LOAD = "RUNNING", "WAITING_FOR_REMOTE_KVS"


class Req:
    __slots__ = ("request_id", "status", "num_computed_tokens")

    def __init__(self, request_id: str) -> None:
        self.request_id, self.status, self.num_computed_tokens = request_id, RUN, 12


class Queue(WaitingQueue):
    def __new__(cls, requests: Requests):
        return super().__new__(cls, requests, RUN, LOAD)

    def python_settle(self, num_scheduled_tokens=None) -> None:
        t = self._pending
        if t is None:
            return
        self._pending = None
        request = t.request
        status, computed = request.status, request.num_computed_tokens
        if not (status == RUN or status == LOAD or computed > 0):
            self.requests.set_aside(t)
            return
        if num_scheduled_tokens is not None and status == RUN:
            computed -= num_scheduled_tokens.get(request.request_id, 0)
        self.requests.admit(t, computed)


requests = Requests(vtc.Scheduler(M=1000))
queue = Queue(requests)
queue.requests = requests  # (the Python settle's reference)
request = Req("k")
schedule = {"k": 4}


def run() -> None:
    submit, pop, release = requests.submit, queue.pop_request, requests.release
    settle = {"native": queue.settle, "python": queue.python_settle}.get(MODE)
    for _ in range(CALLS):
        submit("k", request, "x", 12)
        pop()
        if settle is not None:
            settle(schedule)
        elif MODE == "admit":
            t = queue._pending
            queue._pending = None
            requests.admit(t, 8)
        else:
            queue._pending = None
        release("k", True)


run()
