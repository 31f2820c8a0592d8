-- Appends entries to the timelines of users of one bucket, in the order
-- given: KEYS[K.entries + j - 1] is the j-th entry's user's timeline (a
-- list); ARGV[2 + 2j - 1] how many ms before this call the entry's
-- decision was made (its time in a queue); ARGV[2 + 2j] the entry. Each is
-- stored as "<Redis ms> <entry>", its decision's time by Redis's clock,
-- so that entries from every service read in the order they were made.
-- ARGV[1]: the most entries a timeline keeps (the oldest go); ARGV[2]:
-- how long, in ms, a timeline outlives its last entry. Returns the number
-- appended.
local now = redisNowMS()
local max, keep = tonumber(ARGV[1]), tonumber(ARGV[2])
for j = K.entries, #KEYS do
  local i = 2 + 2 * (j - K.entries + 1)
  local at = now - math.max(0, tonumber(ARGV[i - 1]) or 0)
  redis.call('RPUSH', KEYS[j], at .. ' ' .. ARGV[i])
end
for j = K.entries, #KEYS do
  redis.call('LTRIM', KEYS[j], -max, -1)
  redis.call('PEXPIRE', KEYS[j], keep)
end
return #KEYS - K.entries + 1
