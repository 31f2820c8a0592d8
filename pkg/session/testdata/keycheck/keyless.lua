-- keyless: 0 problem(s)
local t = redis.call('TIME') local ok, c = pcall(redis.call, 'CLUSTER', 'INFO')
