-- Extend a live lease. KEYS: lease, load set. ARGV: lease_id, proxy, now_ms, ttl_ms.
-- Returns the new expiry, or 0 when the lease is gone or expired.
local exp = tonumber(redis.call('HGET', KEYS[1], 'expires') or '0')
local now = tonumber(ARGV[3])
if exp <= now or redis.call('HGET', KEYS[1], 'proxy') ~= ARGV[2] then
  return 0
end
local expires = now + tonumber(ARGV[4])
redis.call('HSET', KEYS[1], 'expires', expires)
redis.call('PEXPIREAT', KEYS[1], expires)
redis.call('ZADD', KEYS[2], expires, ARGV[1])
return expires
