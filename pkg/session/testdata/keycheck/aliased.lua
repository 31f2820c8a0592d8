-- aliased: 1 problem(s)
local call = redis.call return call('GET', ARGV[1])
