local v = redis.call('GET', KEYS[K.dedup])
if v == encodeDedup(V.produced, ARGV[1]) or v == encodeDedup(V.spooled, ARGV[1]) then
  redis.call('SET', KEYS[K.dedup], encodeDedup(V.stale, ARGV[1]), 'KEEPTTL')
  return 1
end
-- Still claimed: if by the timeout found stale, its producer has not
-- marked it yet. The caller may try again (MarkStale); the claim itself
-- is left exactly as it is, for every release's scripts to read.
if v and decodeDedup(v) == V.claimed then return 2 end
return 0
