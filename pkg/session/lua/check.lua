-- One call checks users of one bucket, each as if alone, in the order
-- given: KEYS[K.entries + 2j - 2] is the j-th's session key and
-- KEYS[K.entries + 2j - 1] its renewed key. Returns per user {EXISTS,
-- now ms, last renewal ms or 0}.
local out = {}
for j = 1, (#KEYS - K.entries + 1) / 2 do
  local now = redisNowMS()
  out[j] = {redis.call('EXISTS', KEYS[K.entries + 2 * j - 2]), now,
    tonumber(redis.call('GET', KEYS[K.entries + 2 * j - 1]) or '0')}
end
return out
