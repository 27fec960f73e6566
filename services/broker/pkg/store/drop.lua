-- Removes a selector index. ARGV: index hash.
local h = ARGV[1]
for _, uid in ipairs(redis.call('ZRANGE', P .. 'ix:' .. h, 0, -1)) do
  redis.call('SREM', P .. 'in:' .. uid, 'ix:' .. h)
end
for _, t in ipairs(redis.call('SMEMBERS', P .. 'cxs:' .. h)) do
  local cx = 'cx:' .. h .. ':' .. t
  for _, uid in ipairs(redis.call('ZRANGE', P .. cx, 0, -1)) do
    redis.call('SREM', P .. 'in:' .. uid, cx)
  end
  redis.call('DEL', P .. cx)
end
redis.call('DEL', P .. 'ix:' .. h, P .. 'cxs:' .. h)
redis.call('HDEL', P .. 'ixs', h)
redis.call('ZREM', P .. 'ixused', h)
return 1
