"""``Requests.submit`` (an engine's arrival into the adapter's request table)
called ``CALLS`` times with fresh ``str`` keys over 64 tenants, for callgrind
(``submit_probe.sh`` runs it with ``CALLS`` 2000 and 6000, and with ``MODE=none``,
the same loop calling a no-op, and divides the difference of the differences by
4000). The keys are made and hashed before the loop in both modes."""

import os

import vtc
from vtc.adapter import Requests

CALLS = int(os.environ.get("CALLS", "0"))
MODE = os.environ.get("MODE", "submit")

core = vtc.Scheduler(M=100_000)
requests = Requests(core)
keys = [f"cmpl-{i}" for i in range(CALLS)]
tenants = [f"t{i % 64}" for i in range(CALLS)]
for k in keys:
    hash(k)
submit = requests.submit if MODE == "submit" else (lambda *a: None)
for k, t in zip(keys, tenants):
    submit(k, None, t, 100)
