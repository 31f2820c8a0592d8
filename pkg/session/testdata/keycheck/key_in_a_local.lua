-- key in a local: 1 problem(s)
local k = KEYS[1] return redis.call('GET', k)
