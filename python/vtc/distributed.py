"""VTC across engine replicas: counters shared through Redis.

Every replica keeps its own :class:`vtc.Scheduler` and makes every decision
locally; a :class:`SharedCounters` object next to it keeps each tenant's
counter *global*: the sum of the weighted service every replica charged the
tenant, plus the lifts.  Every ``sync_interval`` engine steps (or ``sync_ms``
milliseconds) the replica makes **one round trip** to the store (a Lua script
on Redis) that

1. pushes the service the replica charged since its last acknowledged sync,
   per tenant, numbered (the store keeps what it applied since then, so a
   request whose reply was lost, or one that is duplicated, is counted
   exactly once);
2. updates which tenants have requests waiting on this replica; a tenant that
   becomes backlogged on its first replica is lifted, in the store, to the
   *global floor*: the least counter of the globally backlogged tenants (a
   sorted set), or the counter of the tenant that last left the backlog;
3. reaps replicas that have not synced for ``liveness_ms`` (their waiting
   tenants stop holding the floor down; what they charged stays counted), and
   forgets the counters of tenants no replica has had waiting or charged for
   ``forget_ms`` whose counter is at most the global floor (their return would
   lift them to the floor anyway), so the store follows the live tenants, not
   every tenant ever seen;
4. pulls the global floor, the global counters of the tenants that arrived
   here or that it just charged, and those of the tenants waiting here that
   were written since the counter version of the last reply it received (a
   delta; plus a small scrub batch of its waiting set).  A full sync (the
   first, and after any fault) pulls every waiting tenant's.

The replica then lifts each pulled tenant's local counter to
``global + local charges since the snapshot`` with ``raise_counter`` (which
never lowers), so between syncs it schedules on ``global + unsynced local``.

Faults: any store error puts the synchronizer in *degraded* mode: the
scheduler simply keeps running as a local VTC (nothing is blocked or
dropped; the only time spent is one socket timeout per ``retry_ms``).  When
the store answers again the next sync reconciles: it pushes what was charged
meanwhile and sends the whole waiting set, in which a tenant that waited here
all along keeps its counter (only tenants new here are lifted), so a deficit
survives an outage of any length.  A Redis that lost its data gets a new
*epoch*; every live replica then re-sends its state, and a tenant without a
counter is restored from the replica's own.  A replica that dies loses at
most what it charged since its last sync.  Stored values that are not
counters are repaired, never used (``docs/distributed.md``).

Wiring an engine (this is all an integration needs)::

    shared = vtc.distributed.from_env()          # None unless VTC_REDIS_URL is set
    ...
    if shared: shared.submit(sched, rid, tenant, prompt_len)   # lift + submit + track
    else:      sched.submit(rid, tenant, prompt_len)
    ...                                          # once per engine step:
    if shared: shared.on_step(sched)
    ...                                          # instead of sched.forget_idle():
    if shared: shared.forget_idle(sched)

or ``shared.start(sched)`` to sync from a background thread instead of
``on_step``.  Without ``VTC_REDIS_URL`` nothing here is imported by the
single-replica path and nothing changes.

:class:`LocalStore` is an in-process twin of the Redis script (same
semantics, as :mod:`vtc.reference` is to the core); the simulator uses it for
speed and ``tests/redis`` checks that both give identical runs.  The
multi-replica engine model that does is :mod:`vtc.sim.replicas`; this module
keeps the store, the sync and the bound they guarantee
(:func:`staleness_bound`, :func:`drift_bound`) and imports nothing of
:mod:`vtc.sim`.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import TYPE_CHECKING, Any, Callable, Protocol, TypeVar, Union

from vtc._core import MAX_COUNTER, Scheduler, SyncLedger
from vtc.config import DEFAULT_SYNC_CPU_SHARE, DEFAULT_SYNC_MS, SYNC_CHANGES_READER

if TYPE_CHECKING:
    import redis
    from vtc.config import SharedCounterSettings

log = logging.getLogger("vtc.distributed")

Client = Union[int, str]
_T = TypeVar("_T")

ENV_URL = "VTC_REDIS_URL"
ENV_NAMESPACE = "VTC_REDIS_NAMESPACE"
ENV_SYNC_INTERVAL = "VTC_SYNC_INTERVAL"
ENV_SYNC_MS = "VTC_SYNC_MS"
ENV_REPLICA = "VTC_REPLICA_ID"
ENV_TIMEOUT_MS = "VTC_REDIS_TIMEOUT_MS"

KEEP_MS = 7 * 24 * 3600 * 1000  # what the store applied from a replica outlives it this long
FORGET_BATCH = 64  # idle tenants a sync looks at, at most (the rest wait for the next syncs)


class SchedulerLike(Protocol):
    """The part of :class:`vtc.Scheduler` the synchronizer uses (all thread-safe in the core)."""

    def services(self) -> dict[Client, float]: ...  # noqa: D102
    def service(self, client: Client) -> float: ...  # noqa: D102
    def counter(self, client: Client) -> float: ...  # noqa: D102
    def raise_counter(self, client: Client, value: float) -> None: ...  # noqa: D102
    def raise_counters(self, counters: dict[Client, float]) -> int: ...  # noqa: D102
    def forget_idle(self) -> int: ...  # noqa: D102
    def status(self, request_id: int) -> str | None: ...  # noqa: D102
    def submit(  # noqa: D102
        self, request_id: int, client: Client, prompt_len: int, cached_len: int | None = None
    ) -> None: ...


def encode(client: Client) -> str:
    """A tenant key as stored: ``i:<int>`` or ``s:<str>`` (ints and strs never collide)."""
    if isinstance(client, bool) or not isinstance(client, (int, str)):
        raise TypeError(f"client must be an int or a str, got {client!r}")
    return f"i:{client}" if isinstance(client, int) else f"s:{client}"


def decode(key: str | bytes) -> Client:
    """The inverse of :func:`encode`."""
    if isinstance(key, bytes):
        key = key.decode("utf-8", "surrogatepass")  # a str key may hold a lone surrogate
    return int(key[2:]) if key.startswith("i:") else key[2:]


def _encode_all(clients: Iterable[Client]) -> list[str]:
    """:func:`encode` of each of ``clients``, in one comprehension: no function call per
    int or str (a sync may push 10,000)."""
    return [
        f"i:{c}" if type(c) is int else f"s:{c}" if type(c) is str else encode(c) for c in clients
    ]


def _decode_all(keys: Iterable[str]) -> list[Client]:
    """:func:`decode` of each of ``keys`` (str, as :func:`encode` made them), in one
    comprehension: no function call per key (a sync may decode 10,000)."""
    return [int(k[2:]) if k[:2] == "i:" else k[2:] for k in keys]


# --------------------------------------------------------------------------- the store protocol
@dataclass
class SyncRequest:
    """One replica's sync: everything the store needs, in one message.

    ``services`` holds the service the replica charged since its last
    *acknowledged* sync ``base`` (``0``: none yet), per tenant; ``seq`` numbers
    the requests of this replica ``incarnation`` (which is also the epoch the
    store adopts if it has none). The store keeps, per replica, what it applied
    since ``base``, so a request whose reply was lost and whose amounts come
    again in the next one is counted exactly once, and a replayed request
    (``seq`` not above the last applied) changes nothing.

    ``add`` and ``remove`` change the replica's waiting set; with ``full`` set,
    ``add`` and ``keep`` together *are* the waiting set, ``remove`` is ignored,
    and ``keep`` lists the tenants that have been waiting here since before the
    last acknowledged sync (a reconciliation does not lift them: their deficit
    is kept), while ``add`` are arrivals (lifted to the global floor).
    ``hints`` (full syncs) are the replica's local counters, used only for a
    tenant the store has no counter of (it lost its data). ``forget_ms``: how
    long a tenant no replica has waiting must go untouched (no charge, no
    leave) before the store may forget its counter. Keys are :func:`encode`\\ d.

    ``since`` (``None``: no delta; the reply holds ``pull`` only): the counter
    version of the last reply this replica acknowledged (``0``: none, send
    all); the reply's ``changed`` then holds the counters of the tenants
    waiting here written since, plus a scrub batch of the waiting set from
    ``cursor`` on (the reply's ``cursor`` goes on from there).
    """

    replica: str
    epoch: str | bytes
    incarnation: str
    seq: int
    base: int
    full: bool
    services: dict[str, float]
    add: list[str]
    remove: list[str]
    pull: list[str]
    liveness_ms: int
    keep: list[str] = field(default_factory=list)
    hints: dict[str, float] = field(default_factory=dict)
    forget_ms: int = 60_000
    since: int | None = None
    cursor: str = "0"
    #: ``services`` as the script's argument, one JSON array ``[key, amount, ...]``
    #: built by the core's ledger (``services`` is then empty): for a store that
    #: says ``takes_json`` (:class:`RedisStore`), so a push of every tenant does not
    #: encode each in Python
    services_json: bytes | None = None
    #: the caller reads the changed counters itself: the reply's ``changed_raw``
    #: holds the script's text (its core ledger parses and applies it), ``changed``
    #: stays empty (a store that does not say ``takes_json`` ignores this)
    raw_reply: bool = False


@dataclass
class SyncReply:
    """The store's answer: ``status`` is ``"ok"``, ``"resync"`` (send the full state)
    or ``"duplicate"`` (a newer live process syncs under this replica id: nothing
    was applied; sync under another id).

    ``counters`` holds one value per pulled tenant, ``None`` for a tenant the
    store has no counter of.  With ``since`` set: ``version``, the store's
    counter version after this sync (the next request's ``since`` once this
    reply is acknowledged), and ``changed`` (see :class:`SyncRequest`).
    """

    status: str
    epoch: str | bytes
    floor: float | None = None
    counters: list[float | None] = field(default_factory=list)
    version: int | None = None
    changed: dict[str, float] = field(default_factory=dict)
    cursor: str = "0"
    #: with :attr:`SyncRequest.raw_reply`: ``changed`` as the script sent it, the
    #: JSON array of keys and the values comma-separated
    changed_raw: tuple[bytes, bytes] | None = None


class Store(Protocol):
    """Where the global counters live: :class:`RedisStore` or its twin :class:`LocalStore`."""

    def sync(self, req: SyncRequest) -> SyncReply: ...  # noqa: D102
    def counters(self) -> dict[Client, float]: ...  # noqa: D102
    def backlog(self) -> dict[Client, float]: ...  # noqa: D102


def stored_number(raw: Any) -> float | None:
    """A stored counter as a float, or ``None`` unless it is one: finite, in ``[0, MAX_COUNTER]``.

    Anything else (``abc``, ``nan``, ``inf``, ``1e300``, bytes that are not
    text) is what a corrupt or hostile store holds; it is never used.
    """
    if raw is None or raw == b"" or raw == "":
        return None
    try:
        x = float(raw)
    except (TypeError, ValueError):
        return None
    return x if 0.0 <= x <= MAX_COUNTER else None  # False for nan


# The whole sync, atomically, in one round trip.  ARGV: prefix, replica, known epoch,
# incarnation, full, liveness_ms, keep_ms, seq, base, MAX_COUNTER, the glob pattern of the
# namespace's keys (escaped: dropped when one holds the wrong type), forget_ms,
# FORGET_BATCH, then six lists, each
# one JSON array of strings: services (tenant, amount, ...), hints (tenant, value, ...),
# adds, keeps, removes, pulls.  The reply: 'ok', the epoch, the floor, and the pulled
# counters as one string, comma-separated ('' for none).  One argument per list and one
# string back, not one per tenant: the client library's per-element work (packing,
# parsing) was most of a sync's CPU time in Python (bench/README.md, "Sync cost").
#
# A stored value is used only if it is a number in [0, MAX_COUNTER]: a counter that is not
# (corrupt, or written by someone else) is replaced by the global floor (where a returning
# tenant goes: it neither starves nor banks), a backlog score that is not is re-scored
# from the counter, a lastleft that is not is ignored.
#
# Forgetting (`idle`: the tenants with a counter that no replica has waiting, by the time
# they were last touched; `forgot`: the largest counter forgotten).  The global floor does
# not go down while replicas sync (arrivals join at it or above, counters only grow, and
# when the backlog empties the floor is the counter of the last to leave, which was at it
# or above); so a tenant whose counter is at most the floor, and that nobody has waiting,
# returns to exactly the floor: its counter decides nothing and may go.  `forget_ms`
# without a touch keeps the tenants with requests still running (charged at every sync)
# out of it.  A tenant with no counter then counts from `forgot`, never from 0: service
# pushed for it, a reconciliation that keeps it waiting, or a hint, never start below
# what any forgotten counter was (so forgetting cannot hand a tenant a deficit it never
# had).  Only a reconciliation after a fault lowers the floor (a tenant kept at its
# deficit): the forgotten counters were then at most the floor before, which is the
# error a data loss makes for every tenant anyway.
SYNC_LUA = r"""
local P, rid, known, inc = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local full = ARGV[5] == '1'
local live, keep = tonumber(ARGV[6]), tonumber(ARGV[7])
local seq, base = tonumber(ARGV[8]), tonumber(ARGV[9])
local MAXV = tonumber(ARGV[10])
local forget, batch = tonumber(ARGV[12]), tonumber(ARGV[13])
local PUSH_BATCH = 1000  -- tenants per batched command (well inside unpack's stack limit)
local CNT, BL, REFS = P .. 'counter', P .. 'backlog', P .. 'refs'
local IDLE, FORGOT = P .. 'idle', P .. 'forgot'
local LAST, REPS = P .. 'lastleft', P .. 'replicas'
local W, S = P .. 'w:' .. rid, P .. 's:' .. rid
local OWN, GONE = P .. 'owner', P .. 'gone:' .. rid
local VER, CV, VREPS, LEGACY = P .. 'ver', P .. 'cv', P .. 'vreps', P .. 'legacy'
local since = tonumber(ARGV[20] or '')  -- nil: no delta (pull only `pulls`)
local function fmt(x) return string.format('%.17g', x) end
local function num(s)
  if type(s) ~= 'string' then return nil end
  local x = tonumber(s)
  if x == nil or x ~= x or x < 0 or x > MAXV then return nil end
  return x
end

-- a key that holds another type (a hand edit, another program) would fail every call of
-- every replica with WRONGTYPE.  Losing that key alone would leave the others inconsistent
-- (a waiting set without its refs), so the whole namespace is dropped, as by a Redis that
-- lost its data: a new epoch, to which every replica reconciles (deficits kept).
local function wrong_type(k, t)
  local got = redis.call('TYPE', k)['ok']
  if got == 'none' or got == t then return false end
  redis.log(redis.LOG_WARNING, 'vtc: ' .. k .. ' held a ' .. got .. ', not a ' .. t ..
            '; the namespace starts a new epoch')
  return true
end
local function reset_namespace()
  local ks = redis.call('KEYS', ARGV[11])
  for k = 1, #ks, 512 do redis.call('DEL', unpack(ks, k, math.min(k + 511, #ks))) end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local corrupt = false
for _, kt in ipairs({{P .. 'epoch', 'string'}, {CNT, 'hash'}, {BL, 'zset'}, {REFS, 'hash'},
                     {LAST, 'string'}, {REPS, 'zset'}, {W, 'set'}, {S, 'hash'},
                     {OWN, 'hash'}, {GONE, 'set'}, {IDLE, 'zset'}, {FORGOT, 'string'},
                     {VER, 'string'}, {CV, 'zset'}, {VREPS, 'zset'}, {LEGACY, 'string'}}) do
  corrupt = corrupt or wrong_type(kt[1], kt[2])
end
if not corrupt then  -- the waiting sets about to be reaped
  for _, d in ipairs(redis.call('ZRANGEBYSCORE', REPS, '-inf', now - live)) do
    corrupt = corrupt or wrong_type(P .. 'w:' .. d, 'set')
  end
end
if corrupt then reset_namespace() end

local epoch = redis.call('GET', P .. 'epoch')
if not epoch then
  epoch = inc
  redis.call('SET', P .. 'epoch', epoch)
end

-- one live process per replica id: the incarnation that synced last under an id owns it;
-- a newer one takes it over (a restart) with a full sync, and the incarnations it displaced
-- are refused from then on (two live processes with one id: the older one must rename)
local owner = redis.call('HGET', OWN, rid)
if owner ~= inc then
  if redis.call('SISMEMBER', GONE, inc) == 1 then return {'duplicate', epoch} end
  if not full then return {'resync', epoch} end
  if owner then
    redis.call('SADD', GONE, owner)
    if keep > 0 then redis.call('PEXPIRE', GONE, keep) end
  end
  redis.call('HSET', OWN, rid, inc)
end
if not full and (epoch ~= known or not redis.call('ZSCORE', REPS, rid)) then
  return {'resync', epoch}
end

-- versions: every counter write of one run of this script is numbered `ver + 1` in CV
-- (tenant -> version of its last write), so a replica that acknowledged version v asks
-- for the counters written since.  A version key that is missing or no integer (a hand
-- edit; a namespace started by replicas without versions) restarts from the newest
-- version in CV: a replica whose version is above it gets everything (below).
local function int(s)
  local x = tonumber(s)
  if x == nil or x ~= x or x < 0 or x > 2^52 or x ~= math.floor(x) then return nil end
  return x
end
local ver = int(redis.call('GET', VER))
if not ver then
  local top = redis.call('ZREVRANGEBYSCORE', CV, 2^52, 0, 'WITHSCORES', 'LIMIT', 0, 1)
  ver = (#top > 0 and int(top[2])) or 0
  redis.call('SET', VER, ver)
end
local ver0, wver = ver, nil
local function bump()
  if not wver then
    ver = ver + 1
    wver = ver
    redis.call('SET', VER, ver)
  end
  return wver
end

local function refnum(raw)
  local r = tonumber(raw or '0')
  if r == nil or r ~= r or r < 0 then return 0 end
  return math.floor(r)
end
local function refs(c) return refnum(redis.call('HGET', REFS, c)) end
local function floor_value()
  for _ = 1, 16 do
    local low = redis.call('ZRANGE', BL, 0, 0, 'WITHSCORES')
    if #low == 0 then return num(redis.call('GET', LAST)) end
    local x = num(low[2])
    if x then return x end
    local g = num(redis.call('HGET', CNT, low[1]))
    if g then redis.call('ZADD', BL, fmt(g), low[1]) else redis.call('ZREM', BL, low[1]) end
  end
  return nil
end
-- G: the counters this run of the script wrote (every write goes through `write` or the
-- batched push, and a forgotten one is dropped), so reading them back costs no call
local G, GS = {}, {}  -- and their stored text
local function write(c, g)
  local gs = fmt(g)
  G[c], GS[c] = g, gs
  redis.call('HSET', CNT, c, gs)
  redis.call('ZADD', CV, bump(), c)
  if refs(c) > 0 then redis.call('ZADD', BL, gs, c) else redis.call('ZADD', IDLE, now, c) end
end
-- a tenant's counter: nil if it has none; a corrupt one is replaced by the floor
local function read(c)
  if G[c] then return G[c] end
  local raw = redis.call('HGET', CNT, c)
  if not raw then return nil end
  local x = num(raw)
  if x then return x end
  redis.call('HDEL', CNT, c)
  x = floor_value() or 0
  redis.log(redis.LOG_WARNING, 'vtc: counter of ' .. c .. ' was no number; set to the floor')
  write(c, x)
  return x
end
local function leave(c)
  local r = refs(c) - 1
  if r <= 0 then
    redis.call('HDEL', REFS, c)
    redis.call('ZREM', BL, c)
    local g = read(c)
    if g then
      redis.call('SET', LAST, fmt(g))
      redis.call('ZADD', IDLE, now, c)
    end
  else
    redis.call('HSET', REFS, c, r)
  end
end
local function join(c)
  local r = refs(c) + 1
  redis.call('HSET', REFS, c, r)
  if r == 1 then redis.call('ZREM', IDLE, c) end
  return r == 1
end

-- liveness, and the reaping of replicas that stopped syncing.  VREPS holds the replicas
-- that version their writes; one in REPS but not in VREPS (an older vtc) writes counters
-- without versions, so while one is live, and for every replica that last acknowledged a
-- version from before it was reaped (LEGACY), the pull is a full one (below)
local legacy = false
for _, d in ipairs(redis.call('ZRANGEBYSCORE', REPS, '-inf', now - live)) do
  if d ~= rid then
    if not redis.call('ZSCORE', VREPS, d) then legacy = true end
    redis.call('ZREM', VREPS, d)
    local members = redis.call('SMEMBERS', P .. 'w:' .. d)
    table.sort(members)
    for _, c in ipairs(members) do leave(c) end
    redis.call('DEL', P .. 'w:' .. d)
    redis.call('ZREM', REPS, d)
    redis.call('HDEL', OWN, d)
  end
end
redis.call('ZADD', REPS, now, rid)
redis.call('ZADD', VREPS, now, rid)
redis.call('ZREMRANGEBYSCORE', VREPS, '-inf', now - live)  -- reaped by an older vtc
if not legacy then
  for _, d in ipairs(redis.call('ZRANGE', REPS, 0, -1)) do
    if not redis.call('ZSCORE', VREPS, d) then legacy = true; break end
  end
end
if legacy then redis.call('SET', LEGACY, bump()) end

-- forgetting (the comment above SYNC_LUA): idle tenants untouched for `forget` ms, a batch
local forgot = num(redis.call('GET', FORGOT)) or 0
local fl0 = floor_value()
if fl0 then
  local was = forgot
  for _, c in ipairs(redis.call('ZRANGEBYSCORE', IDLE, '-inf', now - forget, 'LIMIT', 0, batch)) do
    local g = num(redis.call('HGET', CNT, c))
    if g and refs(c) == 0 and g > fl0 then
      redis.call('ZADD', IDLE, now, c)  -- above the floor: looked at again later
    else
      redis.call('ZREM', IDLE, c)
      if g and refs(c) == 0 then
        redis.call('HDEL', CNT, c)
        redis.call('ZREM', CV, c)
        G[c], GS[c] = nil, nil
        if g > forgot then forgot = g end
      end
    end
  end
  if forgot > was then redis.call('SET', FORGOT, fmt(forgot)) end
end

-- what was applied from this replica since its last acknowledged sync
local replay = false
local rseq, rbase = num(redis.call('HGET', S, '#seq')), num(redis.call('HGET', S, '#base'))
if redis.call('HGET', S, '#inc') ~= inc or not rseq or not rbase then
  redis.call('DEL', S)         -- a new incarnation, or no record (lost, expired)
elseif seq <= rseq then
  replay = true                -- this request was applied already
elseif base >= rseq then
  redis.call('DEL', S)         -- the replica saw the reply to everything applied
end

local i = 14
local function list()
  local out = cjson.decode(ARGV[i]); i = i + 1
  return out
end
local svc = list()
local hv = list()
local hint = {}
for k = 1, #hv, 2 do hint[hv[k]] = num(hv[k + 1]) end
local adds, keeps, rems, pulls = list(), list(), list(), list()
local cursor = ARGV[21] or '0'

if not replay then
  -- push: service since `base`; only the increase over what was applied since counts.
  -- Batched: per PUSH_BATCH tenants, three reads (what was applied, the counters, the
  -- refs) and one write per key (counters, versions, backlog scores, idle times, what
  -- was applied), not ~7 calls per tenant; the same writes as `write` does one by one
  -- (a counter that is no number is first replaced by the floor, by `read`)
  for k0 = 1, #svc, 2 * PUSH_BATCH do
    local cs, amts = {}, {}
    for k = k0, math.min(k0 + 2 * PUSH_BATCH - 1, #svc), 2 do
      cs[#cs + 1] = svc[k]
      amts[#amts + 1] = svc[k + 1]
    end
    local olds = redis.call('HMGET', S, unpack(cs))
    local raws = redis.call('HMGET', CNT, unpack(cs))
    local rfs = redis.call('HMGET', REFS, unpack(cs))
    local cw, vw, bw, iw, sw = {}, {}, {}, {}, {}
    for j, c in ipairs(cs) do
      local amt = tonumber(amts[j])
      local old = num(olds[j]) or 0
      if amt > old then
        local g = G[c]
        if g == nil and raws[j] then g = num(raws[j]) or read(c) end
        if g then g = g + (amt - old) else g = math.max(hint[c] or 0, forgot + amt - old) end
        g = math.min(g, MAXV)
        local gs = fmt(g)
        G[c], GS[c] = g, gs
        cw[#cw + 1] = c; cw[#cw + 1] = gs
        vw[#vw + 1] = bump(); vw[#vw + 1] = c
        if refnum(rfs[j]) > 0 then
          bw[#bw + 1] = gs; bw[#bw + 1] = c
        else
          iw[#iw + 1] = now; iw[#iw + 1] = c
        end
        sw[#sw + 1] = c; sw[#sw + 1] = amts[j]
      end
    end
    if #cw > 0 then
      redis.call('HSET', CNT, unpack(cw))
      redis.call('ZADD', CV, unpack(vw))
      if #bw > 0 then redis.call('ZADD', BL, unpack(bw)) end
      if #iw > 0 then redis.call('ZADD', IDLE, unpack(iw)) end
      redis.call('HSET', S, unpack(sw))
    end
  end
  redis.call('HSET', S, '#inc', inc, '#seq', seq, '#base', base)
  if keep > 0 then redis.call('PEXPIRE', S, keep) end
  for c, v in pairs(hint) do
    if v and redis.call('HEXISTS', CNT, c) == 0 then write(c, math.max(v, forgot)) end
  end

  -- the waiting set of this replica: leavers first, then the tenants waiting here all
  -- along (a reconciliation: not lifted), then arrivals (lifted to the floor)
  if full then
    local want = {}
    for _, c in ipairs(adds) do want[c] = true end
    for _, c in ipairs(keeps) do want[c] = true end
    rems = {}
    for _, c in ipairs(redis.call('SMEMBERS', W)) do
      if not want[c] then rems[#rems + 1] = c end
    end
    table.sort(rems)
  end
  for _, c in ipairs(rems) do
    if redis.call('SREM', W, c) == 1 then leave(c) end
  end
  for _, c in ipairs(keeps) do
    if redis.call('SADD', W, c) == 1 and join(c) then
      local g = read(c) or forgot
      write(c, g)
    end
  end
  -- tenants arriving in one sync are lifted to the floor of those already backlogged,
  -- not to each other's counters (they became backlogged concurrently)
  local f = floor_value()
  for _, c in ipairs(adds) do
    if redis.call('SADD', W, c) == 1 and join(c) then
      local g = read(c) or forgot
      if f and f > g then g = f end
      write(c, g)
    end
  end
end

-- pull
local fl = floor_value()
local vals = {}
for _, c in ipairs(pulls) do
  local g = read(c)
  vals[#vals + 1] = g and fmt(g) or ''
end
if not since then return {'ok', epoch, fl and fmt(fl) or '', table.concat(vals, ',')} end

-- the counters of the tenants waiting here written since version `since`: all of them
-- when `since` is 0 (a full sync), above what the store ever numbered (the version
-- key was lost) or older than an unversioned writer's last sight (LEGACY); otherwise
-- the changed ones, from CV or W, whichever is smaller.  Plus a scrub: a batch of W
-- from `cursor` on, re-read every sync (a value edited in place, which no version
-- records, is repaired and re-sent within |W| / batch syncs)
local out = {}
local function emit(c)
  if out[c] == nil then
    local g = GS[c] or read(c)
    out[c] = GS[c] or (g and fmt(g)) or false
  end
end
local lmark = int(redis.call('GET', LEGACY)) or 0
if since == 0 or since > ver0 or since < lmark or legacy then
  for _, c in ipairs(redis.call('SMEMBERS', W)) do emit(c) end
elseif redis.call('ZCOUNT', CV, '(' .. since, '+inf') >= redis.call('SCARD', W) then
  for _, c in ipairs(redis.call('SMEMBERS', W)) do emit(c) end
else
  for _, c in ipairs(redis.call('ZRANGEBYSCORE', CV, '(' .. since, '+inf')) do
    if redis.call('SISMEMBER', W, c) == 1 then emit(c) end
  end
end
for _, c in ipairs(adds) do  -- arrivals joining a tenant backlogged elsewhere: no write
  if redis.call('SISMEMBER', W, c) == 1 then emit(c) end
end
local sc = redis.call('SSCAN', W, cursor, 'COUNT', 16)
for _, c in ipairs(sc[2]) do emit(c) end
local ck, cvals = {}, {}
for c, g in pairs(out) do
  if g then
    ck[#ck + 1] = c
    cvals[#cvals + 1] = g
  end
end
fl = floor_value()
return {'ok', epoch, fl and fmt(fl) or '', table.concat(vals, ','), tostring(ver),
        cjson.encode(ck), table.concat(cvals, ','), sc[1]}
"""


def _json_list(items: Sequence[str]) -> bytes:
    """``items`` as one script argument: a JSON array of strings, UTF-8 (``cjson`` in Lua;
    a lone surrogate in a tenant's name goes as its three bytes, as the core keeps it)."""
    return json.dumps(items, ensure_ascii=False, separators=(",", ":")).encode(
        "utf-8", "surrogatepass"
    )


def _text(raw: bytes) -> str:
    """The tenant keys the script sent back, as text: a lone surrogate's three bytes (a
    name the core keeps) decode to it; bytes that are no text at all (a corrupt store)
    to U+FFFD, never an error."""
    try:
        return raw.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        return raw.decode("utf-8", "replace")


def _stored_numbers(raws: Sequence[bytes]) -> list[float | None]:
    """:func:`stored_number` of each of ``raws``: one C-level pass when all are counters."""
    try:
        xs = list(map(float, raws))
    except ValueError:
        return [stored_number(x) for x in raws]
    total = sum(xs)
    if xs and not (total == total and 0.0 <= min(xs) and max(xs) <= MAX_COUNTER):
        return [stored_number(x) for x in raws]  # a nan (total is nan), inf or out of range
    return xs


def _resp_size(items: Sequence[Any]) -> int:
    """Bytes of ``items`` as a RESP array of bulk strings (what goes over the wire)."""
    size = len(f"*{len(items)}\r\n")
    for x in items:
        n = len(x) if isinstance(x, bytes) else len(str(x).encode("utf-8", "surrogatepass"))
        size += len(f"${n}\r\n") + n + 2
    return size


def check_namespace(namespace: str) -> str:
    """``namespace`` if it can name a namespace: a non-empty str of at most 256 characters
    without ``{`` or ``}`` (so no namespace's keys can start with another's prefix)."""
    if (
        not isinstance(namespace, str)
        or not 0 < len(namespace) <= 256
        or "{" in namespace
        or "}" in namespace
    ):
        raise ValueError(
            f"namespace must be a non-empty str of at most 256 characters without '{{' or "
            f"'}}', got {namespace!r}"
        )
    return namespace


def glob_escape(text: str) -> str:
    """``text`` as a Redis MATCH pattern that matches exactly ``text`` (every non-alphanumeric
    character escaped: ``*``, ``?``, ``[``, ``]``, ``\\`` and ``^`` lose their meaning)."""
    return "".join(ch if ch.isalnum() else "\\" + ch for ch in text)


class RedisStore:
    """The global counters in Redis, under the key prefix ``vtc:{<namespace>}:``.

    All keys of a namespace share one hash tag, so several deployments can
    share a Redis (one namespace each; see :func:`check_namespace`).  Keys:
    ``epoch``; ``counter`` (hash: tenant -> global counter); ``backlog``
    (sorted set of the globally backlogged tenants by counter); ``refs``
    (hash: tenant -> replicas it waits on); ``lastleft``; ``replicas`` (sorted
    set by last sync, ms); ``w:<replica>`` (set: tenants waiting there);
    ``s:<replica>`` (hash: what the store applied from that replica since its
    last acknowledged sync, and ``#inc``/``#seq``/``#base``); ``owner`` (hash:
    replica -> the incarnation that owns the id); ``gone:<replica>`` (set: the
    incarnations a newer one displaced, refused if they sync again); ``idle``
    (sorted set: tenants with a counter that no replica has waiting, by when
    last touched, ms) and ``forgot`` (the largest counter forgotten; a tenant
    without a counter counts from it); ``ver`` (the counter version: one per
    sync that writes a counter), ``cv`` (sorted set: tenant -> version of its
    counter's last write), ``vreps`` (sorted set: the replicas that version
    their writes, by last sync) and ``legacy`` (the version of the last sync
    that saw a replica that does not: an older vtc).
    ``bytes_out``/``bytes_in`` count the RESP bytes of every sync.
    """

    #: takes :attr:`SyncRequest.services_json` (a wrapper that does not say so gets
    #: ``services``)
    takes_json = True

    def __init__(self, client: redis.Redis, namespace: str = "default", keep_ms: int = KEEP_MS):
        self.client = client
        self.namespace = check_namespace(namespace)
        self.prefix = f"vtc:{{{namespace}}}:"
        self.keep_ms = keep_ms
        self._pattern = glob_escape(self.prefix) + "*"  # every key of this namespace
        self._script = client.register_script(SYNC_LUA)
        self.bytes_out = 0
        self.bytes_in = 0

    @classmethod
    def from_url(
        cls, url: str, namespace: str = "default", timeout_ms: float = 100.0
    ) -> RedisStore:
        """A store on ``url`` whose calls fail fast (no retries, ``timeout_ms`` socket timeouts)."""
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        import redis

        check_namespace(namespace)
        client = redis.Redis.from_url(
            url,
            socket_timeout=timeout_ms / 1000,
            socket_connect_timeout=timeout_ms / 1000,
            retry=Retry(NoBackoff(), 0),
            retry_on_timeout=False,
        )
        return cls(client, namespace)

    def sync(self, req: SyncRequest) -> SyncReply:
        """Run the sync script (EVALSHA, loading it again after a Redis restart)."""
        args: list[Any] = [
            self.prefix,
            req.replica,
            req.epoch,
            req.incarnation,
            "1" if req.full else "0",
            req.liveness_ms,
            self.keep_ms,
            req.seq,
            req.base,
            repr(MAX_COUNTER),
            self._pattern,
            req.forget_ms,
            FORGET_BATCH,
        ]
        for pairs in (req.services, req.hints):  # [key, value, key, value, ...], in C
            if pairs is req.services and req.services_json is not None:
                args.append(req.services_json)  # the core's ledger built it
                continue
            flat = chain.from_iterable(zip(pairs, map(repr, map(float, pairs.values()))))
            args.append(_json_list(list(flat)))
        for items in (req.add, req.keep, req.remove, req.pull):
            args.append(_json_list(items))
        if req.since is not None:
            args += [req.since, req.cursor]
        self.bytes_out += _resp_size(["EVALSHA", self._script.sha, 0, *args])
        out = self._script(keys=[], args=args)
        self.bytes_in += _resp_size(out)
        status, epoch = out[0].decode(), out[1]  # the epoch stays bytes: whatever it holds
        if status != "ok":
            return SyncReply(status, epoch)
        want = 4 if req.since is None else 8
        if len(out) != want:
            raise RuntimeError(f"store answered {len(out)} items, not {want}")
        counters = _stored_numbers(out[3].split(b",")) if req.pull else []
        if req.since is None:
            return SyncReply(status, epoch, stored_number(out[2]), counters)
        version = int(out[4])
        cursor = out[7].decode("ascii", "replace")
        if req.raw_reply:  # the caller's ledger reads them (vtc._core.SyncLedger)
            floor = stored_number(out[2])
            raw = (out[5], out[6])
            return SyncReply(status, epoch, floor, counters, version, {}, cursor, raw)
        keys = json.loads(_text(out[5]))  # cjson: {} when empty
        if not keys:
            changed: dict[str, float] = {}
        else:
            values = _stored_numbers(out[6].split(b","))
            if not isinstance(keys, list) or len(keys) != len(values):
                raise RuntimeError(
                    f"store answered {len(values)} changed counters for "
                    f"{len(keys) if isinstance(keys, list) else keys!r} tenants"
                )
            changed = {k: v for k, v in zip(keys, values) if v is not None}
        return SyncReply(status, epoch, stored_number(out[2]), counters, version, changed, cursor)

    def counters(self) -> dict[Client, float]:
        """Every tenant's global counter (a stored value that is no counter is left out)."""
        raw = self.client.hgetall(self.prefix + "counter")
        out = {decode(k): stored_number(v) for k, v in raw.items()}
        return {c: v for c, v in out.items() if v is not None}

    def backlog(self) -> dict[Client, float]:
        """The globally backlogged tenants and their counters."""
        raw = self.client.zrange(self.prefix + "backlog", 0, -1, withscores=True)
        return {decode(k): float(v) for k, v in raw}

    def replicas(self) -> list[str]:
        """Replica incarnations that synced within their liveness window (or not reaped yet)."""
        return [r.decode() for r in self.client.zrange(self.prefix + "replicas", 0, -1)]

    def clear(self) -> None:
        """Delete every key of this namespace (and of no other)."""
        keys = list(self.client.scan_iter(match=self._pattern))
        if keys:
            self.client.delete(*keys)


@dataclass
class _Applied:
    """What :class:`LocalStore` applied from one replica since its last acknowledged sync."""

    inc: str
    seq: int
    base: int
    amounts: dict[str, float] = field(default_factory=dict)


class LocalStore:
    """An in-process twin of :data:`SYNC_LUA` (same semantics), for simulations and unit tests.

    ``clock`` returns milliseconds (default: wall clock); the simulator passes
    its step counter.  It holds only numbers, so it has no corrupt values.
    """

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        self.clock = clock or (lambda: time.time() * 1000)
        self.epoch: str | bytes | None = None
        self.counter: dict[str, float] = {}
        self.bl: dict[str, float] = {}
        self.refs: dict[str, int] = {}
        self.lastleft: float | None = None
        self.seen: dict[str, float] = {}
        self.waiting: dict[str, set[str]] = {}
        self.applied: dict[str, _Applied] = {}
        self.owner: dict[str, str] = {}
        self.gone: dict[str, set[str]] = {}
        self.idle: dict[str, float] = {}  # tenants nobody has waiting -> last touched
        self.forgot = 0.0  # the largest counter forgotten
        self.ver = 0  # the counter version: one per sync that writes a counter
        self.cv: dict[str, int] = {}  # tenant -> version of its counter's last write
        self._wver: int | None = None
        self._now = 0.0

    def _floor(self) -> float | None:
        if self.bl:
            return min(self.bl.values())
        return self.lastleft

    def _write(self, c: str, g: float) -> None:
        self.counter[c] = g
        if self._wver is None:
            self.ver += 1
            self._wver = self.ver
        self.cv[c] = self._wver
        if self.refs.get(c, 0) > 0:
            self.bl[c] = g
        else:
            self.idle[c] = self._now

    def _leave(self, c: str) -> None:
        self.refs[c] = self.refs.get(c, 0) - 1
        if self.refs[c] <= 0:
            del self.refs[c]
            self.bl.pop(c, None)
            if c in self.counter:
                self.lastleft = self.counter[c]
                self.idle[c] = self._now

    def _join(self, c: str) -> bool:
        self.refs[c] = self.refs.get(c, 0) + 1
        if self.refs[c] == 1:
            self.idle.pop(c, None)
        return self.refs[c] == 1

    def _forget(self, now: float, forget_ms: float) -> None:
        """Forget the counters of idle tenants untouched for ``forget_ms``, at most
        the floor (the comment above :data:`SYNC_LUA`), a batch at a time."""
        floor = self._floor()
        if floor is None:
            return
        due = sorted((t, c) for c, t in self.idle.items() if t <= now - forget_ms)
        for _, c in due[:FORGET_BATCH]:
            g = self.counter.get(c)
            idle = self.refs.get(c, 0) == 0
            if g is not None and idle and g > floor:
                self.idle[c] = now  # above the floor: looked at again later
                continue
            del self.idle[c]
            if g is not None and idle:
                del self.counter[c]
                self.cv.pop(c, None)
                self.forgot = max(self.forgot, g)

    def sync(self, req: SyncRequest) -> SyncReply:
        """What the Lua script does, step by step."""
        if self.epoch is None:
            self.epoch = req.incarnation
        owner = self.owner.get(req.replica)
        if owner != req.incarnation:
            if req.incarnation in self.gone.get(req.replica, ()):
                return SyncReply("duplicate", self.epoch)
            if not req.full:
                return SyncReply("resync", self.epoch)
            if owner is not None:
                self.gone.setdefault(req.replica, set()).add(owner)
            self.owner[req.replica] = req.incarnation
        if not req.full and (self.epoch != req.epoch or req.replica not in self.seen):
            return SyncReply("resync", self.epoch)
        now = self._now = self.clock()
        self._wver, ver0 = None, self.ver
        for d in sorted(r for r, s in self.seen.items() if s <= now - req.liveness_ms):
            if d != req.replica:
                for c in sorted(self.waiting.pop(d, set())):
                    self._leave(c)
                del self.seen[d]
                self.owner.pop(d, None)
        self.seen[req.replica] = now
        self._forget(now, req.forget_ms)
        rec = self.applied.get(req.replica)
        replay = False
        if rec is None or rec.inc != req.incarnation:
            rec = None
        elif req.seq <= rec.seq:
            replay = True
        elif req.base >= rec.seq:
            rec = None
        if not replay:
            if rec is None:
                rec = _Applied(req.incarnation, req.seq, req.base)
            rec.seq, rec.base = req.seq, req.base
            self.applied[req.replica] = rec
            for c, amt in req.services.items():
                old = rec.amounts.get(c, 0.0)
                if amt > old:
                    g = self.counter.get(c)
                    if g is None:
                        g = max(req.hints.get(c, 0.0), self.forgot + amt - old)
                    else:
                        g += amt - old
                    self._write(c, min(g, MAX_COUNTER))
                    rec.amounts[c] = amt
            for c, v in req.hints.items():
                if c not in self.counter:
                    self._write(c, max(v, self.forgot))
            mine = self.waiting.setdefault(req.replica, set())
            if req.full:
                rems = sorted(mine - set(req.add) - set(req.keep))
            else:
                rems = req.remove
            for c in rems:
                if c in mine:
                    mine.discard(c)
                    self._leave(c)
            for c in req.keep:
                if c not in mine:
                    mine.add(c)
                    if self._join(c):
                        self._write(c, self.counter.get(c, self.forgot))
            f = self._floor()
            for c in req.add:
                if c not in mine:
                    mine.add(c)
                    if self._join(c):
                        g = self.counter.get(c, self.forgot)
                        if f is not None and f > g:
                            g = f
                        self._write(c, g)
        pulled = [self.counter.get(c) for c in req.pull]
        if req.since is None:
            return SyncReply("ok", self.epoch, self._floor(), pulled)
        mine = self.waiting.get(req.replica, set())
        since = req.since
        full = since == 0 or since > ver0
        arrived = set(req.add)
        changed = {
            c: self.counter[c]
            for c in mine
            if c in self.counter and (full or c in arrived or self.cv.get(c, 0) > since)
        }
        return SyncReply("ok", self.epoch, self._floor(), pulled, self.ver, changed)

    def counters(self) -> dict[Client, float]:
        """Every tenant's global counter."""
        return {decode(k): v for k, v in self.counter.items()}

    def backlog(self) -> dict[Client, float]:
        """The globally backlogged tenants and their counters."""
        return {decode(k): v for k, v in self.bl.items()}


# --------------------------------------------------------------------------- the synchronizer
@dataclass
class SyncStats:
    """What a :class:`SharedCounters` did: syncs, round trips, failures, degraded state.

    ``skipped``: pulled values that were no counter (left unused). ``renamed``:
    times the store refused this replica's id as another live process's, so
    that it went on under an id of its own. ``feed_reads``, ``feed_full_reads``,
    ``feed_rows``: reads of the core's change feed, how many of them were full, and
    the tenants they returned (changed and gone): what the syncs read of the core.
    ``cpu_seconds``: the CPU time (``time.thread_time``) of the threads that ran
    :meth:`SharedCounters.sync`, spent in it; in the background it bounds what the
    syncs took from the engine thread (the interpreter lock is held for at most it).
    ``stretched``: pauses of the background thread made longer than its period, so
    that its syncs' CPU stays within ``cpu_share`` of the time.
    """

    syncs: int = 0
    round_trips: int = 0
    failures: int = 0
    resyncs: int = 0
    full_syncs: int = 0
    pushed_tenants: int = 0
    pulled_tenants: int = 0
    skipped: int = 0
    renamed: int = 0
    feed_reads: int = 0
    feed_full_reads: int = 0
    feed_rows: int = 0
    cpu_seconds: float = 0.0
    stretched: int = 0
    last_error: str | None = None


def _unreachable(err: BaseException) -> bool:
    """Whether ``err`` says the store could not be reached (not that it answered wrongly)."""
    try:
        from redis.exceptions import ConnectionError as Refused
        from redis.exceptions import TimeoutError as TimedOut
    except ImportError:  # a store of another kind
        return isinstance(err, OSError)
    return isinstance(err, (OSError, Refused, TimedOut))


class _CoreWaiting:
    """The type of :data:`CORE_WAITING`."""

    def __repr__(self) -> str:
        return "CORE_WAITING"


#: ``waiting=CORE_WAITING`` (``sync``, ``on_step``, ``start``): the tenants with requests
#: waiting in the core (set-aside ones included), followed through its change feed: per
#: sync only the tenants whose counts changed (without the feed: ``active_clients()``)
CORE_WAITING = _CoreWaiting()

Waiting = Union[Iterable[Client], _CoreWaiting, None]


class SharedCounters:
    """Keeps one replica's :class:`vtc.Scheduler` counters global, through a :class:`Store`.

    ``sync_interval``: engine steps between syncs (``on_step``); ``sync_ms``,
    when set, also syncs once that many milliseconds passed (whichever comes
    first).  ``liveness_ms``: a replica that has not synced for that long is
    considered dead and its waiting tenants leave the global backlog.
    ``retry_ms``: after a failure the store is not tried again for that long
    (the scheduler runs as a local VTC meanwhile). ``forget_ms``: the store
    forgets the counter of a tenant no replica has had waiting or charged for
    that long once it is at most the global floor (it would return to the
    floor anyway): the store's memory follows the live tenants.  ``cpu_share``: the
    background thread (:meth:`start`) pauses long enough after each sync that its
    syncs' CPU is at most this share of the time.  ``replica_id`` names this
    replica; it must be unique among live replicas (the default is
    host-pid-random). A restarted replica may keep its id: the store tells
    incarnations apart. Two live ones with one id are told apart too: the
    older is refused at its next sync and renames itself (logged as an error;
    ``stats.renamed``).

    One object serves one scheduler, attached at the first call that passes
    it (or :meth:`attach`): the service that scheduler already holds then (a
    scheduler restored from a snapshot) counts as already in the store, so
    a restart never counts it twice. Service charged since then is pushed as
    it accrues, exactly once, also across :meth:`forget_idle`.
    """

    CORE_WAITING = CORE_WAITING

    def __init__(
        self,
        store: Store,
        *,
        replica_id: str | None = None,
        sync_interval: int = 10,
        sync_ms: float | None = None,
        liveness_ms: int = 10_000,
        retry_ms: float = 1000.0,
        forget_ms: int = 60_000,
        cpu_share: float = DEFAULT_SYNC_CPU_SHARE,
        clock: Callable[[], float] | None = None,
        delta: bool = True,
        feed: bool = True,
    ) -> None:
        if isinstance(sync_interval, bool) or not isinstance(sync_interval, int):
            raise TypeError(f"sync_interval must be an int, got {sync_interval!r}")
        if sync_interval < 1:
            raise ValueError(f"sync_interval must be >= 1, got {sync_interval}")
        self.store = store
        default_id = f"{os.uname().nodename}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.replica_id = replica_id or default_id
        self.sync_interval = sync_interval
        self.sync_ms = sync_ms
        if isinstance(forget_ms, bool) or not isinstance(forget_ms, int) or forget_ms < 0:
            raise ValueError(f"forget_ms must be an int >= 0, got {forget_ms!r}")
        if isinstance(cpu_share, bool) or not isinstance(cpu_share, (int, float)):
            raise TypeError(f"cpu_share must be a number in (0, 1], got {cpu_share!r}")
        if not 0.0 < cpu_share <= 1.0:  # False for nan
            raise ValueError(f"cpu_share must be in (0, 1], got {cpu_share!r}")
        self.cpu_share = float(cpu_share)
        self.liveness_ms = liveness_ms
        self.retry_ms = retry_ms
        self.forget_ms = forget_ms
        self.clock = clock or (lambda: time.monotonic() * 1000)
        self.stats = SyncStats()
        #: pull only the counters written since the last acknowledged sync (False: every
        #: waiting tenant's, as before versions; for replicas sharing a store with an
        #: older vtc nothing needs setting, the store detects them)
        self.delta = delta
        #: read the services (and, with ``waiting=CORE_WAITING``, the waiting set) from
        #: the core's change feed (``Scheduler.changes``, slot
        #: :data:`vtc.config.SYNC_CHANGES_READER`): per sync only the tenants changed
        #: since the last read (False, or a scheduler without ``changes``: every
        #: tenant's service, one ``services()`` call, as before; also for anything not a
        #: ``vtc.Scheduler`` itself, e.g. a wrapper)
        self.feed = feed
        self._feeding = False  # the scheduler has a feed and it is read
        self._fwait: set[Client] = set()  # waiting in the core, per the feed
        self._fdirty: set[Client] = set()  # may be in _fwait xor _acked_wait
        self._fleft: set[Client] = set()  # left the waiting set at a look since the ack
        self._wmode_feed = False  # the last sync took its waiting set from the feed
        self.degraded = False
        self.floor: float | None = None
        self._incarnation = uuid.uuid4().hex
        self._epoch: str | bytes = ""
        self._full = True
        self._seq = 0
        self._acked_seq = 0
        self._scheduler: SchedulerLike | None = None
        #: with the change feed: the core's ledger of the service folded since the last
        #: acknowledged sync, by tenant, and of the tenants waiting at the last read
        #: (``vtc._core.SyncLedger``, on the feed's slot); without: the two dicts below
        self._ledger: SyncLedger | None = None
        self._seen: dict[Client, float] = {}  # the scheduler's service() when last folded
        #: service folded since the last acknowledged sync, by tenant (encoded at the push)
        self._unacked: dict[Client, float] = {}
        self._acked_wait: set[Client] = set()
        self._continuous: set[Client] = set()  # waiting here in every look since that sync
        self._since = 0  # the counter version of the last acknowledged reply (0: none)
        self._cursor = "0"  # where the store's scrub of this replica's waiting set goes on
        self._retry_at: float | None = None
        self._steps = 0
        self._last_sync = self.clock()
        self._queues: dict[Client, deque[int]] = {}
        self._lock = threading.Lock()  # tracking (submit thread) vs sync (engine/background)
        self._sync_lock = threading.RLock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._loop_error_logged = False
        #: an engine's scheduling-pass lock (:meth:`vtc.adapter.Adapter.selecting`), or
        #: None: a sync raises counters only while it can take the lock at once, else
        #: it leaves them to :meth:`apply_deferred`, which the engine calls with the lock
        #: held, so counters pulled in the background never reorder the queue between
        #: the engine's peek and its pop, and a sync never waits for a pass (nor a
        #: pass for a sync's I/O: the lock is never held by a sync during I/O)
        self.guard: Any = None
        self._deferred: dict[Client, float] = {}
        self._defer_lock = threading.Lock()  # no I/O and no other lock taken under it
        #: how an engine integration syncs (``VTC_SYNC_MODE``): "background" or "step"
        self.mode = "background"
        #: seconds each sync attempt took (its round trips), newest last; the metrics
        #: (``vtc_sync_seconds``) take them from the left
        self.durations: deque[float] = deque(maxlen=4096)

    # -- the scheduler it serves ------------------------------------------------------------
    def attach(self, scheduler: SchedulerLike) -> None:
        """Serve ``scheduler``: what it was charged so far counts as already in the store.

        Called by the first method that is passed a scheduler; idempotent.
        Raises ``ValueError`` for a second, different scheduler.
        """
        if self._scheduler is scheduler:
            return
        with self._sync_lock:
            if self._scheduler is None:
                # only a core itself: a wrapper may change what services() says
                self._feeding = self.feed and isinstance(scheduler, Scheduler)
                if self._feeding:
                    # the slot starts again: the first read is full (and its services
                    # are compared with these, so what was charged before counts as in)
                    self._ledger = SyncLedger(SYNC_CHANGES_READER)
                    self._ledger.reset(scheduler)  # type: ignore[arg-type]
                else:
                    self._seen = dict(scheduler.services())
                self._scheduler = scheduler
            elif self._scheduler is not scheduler:
                raise ValueError(
                    "this SharedCounters already serves another scheduler; "
                    "use one SharedCounters per scheduler"
                )

    def _fold(self, scheduler: SchedulerLike) -> Mapping[Client, float]:
        """Move the service charged since the last fold into the unacknowledged amounts.

        With the change feed (:attr:`feed`): the core's ledger reads only the
        tenants changed since the last read (:meth:`_read_feed`); otherwise every
        tenant's service (one core call) compared with the last reading (~65 ns a
        tenant).  The rest of the per-tenant work is only for the tenants whose
        service changed (:meth:`fold_changed`).  Returns every tenant's service at
        the fold (with the feed: nothing, the ledger keeps it).
        """
        if self._feeding:
            self._read_feed(scheduler)
            return {}
        snap = scheduler.services()
        seen = self._seen
        self.fold_changed([(c, v) for c, v in snap.items() if seen.get(c) != v])
        self._seen = snap
        return snap

    def fold_changed(self, changed: Iterable[tuple[Client, float]]) -> None:
        """Fold ``(tenant, service now)`` for the tenants whose service changed.

        The seam for a core call returning the services changed since the last
        read (then :meth:`_fold` need not read every tenant's). A tenant's
        ``service()`` only grows, except when the scheduler forgot it: a
        smaller value then is all new (:meth:`forget_idle` folds first, so no
        service is lost even when the new value has grown past the old one).
        Updates what was seen only for these tenants.
        """
        with self._sync_lock:
            seen, unacked = self._seen, self._unacked
            for c, v in changed:
                d = v - seen.get(c, 0.0)
                seen[c] = v
                if d < 0:
                    d = v
                if d > 0:
                    unacked[c] = unacked.get(c, 0.0) + d

    def _read_feed(self, scheduler: SchedulerLike) -> None:
        """One read of the change feed: fold the services changed, follow the waiting set.

        The core's ledger (``vtc._core.SyncLedger``) folds the service of the tenants
        changed since the last read into their unacknowledged amounts (the rule of
        :meth:`fold_changed`; a tenant forgotten by ``forget_idle`` and back counts
        its new service in full) and returns only the tenants whose waiting state
        changed, so this Python is per change of the waiting set, not per tenant
        charged.  A full read (the first, or after a reset) returns every waiting
        tenant.
        """
        with self._sync_lock:
            ledger = self._ledger
            assert ledger is not None
            full, entered, left, idle, gone, rows = ledger.read(
                scheduler,  # type: ignore[arg-type]
                bool(self._queues),
            )
            fwait, fdirty, fleft = self._fwait, self._fdirty, self._fleft
            self.stats.feed_reads += 1
            self.stats.feed_full_reads += full
            self.stats.feed_rows += rows
            if full:
                now = set(entered)
                fdirty |= now ^ self._acked_wait
                fleft |= self._acked_wait - now
                self._fwait = now
            else:
                for c in left:  # forgotten ones first, as the ledger listed them
                    if c in fwait:
                        fwait.discard(c)
                        fdirty.add(c)
                        fleft.add(c)
                for c in entered:
                    if c not in fwait:
                        fwait.add(c)
                        fdirty.add(c)
            if self._queues:  # tracked requests of tenants with nothing waiting: done
                with self._lock:
                    for c in chain(gone, idle):
                        self._queues.pop(c, None)

    def unsynced(self, scheduler: SchedulerLike, client: Client) -> float:
        """Service of ``client`` charged here that the store has not acknowledged."""
        with self._sync_lock:
            self.attach(scheduler)
            ledger = self._ledger
            if ledger is not None:
                local = scheduler.service(client) - (ledger.seen(client) or 0.0)
                return ledger.unacked_of(client) + max(local, 0.0)
            local = scheduler.service(client) - self._seen.get(client, 0.0)
            return self._unacked.get(client, 0.0) + max(local, 0.0)

    def forget_idle(self, scheduler: SchedulerLike) -> int:
        """``scheduler.forget_idle()`` without losing service the store has not seen yet.

        Integrations call this instead of the scheduler's own: it folds the
        service charged so far first (:meth:`before_forget`), so a tenant
        forgotten and served again is counted in full.
        """
        with self._sync_lock:
            self.before_forget(scheduler)
            n = scheduler.forget_idle()
            if n and self._feeding:
                self._read_feed(scheduler)  # the forgotten come back as gone
            elif n:
                live = scheduler.services()
                self.forgot([c for c in self._seen if c not in live])
            return n

    def before_forget(self, scheduler: SchedulerLike) -> None:
        """The scheduler is about to forget idle tenants: read what it charged them."""
        with self._sync_lock:
            self.attach(scheduler)
            self._fold(scheduler)

    def forgot(self, clients: Iterable[Client]) -> None:
        """The scheduler forgot ``clients``: their service starts again from 0."""
        clients = list(clients)
        with self._sync_lock:
            if self._ledger is not None:
                self._ledger.forget(clients)
            for c in clients:
                self._seen.pop(c, None)
        with self._defer_lock:  # a raise left for the next pass is not for them now
            for c in clients:
                self._deferred.pop(c, None)

    # -- request tracking and the pre-submit lift ---------------------------------------------
    def track(self, request_id: int, client: Client) -> None:
        """Remember that ``request_id`` of ``client`` was submitted (for the waiting set)."""
        with self._lock:
            self._queues.setdefault(client, deque()).append(request_id)

    def lift(self, scheduler: SchedulerLike, client: Client) -> None:
        """Lift ``client`` to the last global floor seen if it has nothing waiting here.

        This is the global form of VTC's lift, applied before the local one
        (which only sees this replica's backlog).  It costs no I/O.
        """
        self.attach(scheduler)
        if self.floor is None:
            return
        with self._lock:
            q = self._queues.get(client)
            idle = not q
        if idle:
            scheduler.raise_counter(client, self.floor)

    def submit(
        self,
        scheduler: SchedulerLike,
        request_id: int,
        client: Client,
        prompt_len: int,
        cached_len: int | None = None,
    ) -> None:
        """``lift`` + ``scheduler.submit`` + ``track``: the one call an integration makes."""
        self.lift(scheduler, client)
        scheduler.submit(request_id, client, prompt_len, cached_len)
        self.track(request_id, client)

    def waiting(self, scheduler: SchedulerLike) -> set[Client]:
        """Tenants with tracked requests still waiting in ``scheduler``.

        Each tenant's tracked ids are dropped from the front while they are no
        longer waiting (admission is FIFO per tenant), so the cost is the
        number of tenants plus the requests admitted since the last call.
        """
        out: set[Client] = set()
        with self._lock:
            for client in list(self._queues):
                q = self._queues[client]
                while q and scheduler.status(q[0]) != "waiting":
                    q.popleft()
                if q:
                    out.add(client)
                else:
                    del self._queues[client]
        return out

    # -- syncing ------------------------------------------------------------------------------
    def on_step(
        self,
        scheduler: SchedulerLike,
        waiting: Waiting | Callable[[], Iterable[Client]] = None,
    ) -> bool:
        """Call once per engine step; syncs when ``sync_interval`` steps (or ``sync_ms``) passed.

        ``waiting`` as for :meth:`sync`, or a function returning it, called only
        when a sync is due (the steps in between then cost no per-tenant work).
        Returns whether a sync succeeded in this call.  Never raises a store error.
        """
        self._steps += 1
        due = self._steps >= self.sync_interval
        if not due and self.sync_ms is not None:
            due = self.clock() - self._last_sync >= self.sync_ms
        if not due:
            return False
        self._steps = 0
        self._last_sync = self.clock()
        if callable(waiting):
            waiting = waiting()
        return self.sync(scheduler, waiting)

    def sync(self, scheduler: SchedulerLike, waiting: Waiting = None) -> bool:
        """One push + pull round trip now (two if the store asks for a full resync).

        ``waiting`` overrides the tracked waiting set (an engine that knows its
        queues can pass the tenants it has waiting).  On a store error, or a
        reply that is not what the store sends, the scheduler is left as it is
        (a local VTC) and ``False`` is returned: this never raises for
        anything the store holds or answers.

        The per-tenant Python work follows the changes, not the waiting
        tenants: arrivals and departures (set differences, in C), the tenants
        whose service changed (:meth:`_fold`) and the counters the store
        returns (those written since the version acknowledged last, plus a
        small scrub batch).  A sync after any fault, or the first, is full.
        With the change feed and ``waiting=CORE_WAITING`` none of it reads
        every tenant: the services and waiting counts come from the tenants
        changed since the last read (:meth:`_read_feed`).
        """
        with self._sync_lock:
            cpu = time.thread_time()
            try:
                return self._sync_locked(scheduler, waiting)
            finally:
                self.stats.cpu_seconds += time.thread_time() - cpu

    def _sync_locked(self, scheduler: SchedulerLike, waiting: Waiting) -> bool:
        """:meth:`sync`, with ``_sync_lock`` held."""
        self.attach(scheduler)
        now = self.clock()
        feed_wait = isinstance(waiting, _CoreWaiting)
        if feed_wait and not self._feeding:
            waiting = [c for c, (w, _) in scheduler.active_clients().items() if w]  # type: ignore[attr-defined]
            feed_wait = False
        if self._feeding:
            snap = self._fold(scheduler)  # every look reads the feed (the waiting set)
        if feed_wait != self._wmode_feed:  # the waiting set's source changed
            if feed_wait:
                self._fdirty = self._fwait ^ self._acked_wait
                self._fleft = self._acked_wait - self._continuous
            else:
                self._continuous = self._acked_wait - self._fleft
            self._wmode_feed = feed_wait
        if feed_wait:
            wait = self._fwait  # kept by the feed reads; not changed until the next
        else:
            wait = set(waiting) if waiting is not None else self.waiting(scheduler)  # type: ignore[arg-type]
            self._continuous &= wait
        if self._retry_at is not None and now < self._retry_at:
            return False
        if not self._feeding:
            snap = self._fold(scheduler)
        began = time.perf_counter()
        try:
            reply, pull = self._round_trip(scheduler, wait, feed_wait)
            for _ in range(2):  # at most: refused as a duplicate, then a resync
                if reply.status == "duplicate":
                    self._rename()
                elif reply.status == "resync":
                    self.stats.resyncs += 1
                    self._full = True
                else:
                    break
                reply, pull = self._round_trip(scheduler, wait, feed_wait)
            if reply.status != "ok":
                raise RuntimeError(f"store answered {reply.status!r} to a full sync")
            if len(reply.counters) != len(pull):
                raise RuntimeError(
                    f"store answered {len(reply.counters)} counters for {len(pull)} pulled"
                )
            if self.delta and (
                isinstance(reply.version, bool)
                or not isinstance(reply.version, int)
                or reply.version < 0
            ):
                raise RuntimeError(f"store answered version {reply.version!r}")
            pulled = 0
            if self._ledger is not None:  # this reply's counters, or none (read here:
                # one that cannot be read is a store fault, before anything is acked)
                pulled = self._ledger.take_changed(*(reply.changed_raw or (b"{}", b"")))[0]
        except Exception as e:  # noqa: BLE001 - any store fault means: schedule locally
            self.durations.append(time.perf_counter() - began)
            self._fail(now, e)
            return False
        self.durations.append(time.perf_counter() - began)
        if self.degraded:
            log.warning("vtc: shared counters reachable again; state reconciled")
        self.degraded = False
        self._retry_at = None
        self._epoch = reply.epoch
        self._full = False
        self._acked_seq = self._seq
        if self._ledger is not None:
            self._ledger.acknowledge()
        self._unacked = {}
        if feed_wait:  # the acknowledged set follows the changes only
            acked, fwait = self._acked_wait, self._fwait
            for c in self._fdirty:
                if c in fwait:
                    acked.add(c)
                else:
                    acked.discard(c)
            self._fdirty.clear()
            self._fleft.clear()
        else:
            self._acked_wait = wait
            self._continuous = set(wait)
        self._since = reply.version or 0
        self._cursor = reply.cursor
        self.floor = reply.floor
        self.stats.syncs += 1
        got = dict(reply.changed)
        for key, g in zip(pull, reply.counters):
            if g is not None:
                got[key] = g
        self.stats.pulled_tenants += len(got) + pulled
        self._raise(scheduler, snap, got)
        return True

    def _raise(
        self, scheduler: SchedulerLike, snap: Mapping[Client, float], got: dict[str, float]
    ) -> None:
        """Lift each of ``got`` (key -> global counter) to ``global + local since the fold``.

        With the change feed: one more read of the feed (only the tenants charged
        during the round trip), which folds what was charged since the fold into the
        ledger's (just acknowledged) amounts: that is the local part, and no
        O(tenants) ``services()`` is needed. Without the feed, few tenants: one
        ``service()`` each; many: one ``services()`` call (the fold read every
        tenant's already)."""
        ledger = self._ledger
        if ledger is not None:
            if not got and not ledger.num_pulled:
                return
            # the ledger's amounts were just acknowledged: this read folds what was
            # charged during the round trip, the local part; the ledger raises each
            # pulled counter (the reply's, read in the core, and `got`) to the global
            # counter plus it, in one call
            self._read_feed(scheduler)
            extra = dict(zip(_decode_all(got), got.values())) if got else None
            done = self._between_passes(lambda: ledger.raise_pulled(scheduler, extra))  # type: ignore[arg-type]
            if done is None:  # a scheduling pass holds the guard: left for apply_deferred
                values, skipped = ledger.pulled_values(extra)
                self._defer(values)
            else:
                skipped = done[1]
            self.stats.skipped += skipped
            return
        if not got:
            return
        clients = _decode_all(got)
        raise_to: dict[Client, float] = {}
        if len(clients) <= 64:  # few: one call each, not one dict of every tenant
            service = scheduler.service
            now_svc = {c: service(c) for c in clients}
        else:
            now_svc = scheduler.services()
        for c, g in zip(clients, got.values()):
            value = g + (now_svc.get(c, 0.0) - snap.get(c, 0.0))
            if not value <= MAX_COUNTER:
                self.stats.skipped += 1
                continue
            raise_to[c] = value
        self._apply_raise(scheduler, raise_to)

    def _apply_raise(self, scheduler: SchedulerLike, raise_to: dict[Client, float]) -> None:
        """One call into the core; with a :attr:`guard` held by an engine's scheduling
        pass, left for :meth:`apply_deferred` instead (a counter only rises, so a raise
        applied a pass later is still right)."""
        if self._between_passes(lambda: scheduler.raise_counters(raise_to)) is None:
            self._defer(raise_to)

    def _between_passes(self, apply: Callable[[], _T]) -> _T | None:
        """``apply()`` (a raise into the core) with the :attr:`guard` held, if no
        scheduling pass holds it (or without one, when there is no guard); ``None``
        without calling it when a pass holds it (the caller defers the raise)."""
        guard = self.guard
        if guard is None:
            return apply()
        if not guard.acquire(blocking=False):
            return None
        try:
            return apply()
        finally:
            guard.release()

    def _defer(self, raise_to: Mapping[Client, float]) -> None:
        """Leave ``raise_to`` for :meth:`apply_deferred` (the highest value of each)."""
        with self._defer_lock:
            deferred = self._deferred
            for c, v in raise_to.items():
                if v > deferred.get(c, -1.0):
                    deferred[c] = v

    def apply_deferred(self, scheduler: SchedulerLike) -> int:
        """Raise the counters a background sync left while a scheduling pass held
        :attr:`guard` (the engine calls this with the guard held, at the edges of its
        passes); returns how many rose."""
        if not self._deferred:
            return 0
        with self._defer_lock:
            deferred, self._deferred = self._deferred, {}
        return scheduler.raise_counters(deferred)

    def _unacked_tenants(self) -> Iterable[Client]:
        """The tenants with service the store has not acknowledged."""
        return self._unacked if self._ledger is None else self._ledger.unacked_tenants()

    def _round_trip(
        self, scheduler: SchedulerLike, wait: set[Client], feed_wait: bool = False
    ) -> tuple[SyncReply, list[str]]:
        ledger = self._ledger
        push_json: bytes | None = None
        if ledger is None:
            push = dict(zip(_encode_all(self._unacked), self._unacked.values()))
            pushed = len(push)
        else:
            if getattr(self.store, "takes_json", False):  # built in the core
                push_json, pushed = ledger.push_json()
                push = {}
            else:
                push = ledger.pushed()
                pushed = len(push)
        keep: list[str] = []
        hints: dict[str, float] = {}
        since: int | None = None
        if self._full:
            cont = self._acked_wait - self._fleft if feed_wait else self._continuous
            keep = sorted(map(encode, wait & cont))
            add, rem = sorted(map(encode, wait - cont)), []
            for c in wait.union(self._unacked_tenants()):
                v = scheduler.counter(c)
                if v > 0:
                    hints[encode(c)] = v
            self.stats.full_syncs += 1
            if self.delta:
                since, self._cursor = 0, "0"
        elif feed_wait:  # only the tenants whose waiting count changed
            acked, dirty = self._acked_wait, self._fdirty
            add = sorted(encode(c) for c in dirty if c in wait and c not in acked)
            rem = sorted(encode(c) for c in dirty if c not in wait and c in acked)
            if self.delta:
                since = self._since
        else:
            add = sorted(map(encode, wait - self._acked_wait))
            rem = sorted(map(encode, self._acked_wait - wait))
            if self.delta:
                since = self._since
        if self.delta:  # the waiting set comes back (arrivals, and any written since)
            if feed_wait and ledger is not None:  # the ledger's waiting set is `wait`
                pull = sorted(_encode_all(ledger.unacked_tenants(False)))
            else:
                pull = sorted(_encode_all([c for c in self._unacked_tenants() if c not in wait]))
        else:
            pull = sorted({encode(c) for c in wait} | set(_encode_all(self._unacked_tenants())))
        self._seq += 1
        req = SyncRequest(
            self.replica_id,
            self._epoch,
            self._incarnation,
            self._seq,
            self._acked_seq,
            self._full,
            push,
            add,
            rem,
            pull,
            self.liveness_ms,
            keep=keep,
            hints=hints,
            forget_ms=self.forget_ms,
            since=since,
            cursor=self._cursor,
            services_json=push_json,
            raw_reply=push_json is not None,
        )
        self.stats.round_trips += 1
        self.stats.pushed_tenants += pushed
        return self.store.sync(req), pull

    def _rename(self) -> None:
        """The store refused this replica's id: a newer live process syncs under it.

        Nothing of the refused request was applied; the next one is a full sync
        under an id made unique by this incarnation, which the store counts as a
        new replica (what was pushed under the old id stays counted).
        """
        taken = self.replica_id
        self.replica_id = f"{taken}-{self._incarnation[:8]}"
        self.stats.renamed += 1
        self._full = True
        log.error(
            "vtc: replica id %r is in use by another live process; this one goes on as %r. "
            "Give each replica its own VTC_REPLICA_ID (or leave it unset)",
            taken,
            self.replica_id,
        )

    def _fail(self, now: float, err: BaseException) -> None:
        self.stats.failures += 1
        self.stats.last_error = f"{type(err).__name__}: {err}"
        if not self.degraded:
            if _unreachable(err):
                log.warning("vtc: shared counters unreachable (%s); scheduling locally", err)
            else:
                log.warning(
                    "vtc: shared-counter sync failed (%s: %s); scheduling locally",
                    type(err).__name__,
                    err,
                )
        self.degraded = True
        self._full = True
        self._retry_at = now + self.retry_ms

    # -- background mode ----------------------------------------------------------------------
    def start(
        self,
        scheduler: SchedulerLike,
        interval_ms: float | None = None,
        waiting: Callable[[], Iterable[Client]] | _CoreWaiting | None = None,
    ) -> None:
        """Sync from a daemon thread every ``interval_ms`` (default ``sync_ms``, else
        :data:`vtc.config.DEFAULT_SYNC_MS`: 50 ms), or less often when a sync's CPU
        would take more than ``cpu_share`` of the time (:meth:`_pause_after`).

        The engine thread then never waits on the store at all (the core is
        thread-safe); do not also call ``on_step``. ``waiting``, if given, is
        called before each sync for the tenants waiting here (it runs on the
        thread; the tracked requests otherwise). The thread survives any error
        (logged once, ``degraded`` set) and keeps trying.
        """
        if self._thread is not None:
            raise RuntimeError("already started")
        self.attach(scheduler)
        period = (interval_ms or self.sync_ms or DEFAULT_SYNC_MS) / 1000
        self._stop.clear()

        def loop() -> None:
            pause = period
            while not self._stop.wait(pause):
                cpu, began = self.stats.cpu_seconds, time.perf_counter()
                try:
                    w: Waiting = waiting() if callable(waiting) else waiting
                    self.sync(scheduler, w)
                except Exception as e:  # noqa: BLE001 - the thread must outlive any fault
                    if not self._loop_error_logged:
                        log.exception("vtc: shared-counter sync failed; retrying")
                        self._loop_error_logged = True
                    with self._sync_lock:
                        self._fail(self.clock(), e)
                pause = self._pause_after(
                    period, self.stats.cpu_seconds - cpu, time.perf_counter() - began
                )

        self._thread = threading.Thread(target=loop, name="vtc-shared-counters", daemon=True)
        self._thread.start()

    # A background sync holds the interpreter lock for at most its CPU time, which is
    # then taken from the engine thread. The pause after a sync keeps that within
    # cpu_share of the time: over a sync and the pause after it,
    #     cpu <= cpu_share * (wall + pause),
    # so pause >= cpu / cpu_share - wall, and never shorter than the period. It is capped
    # at a quarter of liveness_ms, so that however long a sync takes, the others never
    # take this replica for dead between two of its syncs (the share is then exceeded).
    def _pause_after(self, period: float, cpu: float, wall: float) -> float:
        """Seconds to wait before the next background sync, after one that took
        ``cpu`` seconds of CPU and ``wall`` seconds (``period``: the configured pause)."""
        needed = cpu / self.cpu_share - wall
        if needed <= period:
            return period
        self.stats.stretched += 1
        return min(needed, max(period, self.liveness_ms / 4000))

    def stop(self, scheduler: SchedulerLike | None = None) -> None:
        """Stop the background thread; with ``scheduler``, push a last sync."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        if scheduler is not None:
            self.sync(scheduler)


def from_env(
    env: Mapping[str, str] | None = None, *, replica_id: str | None = None
) -> SharedCounters | None:
    """A :class:`SharedCounters` on Redis configured by environment variables, or ``None``.

    ``VTC_REDIS_URL`` (e.g. ``redis://10.0.0.5:6379/0``; unset or empty: ``None``, the
    single-replica path), ``VTC_REDIS_NAMESPACE`` (default ``default``),
    ``VTC_SYNC_MODE`` (engines: ``background``, the default, or ``step``),
    ``VTC_SYNC_INTERVAL`` (steps, default 10), ``VTC_SYNC_MS`` (optional; the
    background period, default 50), ``VTC_REPLICA_ID`` (default host-pid-random),
    ``VTC_REDIS_TIMEOUT_MS`` (socket timeouts, default 100), ``VTC_SYNC_LIVENESS_MS``
    (default 10000), ``VTC_SYNC_RETRY_MS`` (default 1000), ``VTC_SYNC_FORGET_MS``
    (default 60000), ``VTC_SYNC_CPU_SHARE`` (default 0.005), parsed by
    :func:`vtc.config.shared_counter_settings`: a malformed one raises
    :class:`vtc.config.ConfigError` naming it.  Creating it does not contact Redis.
    """
    from vtc.config import shared_counter_settings

    settings = shared_counter_settings(env)
    if settings is None:
        return None
    return from_settings(settings, replica_id=replica_id)


def from_settings(
    settings: SharedCounterSettings, *, replica_id: str | None = None
) -> SharedCounters:
    """A :class:`SharedCounters` on Redis for parsed ``settings``.

    Raises :class:`vtc.config.ConfigError` when the ``redis`` client is not
    installed (saying what to install).  Does not contact Redis.
    """
    from vtc.config import ConfigError

    try:
        import redis  # noqa: F401
    except ImportError:
        raise ConfigError(
            f"{ENV_URL} is set, but the redis client is not installed: pip install 'vtc[redis]'"
        ) from None
    try:
        store = RedisStore.from_url(settings.url, settings.namespace, settings.timeout_ms)
    except ValueError as e:  # redis-py's own reading of the URL
        raise ConfigError(f"{ENV_URL}={settings.url!r}: {e}") from None
    shared = SharedCounters(
        store,
        replica_id=replica_id or settings.replica_id,
        sync_interval=settings.sync_interval,
        sync_ms=settings.sync_ms,
        liveness_ms=settings.liveness_ms,
        retry_ms=settings.retry_ms,
        forget_ms=settings.forget_ms,
        cpu_share=settings.cpu_share,
    )
    shared.mode = settings.mode
    return shared


# --------------------------------------------------------------------------- the bound
def staleness_bound(replicas: int, sync_interval: int, rate: float, weight: float = 1.0) -> float:
    """``eps = 2 (R - 1) S mu / w``: how far a replica's counter can lag the global one.

    ``rate`` (``mu``) is the most weighted service one replica charges in a step.
    See ``docs/distributed.md``.
    """
    return 2 * (replicas - 1) * sync_interval * rate / weight


def drift_bound(
    replicas: int, sync_interval: int, rate: float, u: float, weight: float = 1.0
) -> float:
    """``2 (R U + eps)``: the drift bound of global VTC over ``R`` replicas (``R = 1``: ``2U``)."""
    return 2 * (replicas * u / weight + staleness_bound(replicas, sync_interval, rate, weight))
