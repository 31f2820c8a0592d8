local v = redis.call('GET', KEYS[K.dedup])
if v == encodeDedup(V.produced, ARGV[1]) or v == encodeDedup(V.spooled, ARGV[1]) then
  redis.call('SET', KEYS[K.dedup], encodeDedup(V.stale, ARGV[1]), 'KEEPTTL')
  return 1
end
return 0
