local v = redis.call('GET', KEYS[K.delivered])
if v then
  if decodePush(v) == V.claimed then return V.outBusy end
  return V.outDone
end
if redis.call('EXISTS', KEYS[K.pushed]) == 1 then return V.outDone end
-- A close stage's close, once decided, is what its claim follows:
-- applied (a late reminder went out with it), it goes out however the
-- user renewed since; cancelled, it is stale.
local close = redis.call('GET', KEYS[K.close])
if close == 'cancelled' then return V.outStale end
local dl = tonumber(ARGV[3])
if close ~= 'applied' and dl > 0 and (tonumber(redis.call('GET', KEYS[K.renewed]) or '0') or 0) > dl then return V.outStale end
redis.call('SET', KEYS[K.delivered], encodePush(V.claimed, ARGV[1]), 'PX', ARGV[2])
return V.outFresh
