local now = redisNowMS()
return {redis.call('EXISTS', KEYS[K.session]), now, tonumber(redis.call('GET', KEYS[K.renewed]) or '0')}
