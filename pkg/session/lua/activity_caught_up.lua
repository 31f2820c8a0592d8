-- Records that the activity feed caught up. ARGV: the longest step of a
-- partition's time that is not a blind interval (ms); the activity topic
-- and its partition count (0: not checked this time); how often the
-- member stamps (ms, 0: not said); then pairs of a partition and a time
-- (Unix ms, Redis's clock) before which every record of it had been
-- applied.
--
-- The stamp interval is kept in the field V.stampField, beside the
-- partitions, for the listener to time its holds by: the last member to
-- say it wins (members of one deployment share it).
--
-- The topic and its count keep the hash to the partitions there are: a
-- hash of another topic is dropped whole (the feed moved), a partition
-- past the count is dropped (the topic was made smaller), and one not
-- yet stamped is written as 0, so that the listener, which waits for the
-- earliest, holds every deadline until its owner has stamped it (a
-- partition just added, which no member reads yet).
--
-- A partition's time never moves back: a consumer that lost it in a
-- rebalance and stamps late changes nothing. A longer step than the gap
-- from a real stamp is a time in which the feed lagged or Kafka was down,
-- and records the platform could not produce then may still come: it is
-- recorded as a blind interval of everyone, so that the listener holds
-- the deadlines in it until the grace after it. It ends now, when the
-- stamp is written, not at the stamped time: a member reads that time
-- before it asks Kafka for the partitions' ends, which blocks while Kafka
-- is down, so the time may be inside the outage. Returns Redis's now.
local now = redisNowMS()
local gapMax, topic, count, every = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local last = #ARGV
-- A member that started and has not stamped since (Kafka out of its reach
-- from the start, say) marked when: a partition's first stamp that long
-- after is a lag too, from that mark. Read before a topic's first stamp
-- drops the hash.
local unstampedAt = tonumber(redis.call('HGET', KEYS[K.activity], 'unstamped') or '')
local stamped = false
if count > 0 then
  if redis.call('HGET', KEYS[K.activity], 'topic') ~= topic then
    redis.call('DEL', KEYS[K.activity])
    redis.call('HSET', KEYS[K.activity], 'topic', topic)
  end
  for _, f in ipairs(redis.call('HKEYS', KEYS[K.activity])) do
    local p = tonumber(f)
    if p and p >= count then
      redis.call('HDEL', KEYS[K.activity], f)
    end
  end
  for p = 0, count - 1 do
    redis.call('HSETNX', KEYS[K.activity], p, 0)
  end
end
if every > 0 and (count > 0 or last > 4) then
  redis.call('HSET', KEYS[K.activity], V.stampField, every)
end
for i = 5, last - 1, 2 do
  local t = tonumber(ARGV[i + 1])
  local cur = tonumber(redis.call('HGET', KEYS[K.activity], ARGV[i]) or '-1')
  if t and t > cur then
    redis.call('HSET', KEYS[K.activity], ARGV[i], t)
    stamped = true
    local from = nil
    if cur > 0 then
      from = cur
    elseif unstampedAt and unstampedAt > 0 then
      from = unstampedAt
    end
    if from and t - from > gapMax then
      redis.call('ZADD', KEYS[K.blind], math.max(now, t), encodeBlind(from, math.max(now, t), V.activityLag, ''))
      if from == unstampedAt then unstampedAt = nil end
    end
  end
end
-- The mark has served once a partition is stamped: partitions decide.
if stamped then redis.call('HDEL', KEYS[K.activity], 'unstamped') end
return now
