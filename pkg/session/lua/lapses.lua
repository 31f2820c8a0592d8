-- Adds n timeouts claimed to the count of the current second, by this
-- script's clock, and returns the count of the window that ends with it.
-- KEYS: one counter a second, the first of second ARGV[3]: the window
-- before the caller's now, and seconds past it, since the count comes a
-- while after the mark the caller read now at (its claims came between),
-- and two replicas' counts must meet in one window whichever marked
-- first. ARGV: n, the window in seconds, the first key's second, the
-- counters' TTL in seconds.
local n, secs, first, ttl = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local cur = math.floor(redisNowMS() / 1000)
-- The current second's key; the first or the last one given when the
-- clock is outside them (a failover to a node behind in time, a count
-- long after its mark).
local at = math.min(math.max(cur - first + 1, 1), #KEYS)
if n > 0 then
  redis.call('INCRBY', KEYS[at], n)
  redis.call('EXPIRE', KEYS[at], ttl)
end
local sum = 0
for i = math.max(1, at - secs + 1), at do sum = sum + (tonumber(redis.call('GET', KEYS[i])) or 0) end
return sum
