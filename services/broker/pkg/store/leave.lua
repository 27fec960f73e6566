-- Takes a proxy out of selector indexes (all of them when none are named);
-- with forget = '1' also ends its leases and drops everything kept about
-- it: the Proxy is gone.
-- What is kept about its exit IP's cooldowns stays, for a proxy that
-- lands on the same IP. ARGV: proxy, forget, index hashes...
local uid = ARGV[1]
if ARGV[2] == '1' then
  -- Its leases end with it: a lease on a proxy that is gone serves nobody,
  -- and would hold its target's and session's counts until it expired.
  -- (end_lease empties pl:<uid>, and Redis deletes an empty set.)
  for _, id in ipairs(redis.call('SMEMBERS', K.ProxyLeases .. uid)) do
    local f = redis.call('HMGET', K.Lease .. id, 'req', 'ct', 'sess', 'tok')
    close_lease(id, uid, f[1], f[2], f[3], f[4])
  end
end
local targets = redis.call('HKEYS', K.Cooling .. uid)
if #ARGV > 2 then
  for i = 3, #ARGV do
    leave(uid, ARGV[i], targets)
    redis.call('SREM', K.Rejoin .. uid, ARGV[i])
  end
else
  for _, k in ipairs(redis.call('SMEMBERS', K.Holders .. uid)) do
    redis.call('ZREM', P .. k, uid)
  end
  redis.call('DEL', K.Holders .. uid, K.Rejoin .. uid)
end
if ARGV[2] == '1' then
  for _, t in ipairs(targets) do
    redis.call('ZREM', DUE, 'c|' .. uid .. '|' .. t)
  end
  local ck = redis.call('HGET', K.CooldownKey, uid)
  if ck then
    redis.call('SREM', K.Filed .. ck, uid)
  end
  -- No other proxy is filed under its own key.
  redis.call('DEL', K.Cooldown .. 'p:' .. uid, K.Filed .. 'p:' .. uid)
  redis.call('ZREM', DUE, 'q|' .. uid .. '|')
  redis.call('HDEL', K.Quarantine, uid)
  redis.call('DEL', K.Cooling .. uid, K.Holders .. uid, K.Rejoin .. uid, K.Errors .. uid)
  for _, k in ipairs({K.Score, K.Namespace, K.Address, K.CooldownKey}) do
    redis.call('HDEL', k, uid)
  end
end
return 1
