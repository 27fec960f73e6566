-- A live lease, judged by Redis's clock. ARGV: lease_id.
-- Returns {proxy, target, expires_ms, address, owner}, or an empty list.
local l = live_lease(ARGV[1], now_ms())
if not l then
  return {}
end
return {l[1], l[3], tonumber(l[2]), l[5] or '', l[10] or ''}
