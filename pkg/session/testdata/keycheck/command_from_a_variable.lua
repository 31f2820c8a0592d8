-- command from a variable: 1 problem(s)
redis.call(ARGV[1], KEYS[1])
