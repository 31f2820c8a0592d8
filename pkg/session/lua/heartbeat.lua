local now = redisNowMS()
local inst, lease = ARGV[1], tonumber(ARGV[2])
local prev = redis.call('HGET', KEYS[K.alive], inst)
local fresh, gap = false, 0
if prev then
  local last, plen = decodeAlive(prev)
  last, plen = tonumber(last), tonumber(plen)
  if last and now > last + plen then
    redis.call('ZADD', KEYS[K.blind], now, encodeBlind(last, now, V.gatewayGap, inst))
    fresh, gap = true, 1
  end
else
  fresh = true
end
if fresh then
  local all = redis.call('HGETALL', KEYS[K.alive])
  local newest, any = 0, false
  local alive = false
  for i = 1, #all, 2 do
    if all[i] ~= inst then
      local last, plen = decodeAlive(all[i+1])
      last, plen = tonumber(last), tonumber(plen)
      if last then
        any = true
        if plen > 0 and last + plen >= now then alive = true end
        if last > newest then newest = last end
      end
    end
  end
  if any and not alive and newest < now then
    redis.call('ZADD', KEYS[K.blind], now, encodeBlind(newest, now, V.fleetDown, ''))
  end
end
redis.call('HSET', KEYS[K.alive], inst, encodeAlive(now, lease))
return {now, prev and 0 or 1, gap}
