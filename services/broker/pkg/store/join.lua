-- Adds proxies to selector indexes, at their current load and with their
-- live cooldowns, and records each one's namespace and address. ARGV:
-- definition ('' when the indexes exist), count k, k {proxy, namespace,
-- address} triples... then the index hashes. A definition registers the
-- (single) index first; indexes not registered are skipped, so a join
-- racing a drop cannot resurrect half an index.
-- Puts uid in index h at its score, with its live cooldowns.
local function join(uid, h, score, cooling, now)
  redis.call('ZADD', P .. 'ix:' .. h, score, uid)
  redis.call('SADD', P .. 'in:' .. uid, 'ix:' .. h)
  for j = 1, #cooling, 2 do
    if tonumber(cooling[j + 1]) > now then
      local cx = 'cx:' .. h .. ':' .. cooling[j]
      redis.call('ZADD', P .. cx, score, uid)
      redis.call('SADD', P .. 'in:' .. uid, cx)
      redis.call('SADD', P .. 'cxs:' .. h, cooling[j])
    end
  end
end

local def, k = ARGV[1], tonumber(ARGV[2])
local now = now_ms()
local hs = {}
for i = 3 + 3 * k, #ARGV do
  if def ~= '' then
    redis.call('HSETNX', P .. 'ixs', ARGV[i], def)
    redis.call('ZADD', P .. 'ixused', 'NX', now, ARGV[i])
  end
  if redis.call('HEXISTS', P .. 'ixs', ARGV[i]) == 1 then
    hs[#hs + 1] = ARGV[i]
  end
end
for i = 0, k - 1 do
  local uid = ARGV[3 + 3 * i]
  local s = redis.call('HGET', P .. 'score', uid)
  if not s then
    s = redis.call('INCR', P .. 'seq') % SHIFT
    redis.call('HSET', P .. 'score', uid, s)
  end
  redis.call('HSET', P .. 'ns', uid, ARGV[4 + 3 * i])
  redis.call('HSET', P .. 'addr', uid, ARGV[5 + 3 * i])
  local cooling = redis.call('HGETALL', P .. 'cool:' .. uid)
  for _, h in ipairs(hs) do
    join(uid, h, s, cooling, now)
  end
end
return #hs
