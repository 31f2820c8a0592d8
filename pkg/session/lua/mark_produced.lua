-- A consumer that read this very timeout while it was still claimed found
-- its silence over (mark_stale.lua left a note): it is stale, not
-- produced, so another silence in its window is not deferred.
local state = V.produced
if redis.call('GET', KEYS[K.staleNote]) == ARGV[1] then state = V.stale end
redis.call('SET', KEYS[K.dedup], encodeDedup(state, ARGV[1]), 'PX', tonumber(ARGV[2]))
redis.call('DEL', KEYS[K.staleNote])
return state == V.stale and 1 or 0
