-- Appends entries to the timelines of users of one bucket, in the order
-- given: KEYS[K.entries + j - 1] is the j-th entry's user's timeline (a
-- list), ARGV[2 + j] the entry. Each is stored as "<Redis ms> <entry>",
-- so that every entry carries Redis's clock. ARGV[1]: the most entries a
-- timeline keeps (the oldest go); ARGV[2]: how long, in ms, a timeline
-- outlives its last entry. Returns the number appended.
local now = redisNowMS()
local max, keep = tonumber(ARGV[1]), tonumber(ARGV[2])
for j = K.entries, #KEYS do
  redis.call('RPUSH', KEYS[j], now .. ' ' .. ARGV[2 + j - K.entries + 1])
end
for j = K.entries, #KEYS do
  redis.call('LTRIM', KEYS[j], -max, -1)
  redis.call('PEXPIRE', KEYS[j], keep)
end
return #KEYS - K.entries + 1
