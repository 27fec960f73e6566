-- Applies an outcome report on a live lease: every decision about the
-- proxy, its exit IP and the target in one script, so reports racing from
-- any number of brokers never double a cooldown or cut a pace twice.
-- ARGV: lease_id, result (ok, rate_limited, blocked, error,
-- target_error: the site's failure, which changes nothing), target,
-- cooldown base_ms, max_ms, window_ms, max_cooling_fraction, pacing
-- initial, min, max (leases/s), error window_ms,
-- error targets (0: never quarantine), quarantine_ms, random in [0, 1),
-- max quarantined fraction (0 or 1: no limit), session (with lease_id '':
-- the report is on the session's last lease for target), owner (the
-- reporting tenant: a lease another tenant holds fails with "EPOWNER"),
-- trusted ('1': the owner's reports count for every tenant at once).
--
-- An untrusted tenant's reports weigh for itself first (lib.lua's MINE):
-- its ban cools the proxy's exit for the target for it alone, until
-- another tenant reports a ban on that exit and target within the memory
-- window (then the ban is the fleet's, as a trusted one is); its error
-- cools the proxy for the target for it alone, and counts toward
-- quarantine only beside another tenant's errors or a trusted one's.
-- An untrusted ok decays only its own record and leaves the pace alone.
-- So one tenant's false reports cost that tenant, not the fleet.
-- Returns {} when the lease is gone, else {cooldown start_ms, end_ms,
-- level, proxies sharing it, quarantine end_ms, pace rate ('' unpaced),
-- actions...}. A report counts only for its lease's target: a lease taken
-- for no target is bound to the first one a report names, and a report
-- naming another fails with "EPTARGET <the lease's target>".
local id, result, target = ARGV[1], ARGV[2], ARGV[3]
local base, maxd, window = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local fraction = tonumber(ARGV[7])
local pinit, pmin, pmax = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
local ewindow, etargets, qperiod = tonumber(ARGV[11]), tonumber(ARGV[12]), tonumber(ARGV[13])
local rnd, qfraction = tonumber(ARGV[14]), tonumber(ARGV[15])
local sess, owner = ARGV[16], ARGV[17]
local trusted = ARGV[18] == '1' or owner == '' or target == ''
local mine = mine_of(target, owner)
local now, l
if id ~= '' then
  now, l = open_lease(id)
  if l and (l[10] or '') ~= owner then
    return redis.error_reply('EPOWNER')
  end
else
  -- A report on a session: its last lease for the target, live or
  -- ended within the session's linger.
  now = now_ms()
  drain(now, DRAIN)
  local r = redis.call('HGET', K.Session .. sess, 't:' .. target)
  if r then
    local u, ix, at = string.match(r, '^(.*)|(.*)|(%d+)$')
    l = {u, nil, target, nil, nil, ix, at}
  end
end
if not l then
  return {}
end
if result ~= '' and id ~= '' then
  if l[3] == '' then
    redis.call('HSET', K.Lease .. id, 'target', target)
  elseif l[3] ~= target then
    return redis.error_reply('EPTARGET ' .. l[3])
  end
end
local uid, h, granted = l[1], l[6], tonumber(l[7] or '0')
local out = {0, 0, 0, 0, 0, ''}
local function did(action)
  out[#out + 1] = action
end

local ck = redis.call('HGET', K.CooldownKey, uid) or ('p:' .. uid)
local cdk = K.Cooldown .. ck
-- The key's record for the target (or for the owner's own view of it,
-- mine): the last cooldown's end, level and start ("<end>|<level>|<start>").
local function record(t)
  local r = redis.call('HGET', cdk, t)
  if not r then
    return nil
  end
  local e, lv, st = string.match(r, '^(%d+)|(%d+)|(%d+)$')
  return tonumber(e), tonumber(lv), tonumber(st)
end

-- The proxies filed under ck; a proxy no join has filed yet (its Proxy
-- unchanged since the broker's upgrade) stands alone.
local function sharing()
  local us = redis.call('SMEMBERS', K.Filed .. ck)
  if #us == 0 then
    us = {uid}
  end
  return us
end

local rate, cut = nil, nil
if target ~= '' then
  local t = redis.call('HMGET', K.Target .. target, 'rate', 'cut', 'until')
  rate, cut = pace_live(target, t[1], t[3], now), tonumber(t[2])
end

-- Halves the pace, once per burst: reports on leases granted before the
-- last cut were sent at the old rate, and say nothing new.
local function slow_down()
  if granted < cut then
    did('PACE_HELD')
    return
  end
  rate = math.max(pmin, rate / 2)
  pace_set(target, rate, now, window, true)
  did('PACE_CUT')
end

-- How many more members of the lease's index a cooldown on ck would
-- take out for the target, and whether that passes the fraction.
local function guard_holds()
  if fraction >= 1 or not h then
    return false
  end
  local ix, cx = K.Index .. h, K.CoolingIndex .. h .. ':' .. target
  local n = redis.call('ZCARD', ix)
  if n == 0 then
    return false
  end
  local more = 0
  for _, u in ipairs(sharing()) do
    if redis.call('ZSCORE', ix, u) and not redis.call('ZSCORE', cx, u) then
      more = more + 1
    end
  end
  -- One proxy may always cool down: a fleet of one is not a waterfall.
  return more > 0 and redis.call('ZCARD', cx) + more > math.max(1, math.floor(fraction * n))
end

-- Cools ck down for t (the target, or the owner's own view of it): the
-- base period, or, within the memory window of the last cooldown's end,
-- one level up: a uniformly random period between the last level's and
-- twice it, at most the maximum.
local function cool_down(t, last_end, last_level)
  local level = 0
  if last_end and now - last_end <= window then
    level = math.min(last_level + 1, 40)
  end
  local d = base
  if level > 0 then
    local lo = base * 2 ^ (level - 1)
    d = math.min(maxd, lo + rnd * lo)
  end
  local ends = now + math.floor(d)
  redis.call('HSET', cdk, t, ends .. '|' .. level .. '|' .. now)
  if redis.call('PTTL', cdk) < ends - now + window then
    redis.call('PEXPIRE', cdk, ends - now + window)
  end
  local shared = sharing()
  for _, u in ipairs(shared) do
    cool(u, t, ends, now)
  end
  out[1], out[2], out[3], out[4] = now, ends, level, #shared
  did(level == 0 and 'COOLDOWN_STARTED' or 'COOLDOWN_ESCALATED')
end

-- Whether an untrusted owner's ban stands alone: no other tenant reported
-- one on this exit and target within the memory window. claim:<ck> keeps
-- per target the last lone reporter, or '*' once two tenants agreed:
-- from then on, within the window, every tenant's ban there is the
-- fleet's.
local function alone()
  if trusted then
    return false
  end
  local ak = K.Claim .. ck
  local c = redis.call('HGET', ak, target)
  local who, at = nil, 0
  if c then
    who, at = split(c)
  end
  local agreed = who and who ~= owner and now - tonumber(at) <= window
  redis.call('HSET', ak, target, (agreed and '*' or owner) .. '|' .. now)
  redis.call('PEXPIRE', ak, window)
  return not agreed
end

-- Answers with the cooldown found running (so racing reports cannot
-- double it).
local function running(st, e, lv)
  out[1], out[2], out[3], out[4] = st, e, lv, #sharing()
  did('COOLDOWN_ACTIVE')
end

-- Cools ck down for the owner alone (its own view of the target).
local function cool_mine()
  local e, lv, st = record(mine)
  if e and e > now then
    running(st, e, lv)
  else
    cool_down(mine, e, lv)
  end
  did('TENANT_ONLY')
end

-- Whether the proxy's errors in the window (members "<target>", or
-- "<target>#<tenant>" for an untrusted tenant's) are on enough targets,
-- and reported by a trusted tenant or by two tenants.
local function faulty(members)
  local targets, tenants, nt, nn, sure = {}, {}, 0, 0, false
  for _, m in ipairs(members) do
    local t, who = split_mine(m)
    if not targets[t] then
      targets[t], nt = true, nt + 1
    end
    if not who then
      sure = true
    elseif not tenants[who] then
      tenants[who], nn = true, nn + 1
    end
  end
  return nt >= etargets and (sure or nn >= 2)
end

-- Whether quarantining one more member of the lease's index would put
-- more than qfraction of its proxies in quarantine at once (one may
-- always go: a fleet of one is not an outbreak).
-- Quarantines are rare (a proxy's errors on several targets), so the
-- count walks the quarantined proxies rather than keeping a second record
-- of them per index that every leave and join would have to mend.
local function quarantine_held()
  if qfraction <= 0 or qfraction >= 1 or not h then
    return false
  end
  local out_now = 0
  for _, u in ipairs(redis.call('HKEYS', K.Quarantine)) do
    out_now = out_now + redis.call('SISMEMBER', K.Rejoin .. u, h)
  end
  local total = redis.call('ZCARD', K.Index .. h) + out_now
  return out_now + 1 > math.max(1, math.floor(qfraction * total))
end

if result == 'ok' then
  local t = trusted and target or mine
  local e, lv, st = record(t)
  if e and lv > 0 then
    redis.call('HSET', cdk, t, e .. '|' .. (lv - 1) .. '|' .. st)
    did('COOLDOWN_DECAYED')
  end
  if rate and trusted then
    -- Additive increase: about one lease/s more per second of ok reports
    -- at the current rate; below 1/s each ok doubles it.
    rate = rate + math.min(rate, 1 / rate)
    if rate >= pmax then
      pace_end(target)
      rate = nil
      did('PACING_ENDED')
    else
      pace_set(target, rate, now, window, false)
      did('PACE_RAISED')
    end
  end
elseif (result == 'rate_limited' or result == 'blocked') and alone() then
  cool_mine()
elseif result == 'rate_limited' or result == 'blocked' then
  local e, lv, st = record(target)
  if rate and result == 'rate_limited' then
    slow_down() -- the target throttles the fleet, not this proxy
  elseif e and e > now then
    running(st, e, lv)
  elseif guard_holds() then
    did('GUARD_HELD')
    if rate then
      slow_down()
    else
      rate = pinit
      pace_set(target, rate, now, window, true)
      did('PACING_STARTED')
    end
  else
    cool_down(target, e, lv)
  end
elseif result == 'error' then
  local ek = K.Errors .. uid
  redis.call('ZADD', ek, now, trusted and target or mine)
  redis.call('ZREMRANGEBYSCORE', ek, '-inf', now - ewindow)
  redis.call('PEXPIRE', ek, ewindow)
  -- A session does not stay on a proxy that failed it: its next lease
  -- picks another (the gateway's retry relies on it).
  if id ~= '' then
    local s = redis.call('HGET', K.Lease .. id, 'sess')
    if s and redis.call('HGET', K.Session .. s, 'proxy') == uid then
      redis.call('HDEL', K.Session .. s, 'proxy')
    end
  end
  if not trusted then
    cool_mine() -- the owner's next lease for the target goes elsewhere
  end
  local q = redis.call('HGET', K.Quarantine, uid)
  if q then
    local _, qe = split(q)
    out[5] = tonumber(qe)
  elseif etargets > 0 and redis.call('ZCARD', ek) >= etargets and faulty(redis.call('ZRANGE', ek, 0, -1)) then
    if quarantine_held() then
      -- Like MachineHealthCheck's maxUnhealthy: this many faults at once
      -- say more about the reporters, or the network, than the proxies.
      did('QUARANTINE_HELD')
    else
      quarantine(uid, now, now + qperiod)
      redis.call('DEL', ek)
      out[5] = now + qperiod
      did('QUARANTINED')
    end
  end
end
if rate then
  out[6] = tostring(rate)
end
if #out == 6 then
  did('NONE')
end
return out
