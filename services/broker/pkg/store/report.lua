-- Start a cooldown for the lease's proxy and target, if the lease is live.
-- KEYS: lease, cooldown key. ARGV: proxy, now_ms, cooldown_ms.
local exp = tonumber(redis.call('HGET', KEYS[1], 'expires') or '0')
if exp <= tonumber(ARGV[2]) or redis.call('HGET', KEYS[1], 'proxy') ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[2], '1', 'PX', tonumber(ARGV[3]))
return 1
