-- Extends a live lease of proxy to now + ttl.
-- ARGV: lease_id, proxy, ttl_ms. Returns the new expiry, or 0 when the
-- lease is gone, expired or not on proxy.
local id, uid, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])
local now, l = open_lease(id)
if not l or l[1] ~= uid then
  return 0
end
local expires = now + ttl
redis.call('HSET', P .. 'lease:' .. id, 'expires', expires)
redis.call('ZADD', DUE, expires, 'l|' .. id .. '|' .. uid)
if l[4] ~= '' then
  redis.call('PEXPIREAT', P .. 'req:' .. l[4], expires)
end
return expires
