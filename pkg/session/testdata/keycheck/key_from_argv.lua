-- key from ARGV: 1 problem(s)
return redis.call('EXISTS', ARGV[1] .. uid)
