-- Records that the activity feed caught up. ARGV: the longest step of a
-- partition's time that is not a blind interval (ms), then pairs of a
-- partition of the activity topic and a time (Unix ms, Redis's clock)
-- before which every record of it had been applied. A partition's time
-- never moves back: a consumer that lost it in a rebalance and stamps
-- late changes nothing. A longer step is a time in which the feed lagged
-- or Kafka was down, and records the platform could not produce then may
-- still come: it is recorded as a blind interval of everyone, so that the
-- listener holds the deadlines in it until the grace after it. With no
-- pairs, only reads the clock. Returns Redis's now.
local now = redisNowMS()
local gapMax = tonumber(ARGV[1])
for i = 2, #ARGV - 1, 2 do
  local t = tonumber(ARGV[i + 1])
  local cur = tonumber(redis.call('HGET', KEYS[K.activity], ARGV[i]) or '-1')
  if t and t > cur then
    redis.call('HSET', KEYS[K.activity], ARGV[i], t)
    if cur >= 0 and t - cur > gapMax then
      redis.call('ZADD', KEYS[K.blind], t, encodeBlind(cur, t, V.activityLag, ''))
    end
  end
end
return now
