-- Takes a proxy out of selector indexes (all of them when none are named);
-- with forget = '1' also drops everything kept about it: the Proxy is gone.
-- ARGV: proxy, forget, index hashes...
-- Takes uid out of index h and its cooling indexes.
local function leave(uid, h, targets)
  redis.call('ZREM', P .. 'ix:' .. h, uid)
  redis.call('SREM', P .. 'in:' .. uid, 'ix:' .. h)
  for _, t in ipairs(targets) do
    local cx = 'cx:' .. h .. ':' .. t
    redis.call('ZREM', P .. cx, uid)
    redis.call('SREM', P .. 'in:' .. uid, cx)
  end
end

local uid = ARGV[1]
local targets = redis.call('HKEYS', P .. 'cool:' .. uid)
if #ARGV > 2 then
  for i = 3, #ARGV do
    leave(uid, ARGV[i], targets)
  end
else
  for _, k in ipairs(redis.call('SMEMBERS', P .. 'in:' .. uid)) do
    redis.call('ZREM', P .. k, uid)
  end
  redis.call('DEL', P .. 'in:' .. uid)
end
if ARGV[2] == '1' then
  for _, t in ipairs(targets) do
    redis.call('ZREM', DUE, 'c|' .. uid .. '|' .. t)
  end
  redis.call('DEL', P .. 'cool:' .. uid, P .. 'in:' .. uid)
  redis.call('HDEL', P .. 'score', uid)
  redis.call('HDEL', P .. 'ns', uid)
  redis.call('HDEL', P .. 'addr', uid)
end
return 1
