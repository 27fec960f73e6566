-- Ends leases. Batched (see store.go's batched): ARGV holds any number of
-- (lease_id, owner) pairs; each is answered 1 when a live lease was
-- released, 0 when there was none, -1 when another tenant than owner
-- holds it (it stays).
local function one(id, owner)
  local l = live_lease(id, NOW)
  if not l then
    return 0
  end
  if (l[10] or '') ~= owner then
    return -1
  end
  close_lease(id, l[1], l[4], l[8], l[9], l[10])
  return 1
end
