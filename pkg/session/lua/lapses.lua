-- Adds n timeouts claimed to the count of the second they were found in
-- (the caller's mark), and returns the count of the window from the
-- window before that second to the second this script runs in, by its
-- clock. KEYS: one counter a second, the first of second ARGV[3]: the
-- window up to the mark's second (its last), then the seconds after it.
-- A count comes a while after its mark (its claims came between), and
-- another replica's share of the same crowd may be counted in any second
-- of that while: summed up to now, every share counted before is seen
-- (more than a window, when a count comes late: over-counting only holds
-- more). ARGV: n, the window in seconds, the first key's second, the
-- counters' TTL in seconds.
local n, secs, first, ttl = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local cur = math.floor(redisNowMS() / 1000)
-- A count past the last key cannot sum the shares counted since: it is
-- refused, and the caller holds what it was to count.
if cur - first + 1 > #KEYS then
  return redis.error_reply('lapse count ' .. (cur - first + 1 - secs) .. 's after its mark, past the counters given')
end
if n > 0 then
  redis.call('INCRBY', KEYS[secs], n)
  redis.call('EXPIRE', KEYS[secs], ttl)
end
-- Up to the current second; the mark's when the clock is behind it (a
-- failover to a node behind in time).
local upto = math.max(cur - first + 1, secs)
local sum = 0
for i = 1, upto do sum = sum + (tonumber(redis.call('GET', KEYS[i])) or 0) end
return sum
