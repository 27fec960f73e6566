-- Cools a live lease's proxy down for target until now + duration (or
-- later, if it already cools down longer). ARGV: lease_id, target, duration_ms.
-- Returns the cooldown's end, or 0 when the lease is gone or expired.
local id, target, d = ARGV[1], ARGV[2], tonumber(ARGV[3])
local now = now_ms()
drain(now, DRAIN)
local l = live_lease(id, now)
if not l then
  return 0
end
local uid = l[1]
local ends = now + d
local prev = tonumber(redis.call('HGET', P .. 'cool:' .. uid, target) or '0')
if prev > ends then
  return prev
end
redis.call('HSET', P .. 'cool:' .. uid, target, ends)
redis.call('ZADD', P .. 'coolend', ends, uid .. '|' .. target)
for _, h in ipairs(redis.call('SMEMBERS', P .. 'in:' .. uid)) do
  local s = redis.call('ZSCORE', P .. 'ix:' .. h, uid)
  if s then
    redis.call('ZADD', P .. 'cx:' .. h .. ':' .. target, s, uid)
    redis.call('SADD', P .. 'cxs:' .. h, target)
  end
end
return ends
