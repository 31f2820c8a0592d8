-- Reads one user's timeline: {Redis's now in ms, the entries oldest
-- first, each "<Redis ms> <entry>"}.
return {redisNowMS(), redis.call('LRANGE', KEYS[K.timeline], 0, -1)}
