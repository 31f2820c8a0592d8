if redis.call('GET', KEYS[K.dedup]) == ARGV[1] then return redis.call('DEL', KEYS[K.dedup]) end
return 0
