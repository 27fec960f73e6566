-- Live lease counts of proxies, after applying due expiries. ARGV: proxies...
drain(now_ms(), DRAIN)
local out = {}
if #ARGV > 0 then
  for i, s in ipairs(redis.call('HMGET', P .. 'score', unpack(ARGV))) do
    out[i] = math.floor(tonumber(s or '0') / SHIFT)
  end
end
return out
