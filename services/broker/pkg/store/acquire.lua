-- Leases the least-loaded proxy of index h that is not cooling down for
-- target (for everyone, or for the caller by its own reports) and is
-- below cap, a uniformly random one among ties; with a
-- session key, the proxy the key last had while it still qualifies (the
-- key lingers SESSION_LINGER past its last lease).
-- Batched (see store.go's batched): ARGV holds any number of requests,
-- each h, target, cap (0: none), ttl_ms, lease_id, random, request_id,
-- fingerprint, target_cap (0: none), session, per_target ('1': count the
-- target's live leases, honour its cap and pacing, keep sessions), caller
-- (the tenant's name; '' for none), caller_cap (its most live leases, 0:
-- none), caller_rate (its most leases a minute, fleet-wide, 0: none);
-- each is decided in turn, as if alone, and answered with one of:
-- {'ok', proxy, expires_ms, load, lease_id, moved}: the lease (a
--   retry of a committed call, by lease id or request id, returns the same
--   one); moved is 1 when the session's proxy no longer qualified;
-- {'none', candidates, cooling, at_cap}; {'noindex'}; {'reused', lease_id}
--   when request_id was given with other parameters; {'stale', proxy} when
--   the index disagrees with the proxy's cooldowns (the caller rebuilds it);
-- {'tcap', live} when the target has its cap of live leases;
-- {'paced', retry_ms, rate} when the target's pace allows no lease now;
-- {'ccap', live} when the caller holds its cap of live leases;
-- {'crate', wait_ms} when the caller took its leases this minute.
local function one(h, target, cap, ttl, id, rnd, req, fp, tcap, sess, per_target, caller, ccap, crate)
cap, ttl, rnd, tcap, ccap, crate = tonumber(cap), tonumber(ttl), tonumber(rnd), tonumber(tcap), tonumber(ccap), tonumber(crate)
per_target = per_target == '1'
local now = NOW

local function granted(lid, l)
  local s = tonumber(redis.call('HGET', K.Score, l[1]) or '0')
  return {'ok', l[1], tonumber(l[2]), math.floor(s / SHIFT), lid, 0}
end
local l = live_lease(id, now)
if l then
  return granted(id, l)
end
if req ~= '' then
  local v = redis.call('GET', K.Request .. req)
  if v then
    local lid, f = split(v)
    if f ~= fp then
      return {'reused', lid}
    end
    l = live_lease(lid, now)
    if l then
      return granted(lid, l)
    end
  end
end

if caller ~= '' and ccap > 0 then
  local n = tonumber(redis.call('HGET', K.Tokens, caller) or '0')
  if n >= ccap then
    return {'ccap', n}
  end
end
-- A fixed window per minute: the count is one key, read and bumped here.
local rk
if caller ~= '' and crate > 0 then
  rk = K.TenantRate .. caller .. ':' .. math.floor(now / 60000)
  if tonumber(redis.call('GET', rk) or '0') >= crate then
    return {'crate', 60000 - now % 60000}
  end
end
local ix, cx = K.Index .. h, K.CoolingIndex .. h .. ':' .. target
-- The caller's own cooldowns for the target (lib.lua's MINE): members not
-- cooling for everyone that its own reports cooled; nl of them.
local mine, lx, nl = nil, nil, 0
if caller ~= '' and target ~= '' then
  mine = mine_of(target, caller)
  lx = K.CoolingIndex .. h .. ':' .. mine
  nl = redis.call('ZCARD', lx)
end
local counted = per_target and target ~= ''
-- GCRA: a lease is due every 1000/rate ms, with up to a second's worth
-- early (a burst of rate leases after a quiet second).
local tat
if counted then
  local t = redis.call('HMGET', K.Target .. target, 'n', 'rate', 'tat', 'until')
  if tcap > 0 and tonumber(t[1] or '0') >= tcap then
    return {'tcap', tonumber(t[1])}
  end
  local rate = pace_live(target, t[2], t[4], now)
  if rate then
    local interval = 1000 / rate
    local early = math.max(1000 - interval, 0)
    tat = math.max(tonumber(t[3] or now), now)
    if tat - now > early then
      return {'paced', math.ceil(tat - early - now), tostring(rate)}
    end
    tat = tat + interval
  end
end

-- How many members of the cooling indexes score in [lo, hi].
local function cooling_in(lo, hi)
  local n = redis.call('ZCOUNT', cx, lo, hi)
  if nl > 0 then
    n = n + redis.call('ZCOUNT', lx, lo, hi)
  end
  return n
end

local function is_cooling(m)
  return redis.call('ZSCORE', cx, m) or (nl > 0 and redis.call('ZSCORE', lx, m))
end

-- free(i): how many of the members ranked 0..i are not cooling (nc > 0).
local function free(i)
  local sc = redis.call('ZRANGE', ix, i, i, 'WITHSCORES')[2]
  return i + 1 - cooling_in('-inf', sc)
end

-- The smallest rank in [lo, hi] (hi below the index's size) with
-- free(rank) >= want.
local function search(lo, hi, want)
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if free(mid) >= want then
      hi = mid
    else
      lo = mid + 1
    end
  end
  return lo
end

-- A uniformly random free member among the tied members ranked from first
-- on (every member ranked below first cools down for the target).
local function tied_member(first, tied, cooling)
  if cooling == 0 then
    local k = rnd % tied
    return redis.call('ZRANGE', ix, first + k, first + k)[1]
  end
  -- Draw until a free one comes up: uniform, and cheap unless nearly
  -- all of them cool down; then count instead.
  math.randomseed(rnd % 2147483647)
  for _ = 1, 8 do
    local r = first + math.random(0, tied - 1)
    local m = redis.call('ZRANGE', ix, r, r)[1]
    if not is_cooling(m) then
      return m
    end
  end
  local k = rnd % (tied - cooling)
  local i = search(first, first + k + cooling, 1 + k)
  return redis.call('ZRANGE', ix, i, i)[1]
end

local function refusal(nc)
  local n, full = redis.call('ZCARD', ix), 0
  if cap > 0 then
    full = redis.call('ZCOUNT', ix, num(cap * SHIFT), '+inf')
    if nc > 0 then
      full = full - cooling_in(num(cap * SHIFT), '+inf')
    end
  end
  return {'none', n, nc, full}
end

-- Walks up the load levels from the least loaded to the first that has a
-- member free for the target; past a few levels where every member cools
-- down, a binary search over ranks finds it in O(log² n).
local function pick()
  local at = redis.call('ZRANGE', ix, 0, 0, 'WITHSCORES')
  if #at == 0 then
    if redis.call('HEXISTS', K.Indexes, h) == 0 then
      return nil, {'noindex'}
    end
    return nil, {'none', 0, 0, 0}
  end
  local nc = 0
  if target ~= '' then
    nc = redis.call('ZCARD', cx) + nl
  end
  local first = 0
  for step = 1, 9 do
    if step == 9 then
      local n = redis.call('ZCARD', ix)
      if free(n - 1) == 0 then
        return nil, refusal(nc)
      end
      first = search(first, math.min(first + nc, n - 1), 1)
      at = redis.call('ZRANGE', ix, first, first, 'WITHSCORES')
    end
    local level = math.floor(tonumber(at[2]) / SHIFT)
    if cap > 0 and level >= cap then
      return nil, refusal(nc)
    end
    local lo, hi = at[2], '(' .. num((level + 1) * SHIFT)
    local tied, cooling = redis.call('ZCOUNT', ix, lo, hi), 0
    if nc > 0 then
      cooling = cooling_in(lo, hi)
    end
    if tied > cooling then
      return tied_member(first, tied, cooling), nil
    end
    first = first + tied
    at = redis.call('ZRANGE', ix, first, first, 'WITHSCORES')
    if #at == 0 then
      return nil, refusal(nc)
    end
  end
end

local function cooling(uid)
  if target == '' then
    return false
  end
  local c = redis.call('HMGET', K.Cooling .. uid, target, mine or target)
  return tonumber(c[1] or '0') > now or tonumber(c[2] or '0') > now
end

-- The session's proxy, while it is in the index, below the cap and not
-- cooling down for the target.
local uid, refused, moved = nil, nil, 0
if per_target and sess ~= '' then
  local was = redis.call('HGET', K.Session .. sess, 'proxy')
  if was then
    local sc = redis.call('ZSCORE', ix, was)
    if sc and (cap == 0 or math.floor(tonumber(sc) / SHIFT) < cap) and not cooling(was) then
      uid = was
    else
      moved = 1
    end
  end
end
if not uid then
  uid, refused = pick()
  if refused and refused[1] == 'none' and MORE then
    -- Expiries still due may be what holds proxies at the cap: apply them all.
    while drain(now, DRAIN) do end
    MORE = false
    uid, refused = pick()
  end
  if refused then
    return refused
  end
  if cooling(uid) then
    return {'stale', uid}
  end
end
local expires = now + ttl
local f = {'proxy', uid, 'target', target, 'expires', expires, 'req', req,
  'addr', redis.call('HGET', K.Address, uid) or '', 'ix', h, 'at', now}
if counted then
  f[#f + 1], f[#f + 2] = 'ct', target
  redis.call('HINCRBY', K.Target .. target, 'n', 1)
  if tat then
    redis.call('HSET', K.Target .. target, 'tat', tat)
  end
end
if caller ~= '' then
  f[#f + 1], f[#f + 2] = 'tok', caller
  redis.call('HINCRBY', K.Tokens, caller, 1)
end
if rk then
  redis.call('INCR', rk)
  redis.call('PEXPIRE', rk, 120000)
end
if per_target and sess ~= '' then
  f[#f + 1], f[#f + 2] = 'sess', sess
  local sk = K.Session .. sess
  redis.call('HSET', sk, 'proxy', uid)
  redis.call('HINCRBY', sk, 'n', 1)
  redis.call('PERSIST', sk)
  -- What a report naming the session and the target acts on (the
  -- gateway's tunnels carry no lease id the client could name): this
  -- lease's proxy, index and grant time. HLEN counts proxy and n too.
  local tk = 't:' .. target
  if target ~= '' and (redis.call('HEXISTS', sk, tk) == 1 or redis.call('HLEN', sk) < SESSION_TARGETS + 2) then
    redis.call('HSET', sk, tk, uid .. '|' .. h .. '|' .. now)
  end
end
redis.call('HSET', K.Lease .. id, unpack(f))
redis.call('SADD', K.ProxyLeases .. uid, id)
redis.call('ZADD', DUE, expires, 'l|' .. id .. '|' .. uid)
if req ~= '' then
  redis.call('SET', K.Request .. req, id .. '|' .. fp, 'PXAT', expires)
end
return {'ok', uid, expires, add_load(uid, 1), id, moved}
end
