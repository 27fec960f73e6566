-- Removes a selector index nobody has used lately. ARGV: index hash.
local h = ARGV[1]
local ix = P .. 'ix:' .. h
for _, uid in ipairs(redis.call('ZRANGE', ix, 0, -1)) do
  redis.call('SREM', P .. 'in:' .. uid, h)
end
for _, t in ipairs(redis.call('SMEMBERS', P .. 'cxs:' .. h)) do
  redis.call('DEL', P .. 'cx:' .. h .. ':' .. t)
end
redis.call('DEL', ix, P .. 'cxs:' .. h)
redis.call('HDEL', P .. 'ixs', h)
redis.call('ZREM', P .. 'ixused', h)
return 1
