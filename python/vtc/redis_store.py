"""The shared counters on Redis: one Lua script per sync (:data:`SYNC_LUA`) and
:class:`RedisStore`, which runs it. :class:`vtc.store.LocalStore` is its in-process twin
(same semantics); :mod:`vtc.distributed` keeps the synchronizer and re-exports these.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from itertools import chain
from typing import TYPE_CHECKING, Any

from vtc._core import MAX_COUNTER
from vtc.store import (
    FORGET_BATCH,
    KEEP_MS,
    Client,
    SyncReply,
    SyncRequest,
    decode,
    stored_number,
)

if TYPE_CHECKING:
    import redis

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
