-- Extends a live lease of proxy to now + ttl, or to until_ms if that is
-- sooner (a draining proxy's deadline), both by Redis's clock, as every
-- expiry is.
-- ARGV: lease_id, proxy, ttl_ms, until_ms (0: none). Returns the new
-- expiry, 0 when the lease is gone, expired or not on proxy, or -1 when
-- until_ms has passed.
local id, uid, ttl, cap = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local now, l = open_lease(id)
if not l or l[1] ~= uid then
  return 0
end
local expires = now + ttl
if cap > 0 then
  if cap <= now then
    return -1
  end
  expires = math.min(expires, cap)
end
redis.call('HSET', K.Lease .. id, 'expires', expires)
redis.call('ZADD', DUE, expires, 'l|' .. id .. '|' .. uid)
if l[4] ~= '' then
  redis.call('PEXPIREAT', K.Request .. l[4], expires)
end
return expires
