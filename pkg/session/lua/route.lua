local now = redisNowMS()
local n = tonumber(ARGV[2])
if n > 0 then
  redis.call('HSET', KEYS[K.route], ARGV[1], n)
  redis.call('HSET', KEYS[K.stamps], ARGV[1], now)
else
  redis.call('HDEL', KEYS[K.route], ARGV[1])
  redis.call('HDEL', KEYS[K.stamps], ARGV[1])
end
-- Dropped entries are remembered for twice the route's TTL, as long as
-- gateways pass an instance dead that long in their writes.
forgetDropped(K.stamps, ARGV[1], now, 2 * tonumber(ARGV[3]))
for i = 12, #ARGV - 1, 2 do
  dropDeadRoute(K.route, K.stamps, ARGV[i], tonumber(ARGV[i + 1]), now)
end
local total = 0
for _, v in ipairs(redis.call('HVALS', KEYS[K.route])) do total = total + (tonumber(v) or 0) end
if total > 0 then
  redis.call('PEXPIRE', KEYS[K.route], ARGV[3])
  redis.call('PEXPIRE', KEYS[K.stamps], ARGV[3])
end
-- Whether the user's inbox holds anything, read after the write: a guide
-- kept before it is there. A connect with an empty inbox skips its take;
-- a guide kept after it is offered to the connection by its keeper (the
-- gateway's keep), or refused by a route check that sees the count rise
-- (inbox_keep.lua).
local inbox = redis.call('EXISTS', KEYS[K.inbox])
if ARGV[4] ~= '1' or total > 0 then return {total, 0, inbox} end
local uid = ARGV[5]
local at = now - tonumber(ARGV[7])
if tonumber(redis.call('GET', KEYS[K.renewed]) or '0') > at then return {total, 0, inbox} end
redis.call('SET', KEYS[K.renewed], at, 'PX', tonumber(ARGV[6]))
redis.call('DEL', KEYS[K.session])
redis.call('ZREM', KEYS[K.index], uid)
redis.call('HDEL', KEYS[K.segments], uid)
redis.call('HDEL', KEYS[K.via], uid)
if redis.call('ZREM', KEYS[K.hold], uid) == 1 then holdCancelled(K, 8, holdNoteEnded) end
redis.call('HDEL', KEYS[K.held], uid)
redis.call('HDEL', KEYS[K.stage], uid)
return {total, 1, inbox}
