-- Appends entries to the timelines of users of one bucket, in the order
-- given: KEYS[K.entries + j - 1] is the j-th entry's user's timeline (a
-- list); ARGV[2 + 2j - 1] how many ms before this call the entry's
-- decision was made (its time in a queue); ARGV[2 + 2j] the entry. Each is
-- stored as "<Redis ms> <entry>", its decision's time by Redis's clock,
-- so that entries from every service read in the order they were made.
-- ARGV[1]: the most entries a timeline keeps (the oldest go); ARGV[2]:
-- how long, in ms, a timeline outlives its last entry. Returns, for each
-- entry Redis refused (its key of another type), its position among the
-- call's entries and the error: the others are appended, and their
-- timelines' expiries set, all the same.
--
-- Each timeline is trimmed only when its push took it past the bound (the
-- push says its length), and its expiry set once however many of the
-- call's entries it took: each call into Redis from a script costs about
-- a microsecond, much of it the call itself, and a storm appends several
-- entries for each silence. Numbers go to Redis as strings written with
-- "%d" (ms): Lua's own "%.14g", and Redis's "%.17g" for a number it is
-- passed, cost a tenth of an entry's append.
local now = redisNowMS()
local max, keep = tonumber(ARGV[1]), ARGV[2]
local len, refused = {}, {}
for j = K.entries, #KEYS do
  local i = 2 + 2 * (j - K.entries + 1)
  local at = now - math.max(0, tonumber(ARGV[i - 1]) or 0)
  local n = redis.pcall('RPUSH', KEYS[j], ms(at) .. ' ' .. ARGV[i])
  if type(n) == 'table' then
    refused[#refused + 1] = j - K.entries + 1
    refused[#refused + 1] = n.err
  else
    len[KEYS[j]] = n
  end
end
for j = K.entries, #KEYS do
  local n = len[KEYS[j]]
  if n then
    len[KEYS[j]] = nil
    if n > max then redis.call('LTRIM', KEYS[j], -max, -1) end
    redis.call('PEXPIRE', KEYS[j], keep)
  end
end
return refused
