-- Decides, once for every connection and instance, whether a close
-- stage's guide is applied: the first connection about to write it asks,
-- and every later one is told the same. Cancelled when the user renewed
-- (or ended) their session after the silence's deadline, ARGV[1] (Unix
-- ms); the decision is kept ARGV[2] ms. With ARGV[3] '0', only a
-- cancellation is decided: a close not over stays undecided (returns '');
-- with '2', it is applied whatever the user did since (a close that must
-- not be cancelled, or one without a deadline).
-- An applied close records when it was decided, Redis's clock, in
-- KEYS[K.closeAt], kept as long.
-- Returns V.applied, V.cancelled or ''.
local got = redis.call('GET', KEYS[K.close])
if got then return got end
local out = V.applied
if ARGV[3] ~= '2' and tonumber(redis.call('GET', KEYS[K.renewed]) or '0') > tonumber(ARGV[1]) then
  out = V.cancelled
elseif ARGV[3] == '0' then
  return ''
end
redis.call('SET', KEYS[K.close], out, 'PX', ARGV[2])
if out == V.applied then redis.call('SET', KEYS[K.closeAt], redisNowMS(), 'PX', ARGV[2]) end
return out
