-- Takes a proxy out of selector indexes (all of them when none are named);
-- with forget = '1' also drops everything kept about it: the Proxy is gone.
-- ARGV: proxy, forget, index hashes...
local uid = ARGV[1]
local hs = {}
for i = 3, #ARGV do
  hs[#hs + 1] = ARGV[i]
end
if #hs == 0 then
  hs = redis.call('SMEMBERS', P .. 'in:' .. uid)
end
local cooling = redis.call('HKEYS', P .. 'cool:' .. uid)
for _, h in ipairs(hs) do
  redis.call('ZREM', P .. 'ix:' .. h, uid)
  redis.call('SREM', P .. 'in:' .. uid, h)
  for _, t in ipairs(cooling) do
    redis.call('ZREM', P .. 'cx:' .. h .. ':' .. t, uid)
  end
end
if ARGV[2] == '1' then
  for _, t in ipairs(cooling) do
    redis.call('ZREM', P .. 'coolend', uid .. '|' .. t)
  end
  redis.call('DEL', P .. 'cool:' .. uid, P .. 'in:' .. uid)
  redis.call('HDEL', P .. 'slot', uid)
  redis.call('HDEL', P .. 'load', uid)
  redis.call('HDEL', P .. 'ns', uid)
  redis.call('HDEL', P .. 'addr', uid)
end
return #hs
