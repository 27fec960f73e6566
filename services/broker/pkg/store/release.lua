-- Ends leases. Batched (see store.go's batched): ARGV holds any number of
-- lease_ids; each is answered 1 when a live lease was released, else 0.
local function one(id)
  local l = live_lease(id, NOW)
  if not l then
    return 0
  end
  close_lease(id, l[1], l[4], l[8], l[9], l[10])
  return 1
end
