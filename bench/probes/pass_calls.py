"""An engine's scheduling pass, for ``calls_probe.sh``: ``MODE=pass`` enters and leaves
one kept ``Adapter.selecting()`` pass (no shared counters, no prefix lookup), as vLLM's
``schedule()`` does every step; ``MODE=none`` the bare loop."""

import os

import vtc
from vtc.adapter import Adapter
from vtc.config import EngineConfig

CALLS = int(os.environ.get("CALLS", "0"))
MODE = os.environ.get("MODE", "pass")

kept = Adapter(vtc.Scheduler(1000), EngineConfig()).selecting()


def run() -> None:
    if MODE == "pass":
        for _ in range(CALLS):
            with kept:
                pass
    else:
        for _ in range(CALLS):
            pass


run()
