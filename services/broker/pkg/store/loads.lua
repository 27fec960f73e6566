-- Live lease counts and quarantines (0: none) of proxies, after applying
-- what is due. ARGV: proxies... Returns {load, quarantine start,
-- quarantine end} triples, flattened.
drain(now_ms(), DRAIN)
local out = {}
if #ARGV > 0 then
  local q = redis.call('HMGET', P .. 'quar', unpack(ARGV))
  for i, s in ipairs(redis.call('HMGET', P .. 'score', unpack(ARGV))) do
    local from, ends = 0, 0
    if q[i] then
      from, ends = split(q[i])
    end
    out[3 * i - 2] = math.floor(tonumber(s or '0') / SHIFT)
    out[3 * i - 1] = tonumber(from)
    out[3 * i] = tonumber(ends)
  end
end
return out
