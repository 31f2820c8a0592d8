local now = redisNowMS()
local v = redis.call('GET', KEYS[K.dedup])
local state, arg = nil, nil
if v then state, arg = decodeDedup(v) end
local function claim(n)
  redis.call('SET', KEYS[K.dedup], ARGV[1], 'PX', tonumber(ARGV[3]))
  return encodeDedup(V.outFresh, n or 0)
end
if not v or v == ARGV[1] then return claim(0) end
if state == V.retry then return claim(tonumber(arg) or 0) end
if state == V.claimed then return V.outBusy end
-- A bare produced is the value of a release before the deadline was
-- named in it.
if v == V.produced or v == encodeDedup(V.produced, ARGV[2]) or v == encodeDedup(V.stale, ARGV[2]) then
  return V.outDone
end
if v == encodeDedup(V.spooled, ARGV[2]) then return V.outSpooled end
if state == V.stale then return claim() end
local windowEnd = (math.floor(tonumber(ARGV[4] or ARGV[2]) / 60000) + 1) * 60000
if now >= windowEnd then return claim() end
return V.outDefer
