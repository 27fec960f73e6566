-- Ends a lease. ARGV: lease_id. Returns 1 when a live lease was released.
local id = ARGV[1]
local _, l = open_lease(id)
if not l then
  return 0
end
redis.call('ZREM', DUE, 'l|' .. id .. '|' .. l[1])
if l[4] ~= '' then
  redis.call('DEL', P .. 'req:' .. l[4])
end
end_lease(id, l[1], l[8], l[9])
return 1
