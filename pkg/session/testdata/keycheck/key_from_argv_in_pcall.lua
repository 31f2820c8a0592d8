-- key from ARGV in pcall: 1 problem(s)
local ok, r = pcall(redis.call, 'HKEYS', ARGV[3] .. uid)
