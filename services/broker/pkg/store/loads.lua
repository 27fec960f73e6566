-- Live lease counts and quarantine ends (0: none) of proxies, after
-- applying what is due. ARGV: proxies... Returns {load, quarantine end}
-- pairs, flattened.
drain(now_ms(), DRAIN)
local out = {}
if #ARGV > 0 then
  local q = redis.call('HMGET', P .. 'quar', unpack(ARGV))
  for i, s in ipairs(redis.call('HMGET', P .. 'score', unpack(ARGV))) do
    out[2 * i - 1] = math.floor(tonumber(s or '0') / SHIFT)
    local ends = 0
    if q[i] then
      local _, e = split(q[i])
      ends = tonumber(e)
    end
    out[2 * i] = ends
  end
end
return out
