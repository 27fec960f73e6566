-- End a lease. KEYS: lease, load set. ARGV: lease_id, proxy.
-- Returns 1 when a lease was released, 0 when there was none.
if redis.call('HGET', KEYS[1], 'proxy') ~= ARGV[2] then
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
