-- two bad: 2 problem(s)
redis.call('GET', ARGV[1]) redis.pcall('HGET', 'h', ARGV[2])
