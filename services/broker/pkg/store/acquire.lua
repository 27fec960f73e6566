-- Leases the least-loaded proxy of index h that is not cooling down for
-- target and is below cap, a uniformly random one among ties.
-- ARGV: h, target, cap (0: none), ttl_ms, lease_id, random, request_id, fingerprint.
-- Returns {'ok', proxy, expires_ms, load, lease_id}: the lease (a retry of a
--   committed call, by lease id or request id, returns the same one);
-- {'none', candidates, cooling, at_cap}; {'noindex'}; {'reused', lease_id}
--   when request_id was given with other parameters; {'stale', proxy} when
--   the index disagrees with the proxy's cooldowns (the caller rebuilds it).
local h, target, cap, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local id, rnd, req, fp = ARGV[5], tonumber(ARGV[6]), ARGV[7], ARGV[8]
local now = now_ms()

local function granted(lid, l)
  return {'ok', l[1], tonumber(l[2]), tonumber(redis.call('HGET', P .. 'load', l[1]) or '0'), lid}
end
local l = live_lease(id, now)
if l then
  return granted(id, l)
end
if req ~= '' then
  local v = redis.call('GET', P .. 'req:' .. req)
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

local more = drain(now, DRAIN)
if redis.call('HEXISTS', P .. 'ixs', h) == 0 then
  return {'noindex'}
end
redis.call('ZADD', P .. 'ixused', now, h)
local ix, cx = P .. 'ix:' .. h, P .. 'cx:' .. h .. ':' .. target

local function pick()
  local n = redis.call('ZCARD', ix)
  if n == 0 then
    return nil, {'none', 0, 0, 0}
  end
  local nc = 0
  if target ~= '' then
    nc = redis.call('ZCARD', cx)
  end
  local function score(i)
    return tonumber(redis.call('ZRANGE', ix, i, i, 'WITHSCORES')[2])
  end
  -- free(i): how many of the members ranked 0..i are not cooling.
  local function free(i)
    if nc == 0 then
      return i + 1
    end
    return i + 1 - redis.call('ZCOUNT', cx, '-inf', num(score(i)))
  end
  -- The smallest rank in [lo, hi] with free(rank) >= want, or nil.
  local function search(lo, hi, want)
    if hi > n - 1 then
      hi = n - 1
    end
    if free(hi) < want then
      return nil
    end
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
  local first = search(0, nc, 1)
  if not first then
    return nil, {'none', n, nc, 0}
  end
  local level = math.floor(score(first) / SHIFT)
  if cap > 0 and level >= cap then
    local full = redis.call('ZCOUNT', ix, num(cap * SHIFT), '+inf')
    if nc > 0 then
      full = full - redis.call('ZCOUNT', cx, num(cap * SHIFT), '+inf')
    end
    return nil, {'none', n, nc, full}
  end
  local lo, hi = num(level * SHIFT), '(' .. num((level + 1) * SHIFT)
  local tied, tied_cooling = redis.call('ZCOUNT', ix, lo, hi), 0
  if nc > 0 then
    tied_cooling = redis.call('ZCOUNT', cx, lo, hi)
  end
  local k = rnd % (tied - tied_cooling)
  local i = search(first, first + k + tied_cooling, 1 + k)
  return redis.call('ZRANGE', ix, i, i)[1], nil
end

local uid, refused = pick()
if refused and more then
  -- Expiries still due may be what holds proxies at the cap: apply them all.
  while drain(now, DRAIN) do end
  uid, refused = pick()
end
if refused then
  return refused
end
if target ~= '' and tonumber(redis.call('HGET', P .. 'cool:' .. uid, target) or '0') > now then
  return {'stale', uid}
end
local expires = now + ttl
local lease = P .. 'lease:' .. id
redis.call('HSET', lease, 'proxy', uid, 'target', target, 'expires', expires, 'req', req,
  'addr', redis.call('HGET', P .. 'addr', uid) or '')
redis.call('PEXPIREAT', lease, expires)
redis.call('ZADD', P .. 'exp', expires, id .. '|' .. uid)
if req ~= '' then
  redis.call('SET', P .. 'req:' .. req, id .. '|' .. fp, 'PXAT', expires)
end
return {'ok', uid, expires, add_load(uid, 1), id}
