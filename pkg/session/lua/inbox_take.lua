local now = redisNowMS()
local renewed = tonumber(redis.call('GET', KEYS[K.renewed]) or '0') or 0
local limit, lease = tonumber(ARGV[1]), tonumber(ARGV[2])
local ago, ttl = tonumber(ARGV[3]) or -1, tonumber(ARGV[4]) or 0
local present = tonumber(ARGV[5]) or 0
local since = tonumber(ARGV[6]) or 0
if ago >= 0 then present = math.max(present, now - ago + ttl) end
local items = redis.call('LRANGE', KEYS[K.inbox], 0, -1)
local out, dropped = {present}, {{}, {}, {}} -- dropped: stale, expired, superseded
for i = #items, 1, -1 do
  -- An entry of a gateway before kept_ms has no times: it is handed
  -- over; one that is no JSON object has no id either.
  local id, asked, kept, exp, closed = decodeInboxEntry(items[i])
  local drop = 0
  if not asked or asked <= 0 then asked = kept end
  if closed then asked = closed end
  -- A close applied elsewhere is stale by a renewal after it, but not
  -- for a connection open since before it: that device was there, and
  -- was never told (its own pings renew too). Stale for this one, it is
  -- left, not dropped (-1): a device open since before it, here or on
  -- another instance, may be owed it still, and takes it when offered;
  -- else it goes at its expiry.
  local told = closed and since > 0 and since <= closed
  if exp and exp <= now then
    -- A close left so, past its expiry, goes as stale: the user was
    -- there after it, and no device open since before it took it.
    drop = (closed and asked and renewed > asked and not told) and 1 or 2
  elseif asked and renewed > asked and not told then drop = closed and -1 or 1
  elseif asked and not closed and present > asked then drop = 3 end
  if drop > 0 then
    redis.call('LREM', KEYS[K.inbox], 1, items[i])
    if id then redis.call('HDEL', KEYS[K.leases], id) end
    local d = dropped[drop]
    d[#d + 1] = items[i]
  elseif drop == 0 and #out - 1 < limit then
    local held = 0
    if id then held = tonumber(redis.call('HGET', KEYS[K.leases], id) or '0') or 0 end
    if held <= now then
      out[#out + 1] = items[i]
      if id then redis.call('HSET', KEYS[K.leases], id, now + lease) end
    end
  end
end
if #out > 1 and redis.call('PTTL', KEYS[K.leases]) < lease then redis.call('PEXPIRE', KEYS[K.leases], lease) end
local res = {#dropped[1], #dropped[2], out[1], #dropped[3]}
for _, d in ipairs(dropped) do
  for _, v in ipairs(d) do res[#res + 1] = v end
end
for i = 2, #out do res[#res + 1] = out[i] end
return res
