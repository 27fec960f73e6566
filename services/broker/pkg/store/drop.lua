-- Removes a selector index. ARGV: index hash.
local h = ARGV[1]
for _, uid in ipairs(redis.call('ZRANGE', K.Index .. h, 0, -1)) do
  redis.call('SREM', K.Holders .. uid, S.Index .. h)
end
for _, t in ipairs(redis.call('SMEMBERS', K.CoolingTargets .. h)) do
  local cx = S.CoolingIndex .. h .. ':' .. t
  for _, uid in ipairs(redis.call('ZRANGE', P .. cx, 0, -1)) do
    redis.call('SREM', K.Holders .. uid, cx)
  end
  redis.call('DEL', P .. cx)
end
redis.call('DEL', K.Index .. h, K.CoolingTargets .. h)
redis.call('HDEL', K.Indexes, h)
redis.call('ZREM', K.IndexUse, h)
return 1
