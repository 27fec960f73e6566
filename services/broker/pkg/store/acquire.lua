-- Returns {pick (0 = none), cooling, at_cap, expires_ms, new load of pick}.
-- Pick the least-loaded candidate that is not cooling down for the target
-- and is below the cap, and record the lease, in one atomic step.
-- KEYS: load sets of the n candidates, then their cooldown keys, then the lease key.
-- ARGV: n, now_ms, ttl_ms, cap (0 = none), lease_id, target, random, candidate ids...
local n = tonumber(ARGV[1])
local now = tonumber(ARGV[2])
local ttl = tonumber(ARGV[3])
local cap = tonumber(ARGV[4])
local target = ARGV[6]
local best, best_load = {}, nil
local cooling, full = 0, 0
-- One ZCOUNT per candidate (live leases only); expired members are pruned
-- from the chosen set alone, which keeps every set bounded by its live
-- leases plus those expired since it was last chosen.
local live = '(' .. now
for i = 1, n do
  local load = redis.call('ZCOUNT', KEYS[i], live, '+inf')
  if target ~= '' and redis.call('EXISTS', KEYS[n + i]) == 1 then
    cooling = cooling + 1
  elseif cap > 0 and load >= cap then
    full = full + 1
  elseif best_load == nil or load < best_load then
    best, best_load = {i}, load
  elseif load == best_load then
    best[#best + 1] = i
  end
end
if #best == 0 then
  return {0, cooling, full, 0, 0}
end
local pick = best[(tonumber(ARGV[7]) % #best) + 1]
local expires = now + ttl
redis.call('ZREMRANGEBYSCORE', KEYS[pick], '-inf', now)
redis.call('ZADD', KEYS[pick], expires, ARGV[5])
local lease = KEYS[2 * n + 1]
redis.call('HSET', lease, 'proxy', ARGV[7 + pick], 'target', target, 'expires', expires)
redis.call('PEXPIREAT', lease, expires)
return {pick, cooling, full, expires, best_load + 1}
