-- Cools a live lease's proxy down for target until now + duration (or
-- later, if it already cools down longer). ARGV: lease_id, target, duration_ms.
-- Returns the cooldown's end, or 0 when the lease is gone or expired.
local id, target, d = ARGV[1], ARGV[2], tonumber(ARGV[3])
local now, l = open_lease(id)
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
redis.call('ZADD', DUE, ends, 'c|' .. uid .. '|' .. target)
if prev > now then
  return ends -- already in the cooling indexes
end
for _, k in ipairs(redis.call('SMEMBERS', P .. 'in:' .. uid)) do
  if k:sub(1, 3) == 'ix:' then
    local h = k:sub(4)
    local cx = 'cx:' .. h .. ':' .. target
    redis.call('ZADD', P .. cx, redis.call('ZSCORE', P .. k, uid), uid)
    redis.call('SADD', P .. 'in:' .. uid, cx)
    redis.call('SADD', P .. 'cxs:' .. h, target)
  end
end
return ends
