-- Live lease counts, quarantines (0: none) and, for a target, cooldown
-- ends (0: none) of proxies, after applying what is due. ARGV: target
-- ('' for none), tenant (whose own cooldowns count too; '' for none),
-- proxies... Returns {load, quarantine start, quarantine
-- end, cooldown end} quadruples, flattened.
local now = now_ms()
drain(now, DRAIN)
local target = ARGV[1]
local mine = target
if ARGV[2] ~= '' then
  mine = mine_of(target, ARGV[2])
end
local uids = {unpack(ARGV, 3)}
local out = {}
if #uids > 0 then
  local q = redis.call('HMGET', K.Quarantine, unpack(uids))
  for i, s in ipairs(redis.call('HMGET', K.Score, unpack(uids))) do
    local from, ends = 0, 0
    if q[i] then
      from, ends = split(q[i])
    end
    local cool = 0
    if target ~= '' then
      local c = redis.call('HMGET', K.Cooling .. uids[i], target, mine)
      cool = math.max(tonumber(c[1] or '0'), tonumber(c[2] or '0'))
      if cool <= now then
        cool = 0
      end
    end
    out[4 * i - 3] = math.floor(tonumber(s or '0') / SHIFT)
    out[4 * i - 2] = tonumber(from)
    out[4 * i - 1] = tonumber(ends)
    out[4 * i] = cool
  end
end
return out
