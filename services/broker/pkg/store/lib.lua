-- Shared by every script: store.go prepends it to each one, after the
-- key names of schema.go (K: each key's stem under the prefix P, S: the
-- stem alone). Every key lives under the one hash tag in P, so each
-- script runs in one Cluster slot; KEYS[1] (the due set) is passed only to
-- route the call.
--
-- A selector index ix:<h> holds the leasable proxies matching one selector,
-- each scored load * SHIFT + slot: ordered by live lease count, and unique,
-- because every proxy has its own slot number. A cooling index
-- cx:<h>:<target> holds the members of ix:<h> cooling down for target with
-- the same scores, so counting the cooling members below a score tells how
-- many members of ix:<h> below it are free. acquire.lua uses that to find
-- the least-loaded free proxy, and a uniformly random one among its ties,
-- in O(log² n) at worst, whatever the fleet size and however many proxies
-- are cooling.
--
-- Hot paths count redis.call()s: each costs about as much as the work it
-- does, so a lease makes a dozen of them.
local DUE = KEYS[1]
local SHIFT = 4294967296

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Redis formats Lua numbers with 14 significant digits; scores need all 16.
local function num(x)
  return string.format('%.0f', x)
end

local function split(s)
  local i = string.find(s, '|', 1, true)
  return string.sub(s, 1, i - 1), string.sub(s, i + 1)
end

-- A tenant's own cooldowns. An untrusted tenant's report cools a proxy
-- for it alone until another tenant agrees (report.lua): such a cooldown
-- is filed as the target '<target>#<tenant>' (host names hold no '#'),
-- in cool:<uid>, the due set and a cooling index of its own,
-- cx:<h>:<target>#<tenant>. That index holds only members not already
-- cooling for everyone, so the tenant's pick counts both indexes and
-- never a member twice.
local MINE = '#'

-- The key a tenant's own cooldowns for target are filed under.
local function mine_of(target, tenant)
  return target .. MINE .. tenant
end

-- The fleet-wide target and tenant of a tenant's own key; the target
-- alone for a fleet-wide one.
local function split_mine(t)
  local i = string.find(t, MINE, 1, true)
  if i then
    return string.sub(t, 1, i - 1), string.sub(t, i + 1)
  end
  return t, nil
end

-- The fleet-wide target a tenant's own cooldown is about; nil for a
-- fleet-wide one.
local function base_of(t)
  local base, tenant = split_mine(t)
  return tenant and base
end

-- Changes uid's live lease count by delta and moves it to its new place in
-- every index and cooling index holding it (in:<uid> lists their keys).
-- Returns the new count.
local function add_load(uid, delta)
  local s = redis.call('HINCRBY', K.Score, uid, delta * SHIFT)
  local slot = s % SHIFT
  if slot == 0 then
    redis.call('HDEL', K.Score, uid) -- forgotten: the Proxy is gone
    return 0
  end
  if s < 0 then
    s = slot
    redis.call('HSET', K.Score, uid, s)
  end
  local score = num(s)
  for _, k in ipairs(redis.call('SMEMBERS', K.Holders .. uid)) do
    redis.call('ZADD', P .. k, 'XX', score, uid)
  end
  return math.floor(s / SHIFT)
end

-- Puts uid in index h at its score, with its live cooldowns (cooling,
-- HGETALL of cool:<uid>); a tenant's own cooldown only while no
-- fleet-wide one for its target holds (see MINE).
local function join(uid, h, score, cooling, now)
  redis.call('ZADD', K.Index .. h, score, uid)
  redis.call('SADD', K.Holders .. uid, S.Index .. h)
  local live = {}
  for j = 1, #cooling, 2 do
    if tonumber(cooling[j + 1]) > now then
      live[cooling[j]] = true
    end
  end
  for t in pairs(live) do
    local base = base_of(t)
    if not (base and live[base]) then
      local cx = S.CoolingIndex .. h .. ':' .. t
      redis.call('ZADD', P .. cx, score, uid)
      redis.call('SADD', K.Holders .. uid, cx)
      redis.call('SADD', K.CoolingTargets .. h, t)
    end
  end
end

-- Takes uid out of index h and its cooling indexes for targets.
local function leave(uid, h, targets)
  redis.call('ZREM', K.Index .. h, uid)
  redis.call('SREM', K.Holders .. uid, S.Index .. h)
  for _, t in ipairs(targets) do
    local cx = S.CoolingIndex .. h .. ':' .. t
    redis.call('ZREM', P .. cx, uid)
    redis.call('SREM', K.Holders .. uid, cx)
  end
end

-- Puts uid in the cooling index for target of every index holding it.
local function index_cooling(uid, target)
  for _, k in ipairs(redis.call('SMEMBERS', K.Holders .. uid)) do
    if k:sub(1, #S.Index) == S.Index then
      local h = k:sub(#S.Index + 1)
      local cx = S.CoolingIndex .. h .. ':' .. target
      redis.call('ZADD', P .. cx, redis.call('ZSCORE', P .. k, uid), uid)
      redis.call('SADD', K.Holders .. uid, cx)
      redis.call('SADD', K.CoolingTargets .. h, target)
    end
  end
end

-- Takes uid out of the cooling index for target of every index holding it.
local function unindex_cooling(uid, target)
  for _, k in ipairs(redis.call('SMEMBERS', K.Holders .. uid)) do
    if k:sub(1, #S.Index) == S.Index then
      local h = k:sub(#S.Index + 1)
      local cx = S.CoolingIndex .. h .. ':' .. target
      redis.call('ZREM', P .. cx, uid)
      redis.call('SREM', K.Holders .. uid, cx)
      if redis.call('EXISTS', P .. cx) == 0 then
        redis.call('SREM', K.CoolingTargets .. h, target)
      end
    end
  end
end

-- The tenants' own cooldowns of uid for target (fields of cool:<uid>)
-- that end after now.
local function mine_for(uid, target, now)
  local out, pre = {}, mine_of(target, '')
  local c = redis.call('HGETALL', K.Cooling .. uid)
  for j = 1, #c, 2 do
    if c[j]:sub(1, #pre) == pre and tonumber(c[j + 1]) > now then
      out[#out + 1] = c[j]
    end
  end
  return out
end

-- Keeps uid away from target until ends (or later, if it already cools
-- down longer): into the cooling index of every index holding it.
local function cool(uid, target, ends, now)
  local prev = tonumber(redis.call('HGET', K.Cooling .. uid, target) or '0')
  if prev >= ends then
    return
  end
  redis.call('HSET', K.Cooling .. uid, target, ends)
  redis.call('ZADD', DUE, ends, 'c|' .. uid .. '|' .. target)
  if prev > now then
    return -- already in the cooling indexes
  end
  local base = base_of(target)
  if base then
    if tonumber(redis.call('HGET', K.Cooling .. uid, base) or '0') > now then
      return -- cooling for everyone: the fleet-wide index holds it
    end
  else
    for _, t in ipairs(mine_for(uid, target, now)) do
      unindex_cooling(uid, t)
    end
  end
  index_cooling(uid, target)
end

-- Stops uid cooling down for target: out of every cooling index; a
-- tenant's own cooldown that outlasts a fleet-wide one goes back into
-- its own index.
local function end_cooldown(uid, target, now)
  redis.call('HDEL', K.Cooling .. uid, target)
  unindex_cooling(uid, target)
  if not base_of(target) then
    for _, t in ipairs(mine_for(uid, target, now)) do
      index_cooling(uid, t)
    end
  end
end

-- A quarantined proxy leaves every index until ends; qix:<uid> remembers
-- the indexes it left (and those a join asked for meanwhile), so
-- unquarantine puts it back where it belongs (and report.lua can count
-- the members of an index that are out in quarantine).
local function quarantine(uid, now, ends)
  redis.call('HSET', K.Quarantine, uid, now .. '|' .. ends)
  redis.call('ZADD', DUE, ends, 'q|' .. uid .. '|')
  local targets = redis.call('HKEYS', K.Cooling .. uid)
  for _, k in ipairs(redis.call('SMEMBERS', K.Holders .. uid)) do
    if k:sub(1, #S.Index) == S.Index then
      leave(uid, k:sub(#S.Index + 1), targets)
      redis.call('SADD', K.Rejoin .. uid, k:sub(#S.Index + 1))
    end
  end
end

local function unquarantine(uid, now)
  redis.call('HDEL', K.Quarantine, uid)
  redis.call('ZREM', DUE, 'q|' .. uid .. '|')
  local s = redis.call('HGET', K.Score, uid)
  if s then
    local cooling = redis.call('HGETALL', K.Cooling .. uid)
    for _, h in ipairs(redis.call('SMEMBERS', K.Rejoin .. uid)) do
      if redis.call('HEXISTS', K.Indexes, h) == 1 then
        join(uid, h, s, cooling, now)
      end
    end
  end
  redis.call('DEL', K.Rejoin .. uid)
end

-- How long a session remembers its proxy, and the targets it leased for,
-- after its last lease ended (ms); and how many targets it remembers.
local SESSION_LINGER = 600000
local SESSION_TARGETS = 64

-- Ends a lease: its proxy's load, and the live counts of its target
-- (field ct, set when counted), session (field sess) and caller (field
-- tok, the name of the token it was taken with).
local function end_lease(id, uid, ct, sess, tok)
  redis.call('DEL', K.Lease .. id)
  redis.call('SREM', K.ProxyLeases .. uid, id)
  add_load(uid, -1)
  if tok and tok ~= '' then
    if redis.call('HINCRBY', K.Tokens, tok, -1) <= 0 then
      redis.call('HDEL', K.Tokens, tok)
    end
  end
  if ct then
    if redis.call('HINCRBY', K.Target .. ct, 'n', -1) <= 0 then
      redis.call('HDEL', K.Target .. ct, 'n')
    end
  end
  if sess then
    -- A session outlives its last lease by SESSION_LINGER, so a client
    -- that opens one connection per request (the gateway's curl) keeps
    -- its proxy, and a block seen after the tunnel closed can be
    -- reported against it.
    local sk = K.Session .. sess
    if redis.call('HINCRBY', sk, 'n', -1) <= 0 then
      redis.call('HDEL', sk, 'n')
      redis.call('PEXPIRE', sk, SESSION_LINGER)
    end
  end
end

-- Ends a live lease before its expiry (released, or its proxy forgotten):
-- its expiry and its request id go with it.
local function close_lease(id, uid, req, ct, sess, tok)
  redis.call('ZREM', DUE, 'l|' .. id .. '|' .. uid)
  if req and req ~= '' then
    redis.call('DEL', K.Request .. req)
  end
  end_lease(id, uid, ct, sess, tok)
end

-- Applies up to limit lease expiries, cooldown ends and quarantine ends
-- that are due ("l|<lease>|<uid>", "c|<uid>|<target>" and "q|<uid>|" in
-- the due set). Returns true when more are due.
local function drain(now, limit)
  local due = redis.call('ZRANGEBYSCORE', DUE, '-inf', now, 'LIMIT', 0, limit)
  for _, m in ipairs(due) do
    redis.call('ZREM', DUE, m)
    local kind, a, b = m:sub(1, 1), split(m:sub(3))
    if kind == 'l' then
      local f = redis.call('HMGET', K.Lease .. a, 'ct', 'sess', 'tok')
      end_lease(a, b, f[1], f[2], f[3])
    elseif kind == 'c' then
      end_cooldown(a, b, now)
    else
      unquarantine(a, now)
    end
  end
  return #due == limit
end

local DRAIN = 256

-- A live lease's fields {proxy, expires, target, req, addr, ix, at, ct,
-- sess, tok}, or nil.
local function live_lease(id, now)
  local l = redis.call('HMGET', K.Lease .. id, 'proxy', 'expires', 'target', 'req', 'addr', 'ix', 'at', 'ct', 'sess', 'tok')
  if l[1] and tonumber(l[2]) > now then
    return l
  end
  return nil
end

-- The start of every script that changes one lease: read the clock,
-- apply what is due, and return now and the lease (nil when gone).
local function open_lease(id)
  local now = now_ms()
  drain(now, DRAIN)
  return now, live_lease(id, now)
end

-- Pacing. A paced target keeps in t:<target> its fleet-wide lease rate
-- (leases/s), tat (GCRA's theoretical arrival time, ms), cut (when the
-- rate last changed down: reports on leases granted before it are the
-- burst that caused it) and until (pacing lapses after a memory window
-- with no report); the paced hash mirrors the rate, for metrics.
local function pace_end(target)
  redis.call('HDEL', K.Target .. target, 'rate', 'tat', 'cut', 'until')
  redis.call('HDEL', K.Paced, target)
end

-- The target's rate from fields already read (rate, and until as lapse),
-- or nil when it is not paced; a pace that lapsed is ended here.
local function pace_live(target, rate, lapse, now)
  if not rate then
    return nil
  end
  if tonumber(lapse) <= now then
    pace_end(target)
    return nil
  end
  return tonumber(rate)
end

local function pace_set(target, rate, now, window, cut)
  local tk = K.Target .. target
  redis.call('HSET', tk, 'rate', rate, 'until', now + window)
  if cut then
    redis.call('HSET', tk, 'cut', now)
    redis.call('HSETNX', tk, 'tat', now)
  end
  redis.call('HSET', K.Paced, target, rate)
end

