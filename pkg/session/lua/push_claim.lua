local v = redis.call('GET', KEYS[K.delivered])
if v then
  if decodePush(v) == V.claimed then return V.outBusy end
  return V.outDone
end
if redis.call('EXISTS', KEYS[K.pushed]) == 1 then return V.outDone end
local dl = tonumber(ARGV[3])
if dl > 0 and (tonumber(redis.call('GET', KEYS[K.renewed]) or '0') or 0) > dl then return V.outStale end
redis.call('SET', KEYS[K.delivered], encodePush(V.claimed, ARGV[1]), 'PX', ARGV[2])
return V.outFresh
