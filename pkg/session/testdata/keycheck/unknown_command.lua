-- unknown command: 1 problem(s)
redis.call('SUNIONSTORE', KEYS[1], KEYS[2])
