-- Shared by every script: store.go prepends it to each one. Every key
-- lives under the one hash tag in P, so each script runs in one Cluster
-- slot; KEYS[1] (the due set) is passed only to route the call.
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
local P = KEYS[1]:sub(1, -4) -- the prefix: KEYS[1] is P .. 'due'
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

-- Changes uid's live lease count by delta and moves it to its new place in
-- every index and cooling index holding it (in:<uid> lists their keys).
-- Returns the new count.
local function add_load(uid, delta)
  local s = redis.call('HINCRBY', P .. 'score', uid, delta * SHIFT)
  local slot = s % SHIFT
  if slot == 0 then
    redis.call('HDEL', P .. 'score', uid) -- forgotten: the Proxy is gone
    return 0
  end
  if s < 0 then
    s = slot
    redis.call('HSET', P .. 'score', uid, s)
  end
  local score = num(s)
  for _, k in ipairs(redis.call('SMEMBERS', P .. 'in:' .. uid)) do
    redis.call('ZADD', P .. k, 'XX', score, uid)
  end
  return math.floor(s / SHIFT)
end

-- Stops uid cooling down for target: out of every cooling index.
local function end_cooldown(uid, target)
  redis.call('HDEL', P .. 'cool:' .. uid, target)
  for _, k in ipairs(redis.call('SMEMBERS', P .. 'in:' .. uid)) do
    if k:sub(1, 3) == 'ix:' then
      local h = k:sub(4)
      local cx = 'cx:' .. h .. ':' .. target
      redis.call('ZREM', P .. cx, uid)
      redis.call('SREM', P .. 'in:' .. uid, cx)
      if redis.call('EXISTS', P .. cx) == 0 then
        redis.call('SREM', P .. 'cxs:' .. h, target)
      end
    end
  end
end

-- Applies up to limit lease expiries and cooldown ends that are due
-- ("l|<lease>|<uid>" and "c|<uid>|<target>" in the due set). Returns true
-- when more are due.
local function drain(now, limit)
  local due = redis.call('ZRANGEBYSCORE', DUE, '-inf', now, 'LIMIT', 0, limit)
  for _, m in ipairs(due) do
    redis.call('ZREM', DUE, m)
    local a, b = split(m:sub(3))
    if m:sub(1, 1) == 'l' then
      redis.call('DEL', P .. 'lease:' .. a)
      add_load(b, -1)
    else
      end_cooldown(a, b)
    end
  end
  return #due == limit
end

local DRAIN = 256

-- A live lease's fields {proxy, expires, target, req, addr}, or nil.
local function live_lease(id, now)
  local l = redis.call('HMGET', P .. 'lease:' .. id, 'proxy', 'expires', 'target', 'req', 'addr')
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
