-- Shared by every script: store.go prepends it to each one. Every key
-- lives under the one hash tag in P, so each script runs in one Cluster
-- slot; KEYS[1] (the lease expiry set) is passed only to route the call.
--
-- A selector index ix:<h> holds the leasable proxies matching one selector,
-- each scored load * SHIFT + slot: ordered by live lease count, and unique,
-- because every proxy has its own slot number. A cooling index
-- cx:<h>:<target> holds the members of ix:<h> cooling down for target with
-- the same scores, so counting the cooling members below a score tells how
-- many members of ix:<h> below it are free: the least-loaded free proxy and
-- a uniformly random one among its ties are found by binary search, in
-- O(log² n) whatever the fleet size and however many proxies are cooling.
local P = KEYS[1]:sub(1, -4) -- the prefix: KEYS[1] is P .. 'exp'
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

-- Changes uid's live lease count by delta and moves it to its new place in
-- every index and cooling index holding it. Returns the new count.
local function add_load(uid, delta)
  local slot = redis.call('HGET', P .. 'slot', uid)
  if not slot then
    return 0 -- forgotten: the Proxy is gone
  end
  local n = redis.call('HINCRBY', P .. 'load', uid, delta)
  if n < 0 then
    n = 0
    redis.call('HSET', P .. 'load', uid, 0)
  end
  local s = num(n * SHIFT + tonumber(slot))
  local cooling = redis.call('HKEYS', P .. 'cool:' .. uid)
  for _, h in ipairs(redis.call('SMEMBERS', P .. 'in:' .. uid)) do
    redis.call('ZADD', P .. 'ix:' .. h, 'XX', s, uid)
    for _, t in ipairs(cooling) do
      redis.call('ZADD', P .. 'cx:' .. h .. ':' .. t, 'XX', s, uid)
    end
  end
  return n
end

-- Applies up to limit lease expiries and cooldown ends that are due.
-- Returns true when more are due.
local function drain(now, limit)
  local due = redis.call('ZRANGEBYSCORE', P .. 'exp', '-inf', now, 'LIMIT', 0, limit)
  for _, m in ipairs(due) do
    local id, uid = split(m)
    redis.call('ZREM', P .. 'exp', m)
    redis.call('DEL', P .. 'lease:' .. id)
    add_load(uid, -1)
  end
  local ended = redis.call('ZRANGEBYSCORE', P .. 'coolend', '-inf', now, 'LIMIT', 0, limit)
  for _, m in ipairs(ended) do
    local uid, target = split(m)
    redis.call('ZREM', P .. 'coolend', m)
    redis.call('HDEL', P .. 'cool:' .. uid, target)
    for _, h in ipairs(redis.call('SMEMBERS', P .. 'in:' .. uid)) do
      local cx = P .. 'cx:' .. h .. ':' .. target
      redis.call('ZREM', cx, uid)
      if redis.call('EXISTS', cx) == 0 then
        redis.call('SREM', P .. 'cxs:' .. h, target)
      end
    end
  end
  return #due == limit or #ended == limit
end

local DRAIN = 256

-- A live lease's fields, or nil.
local function live_lease(id, now)
  local l = redis.call('HMGET', P .. 'lease:' .. id, 'proxy', 'expires', 'target', 'req', 'addr')
  if l[1] and tonumber(l[2]) > now then
    return l
  end
  return nil
end
