-- Marks a timeout produced (or spooled: ARGV[3] is '1'), unless a consumer
-- that read this very timeout while it was still claimed found its silence
-- over (a noted claim, mark_stale.lua): then it is stale, so another
-- silence in its window is not deferred.
local state = V.produced
if ARGV[3] == '1' then state = V.spooled end
local v = redis.call('GET', KEYS[K.dedup])
if v then
  local s, arg = decodeDedup(v)
  if s == V.noted and decodeNote(arg) == ARGV[1] then state = V.stale end
end
redis.call('SET', KEYS[K.dedup], encodeDedup(state, ARGV[1]), 'PX', tonumber(ARGV[2]))
if state == V.stale then return 1 end
return 0
