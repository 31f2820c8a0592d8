local v = redis.call('GET', KEYS[K.dedup])
if v == encodeDedup(V.produced, ARGV[1]) or v == encodeDedup(V.spooled, ARGV[1]) then
  redis.call('SET', KEYS[K.dedup], encodeDedup(V.stale, ARGV[1]), 'KEEPTTL')
  return 1
end
-- Still claimed: the event was produced (the consumer read it) but its
-- producer has not marked it yet. The note rides in the claim's value, so
-- the claim stays (no other replica takes the timeout meanwhile) and the
-- key stays one key, as a moving cluster slot serves it; the producer's
-- mark (mark_produced.lua) turns it into stale.
if not v then return 0 end
local state, arg = decodeDedup(v)
local holder = nil
if state == V.claimed then
  holder = arg
elseif state == V.noted then
  local _, h = decodeNote(arg)
  holder = h
end
if holder == nil then return 0 end
redis.call('SET', KEYS[K.dedup], encodeDedup(V.noted, encodeNote(ARGV[1], holder)), 'KEEPTTL')
return 2
