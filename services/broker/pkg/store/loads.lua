-- Live lease counts of proxies, after applying due expiries. ARGV: proxies...
drain(now_ms(), DRAIN)
if #ARGV == 0 then
  return {}
end
return redis.call('HMGET', P .. 'load', unpack(ARGV))
