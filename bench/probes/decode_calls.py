"""``decode(<list of ids>, 1)`` called ``CALLS`` times, for callgrind (``probe.sh``
runs it with ``CALLS=0`` and ``CALLS=1000`` and divides the difference by the ids).

``NC`` clients (default 300) with 4 x 512 requests submitted, 512 admitted: with 300
clients every backlogged client runs (the decode's rebuild); with 1,000, 512 of them.
``NC=10000``: 3 requests per client, 480 admitted (issue 20's point). ``MODE=list``
passes the token counts as a list too. With ``NC=10000`` the figure varies by ~20
instructions an id from run to run (the setup's cost differs between the two
processes): take several runs."""

import os

import vtc

CALLS = int(os.environ.get("CALLS", "0"))
MODE = os.environ.get("MODE", "int")
NC = int(os.environ.get("NC", "300"))

s = vtc.Scheduler(M=10**12)
if NC == 10_000:
    B = 480
    for rid in range(3 * NC):
        s.submit(rid, rid % NC, 100)
else:
    B = 512
    for i in range(4 * B):
        s.submit(i * 7919 + 3, f"c{i % NC}", 100)
ids = sorted(s.pop() for _ in range(B))
toks = 1 if MODE == "int" else [1] * B
s.decode(ids, toks)
for _ in range(CALLS):
    s.decode(ids, toks)
