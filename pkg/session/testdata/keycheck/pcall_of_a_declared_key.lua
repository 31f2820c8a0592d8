-- pcall of a declared key: 0 problem(s)
local ok, r = pcall(redis.call, 'HKEYS', KEYS[2])
