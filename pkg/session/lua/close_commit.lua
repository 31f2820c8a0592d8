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
-- Returns {the decision: V.applied, V.cancelled or '' (undecided); when
-- the close was applied: Unix ms, or '' when not applied, or applied by a
-- release that kept no time}. The time comes with the decision, so that
-- no caller holds one without the other.
local got = redis.call('GET', KEYS[K.close])
if got then
  local at = ''
  if got == V.applied then at = redis.call('GET', KEYS[K.closeAt]) or '' end
  return {got, at}
end
local out = V.applied
if ARGV[3] ~= '2' and tonumber(redis.call('GET', KEYS[K.renewed]) or '0') > tonumber(ARGV[1]) then
  out = V.cancelled
elseif ARGV[3] == '0' then
  return {'', ''}
end
redis.call('SET', KEYS[K.close], out, 'PX', ARGV[2])
local at = ''
if out == V.applied then
  at = tostring(redisNowMS())
  redis.call('SET', KEYS[K.closeAt], at, 'PX', ARGV[2])
end
return {out, at}
