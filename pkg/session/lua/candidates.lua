local now = redisNowMS()
local out = redis.call('ZRANGE', KEYS[K.set], '-inf', now, 'BYSCORE', 'LIMIT', 0, tonumber(ARGV[1]))
table.insert(out, 1, now)
return out
