-- member from ARGV: 0 problem(s)
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1] .. ':x')
