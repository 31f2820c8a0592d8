local now = redisNowMS()
if redis.call('EXISTS', KEYS[K.session]) == 1 then return {now} end
local score = redis.call('ZSCORE', KEYS[K.index], ARGV[1])
-- Not yet due: a later stage of the silence, scheduled after the first
-- was settled, that a late event of the first must not bring forward.
if not score or tonumber(score) > now then return {now} end
local held = redis.call('HGET', KEYS[K.held], ARGV[1])
return {now, ARGV[1], score, redis.call('HGET', KEYS[K.segments], ARGV[1]) or '',
  redis.call('HGET', KEYS[K.via], ARGV[1]) or '',
  (held and tonumber(held) == tonumber(score)) and 1 or 0,
  routesOf(K.route, K.stamps), redis.call('HGET', KEYS[K.stage], ARGV[1]) or ''}
