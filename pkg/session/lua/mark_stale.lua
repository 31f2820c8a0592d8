local v = redis.call('GET', KEYS[K.dedup])
if v == encodeDedup(V.produced, ARGV[1]) or v == encodeDedup(V.spooled, ARGV[1]) then
  redis.call('SET', KEYS[K.dedup], encodeDedup(V.stale, ARGV[1]), 'KEEPTTL')
  return 1
end
-- Still claimed: the event was produced (the consumer read it) but its
-- producer has not marked it yet. The claim stays, so no other replica
-- takes the timeout meanwhile; the note tells the producer to mark it
-- stale, not produced.
local state = nil
if v then state = decodeDedup(v) end
if state == V.claimed then
  local ttl = redis.call('PTTL', KEYS[K.dedup])
  if ttl > 0 then
    redis.call('SET', KEYS[K.staleNote], ARGV[1], 'PX', ttl)
    return 2
  end
end
return 0
