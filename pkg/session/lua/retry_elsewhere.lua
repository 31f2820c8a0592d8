if redis.call('GET', KEYS[K.dedup]) == ARGV[1] then
  redis.call('SET', KEYS[K.dedup], encodeDedup(V.retry, tonumber(ARGV[2]) + 1), 'PX', tonumber(ARGV[3]))
  return 1
end
return 0
