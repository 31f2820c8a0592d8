-- routesOf lists the gateway instances of a user, by their route key
-- KEYS[r] and its stamps KEYS[s]: those holding their connections, and those whose entries
-- were dropped as dead lately (routedrop.lua), whose clients may still be
-- pinging them, cut off from Redis.
local function routesOf(r, s)
  local out = redis.call('HKEYS', KEYS[r])
  for _, f in ipairs(redis.call('HKEYS', KEYS[s])) do
    if string.sub(f, 1, 1) == '!' then out[#out+1] = string.sub(f, 2) end
  end
  return out
end
