-- Adds proxies to selector indexes, at their current load and with their
-- live cooldowns, and records each one's namespace, address and cooldown
-- key. ARGV: definition ('' when the indexes exist), count k, k {proxy,
-- namespace, address, cooldown key, healthy since (ms, 0: not healthy)}
-- tuples... then the index hashes. A definition registers the (single)
-- index first; indexes not registered are skipped, so a join racing a drop
-- cannot resurrect half an index. A quarantined proxy is parked instead:
-- it joins when the quarantine ends, or now, if it turned healthy after
-- the quarantine began (the prober's success clears it).
local N = 5

-- Files uid under cooldown key ck (its exit IP, or the proxy itself):
-- a proxy that lands on a key inherits the key's live cooldowns.
local function set_key(uid, ck, now)
  local was = redis.call('HGET', K.CooldownKey, uid)
  if was == ck then
    return
  end
  if was then
    redis.call('SREM', K.Filed .. was, uid)
  end
  redis.call('HSET', K.CooldownKey, uid, ck)
  redis.call('SADD', K.Filed .. ck, uid)
  local cd = redis.call('HGETALL', K.Cooldown .. ck)
  for j = 1, #cd, 2 do
    local ends = tonumber((split(cd[j + 1])))
    if ends > now then
      cool(uid, cd[j], ends, now)
    end
  end
end

-- Whether uid stays out of the indexes: quarantined, and not healthy
-- since the quarantine began.
local function parked(uid, healthy_since, now)
  local q = redis.call('HGET', K.Quarantine, uid)
  if not q then
    return false
  end
  local from = tonumber((split(q)))
  if healthy_since > from then
    unquarantine(uid, now)
    return false
  end
  return true
end

local def, k = ARGV[1], tonumber(ARGV[2])
local now = now_ms()
local hs = {}
for i = 3 + N * k, #ARGV do
  if def ~= '' then
    redis.call('HSETNX', K.Indexes, ARGV[i], def)
    redis.call('ZADD', K.IndexUse, 'NX', now, ARGV[i])
  end
  if redis.call('HEXISTS', K.Indexes, ARGV[i]) == 1 then
    hs[#hs + 1] = ARGV[i]
  end
end
for i = 0, k - 1 do
  local o = 3 + N * i
  local uid = ARGV[o]
  local s = redis.call('HGET', K.Score, uid)
  if not s then
    s = redis.call('INCR', K.Seq) % SHIFT
    redis.call('HSET', K.Score, uid, s)
  end
  redis.call('HSET', K.Namespace, uid, ARGV[o + 1])
  redis.call('HSET', K.Address, uid, ARGV[o + 2])
  set_key(uid, ARGV[o + 3], now)
  if parked(uid, tonumber(ARGV[o + 4]), now) then
    for _, h in ipairs(hs) do
      redis.call('SADD', K.Rejoin .. uid, h)
    end
  else
    local cooling = redis.call('HGETALL', K.Cooling .. uid)
    for _, h in ipairs(hs) do
      join(uid, h, s, cooling, now)
    end
  end
end
return #hs
