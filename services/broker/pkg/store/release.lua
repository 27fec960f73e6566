-- Ends a lease. ARGV: lease_id. Returns 1 when a live lease was released.
local id = ARGV[1]
local _, l = open_lease(id)
if not l then
  return 0
end
close_lease(id, l[1], l[4], l[8], l[9], l[10])
return 1
