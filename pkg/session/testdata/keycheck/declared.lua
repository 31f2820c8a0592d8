-- declared: 0 problem(s)
return redis.call('GET', KEYS[1])
