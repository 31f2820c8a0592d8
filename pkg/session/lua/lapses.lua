-- Adds n timeouts claimed to the count of the second they were found in,
-- and returns the count from the window before that second on. KEYS: one
-- counter a second, the first of second ARGV[3]: the window up to the
-- second found (its last), then the seconds after it. A count comes a
-- while after its lapses were found (claims come between), and another
-- replica's share of the same crowd may be counted in any second since,
-- or in one ahead of this clock (a mark read on a node since failed over
-- from): every key given is summed. Only a late count sums more than a
-- window (over-counting only holds more). ARGV: n, the window in seconds,
-- the first key's second, the counters' TTL in seconds.
-- K.token is the count's token: a count runs again when the client
-- retries one whose reply was late, or when the caller carries one that
-- failed and Redis ran after all, and adds its lapses once.
local n, secs, first, ttl = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local base = K.seconds - 1
local counters = #KEYS - base
local cur = math.floor(redisNowMS() / 1000)
-- A count past the last key could not sum the shares counted since: it is
-- refused, and the caller holds what it was to count.
if cur - first + 1 > counters then
  return redis.error_reply('lapse count ' .. (cur - first + 1 - secs) .. 's after its lapses were found, past the counters given')
end
-- The token is set once the lapses are added: a script that fails on the
-- way is not undone, and a count that failed must add them when tried
-- again.
if n > 0 and redis.call('EXISTS', KEYS[K.token]) == 0 then
  redis.call('INCRBY', KEYS[base + secs], n)
  redis.call('EXPIRE', KEYS[base + secs], ttl)
  redis.call('SET', KEYS[K.token], 1, 'EX', ttl)
end
local sum = 0
for i = base + 1, #KEYS do sum = sum + (tonumber(redis.call('GET', KEYS[i])) or 0) end
return sum
