-- What an operator asks of proxies, read without changing anything (so
-- what is due but not yet applied is filtered by the clock instead).
-- ARGV: what ('leases' or 'cooldowns'), target ('' for every target),
-- tenant ('*' for every tenant's own cooldowns too, '' for the fleet's
-- alone, else the fleet's and that tenant's), proxies...
-- Returns one list per proxy: for leases, {id, target, tenant, session,
-- granted, expires} sextuples; for cooldowns, {field, end, level, start,
-- key} quintuples, field being the target or target#tenant.
local now = now_ms()
local what, target, who = ARGV[1], ARGV[2], ARGV[3]
local out = {}

local function leases(uid)
  local list = {}
  for _, id in ipairs(redis.call('SMEMBERS', K.ProxyLeases .. uid)) do
    local l = live_lease(id, now)
    if l then
      local n = #list
      list[n + 1], list[n + 2], list[n + 3] = id, l[3] or '', l[10] or ''
      list[n + 4], list[n + 5], list[n + 6] = l[9] or '', tonumber(l[7] or '0'), tonumber(l[2])
    end
  end
  return list
end

local function cooldowns(uid)
  local list = {}
  local c = redis.call('HGETALL', K.Cooling .. uid)
  local ck
  for j = 1, #c, 2 do
    local field, ends = c[j], tonumber(c[j + 1])
    local base, tenant = split_mine(field)
    if ends > now and (target == '' or base == target) and (not tenant or who == '*' or tenant == who) then
      ck = ck or redis.call('HGET', K.CooldownKey, uid) or ('p:' .. uid)
      local lv, st = 0, 0
      local r = redis.call('HGET', K.Cooldown .. ck, field)
      if r then
        local _, l, s = string.match(r, '^(%d+)|(%d+)|(%d+)$')
        lv, st = tonumber(l or '0'), tonumber(s or '0')
      end
      local n = #list
      list[n + 1], list[n + 2], list[n + 3], list[n + 4], list[n + 5] = field, ends, lv, st, ck
    end
  end
  return list
end

for i = 4, #ARGV do
  if what == 'leases' then
    out[#out + 1] = leases(ARGV[i])
  else
    out[#out + 1] = cooldowns(ARGV[i])
  end
end
return out
