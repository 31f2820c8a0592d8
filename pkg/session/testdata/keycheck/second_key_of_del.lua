-- second key of DEL: 1 problem(s)
redis.call('DEL', KEYS[1], 'other')
