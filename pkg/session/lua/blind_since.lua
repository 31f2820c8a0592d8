local now = redisNowMS()
local start = tonumber(ARGV[1])
if start <= 0 or start > now then start = now end
local m = encodeBlind(start, now, ARGV[2], ARGV[3])
redis.call('ZADD', KEYS[K.blind], now, m)
if ARGV[4] ~= '' and ARGV[4] ~= m then redis.call('ZREM', KEYS[K.blind], ARGV[4]) end
return {start, now}
