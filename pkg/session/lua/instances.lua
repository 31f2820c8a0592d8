local now = redisNowMS()
return {now, redis.call('HGETALL', KEYS[K.alive])}
