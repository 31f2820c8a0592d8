-- Reads the heartbeats of the gateway instances named in ARGV, with the
-- clock: {now, {heartbeat or false, ...}} in ARGV's order.
return {redisNowMS(), redis.call('HMGET', KEYS[K.alive], unpack(ARGV))}
