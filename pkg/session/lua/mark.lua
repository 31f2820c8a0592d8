local now = redisNowMS()
local gapMax, lastSeen, keep = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local run = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)') or ''
local epoch = ''
-- On a cluster, the nodes' roles, as this node sees them: until a failed
-- master's users' renewals find the promoted replica, their deadlines
-- lapse under them. They have a key of their own: the run id key holds
-- the run id and the epoch, as a listener of the release before wrote it
-- and still reads it, taking any change of it for a failover; with the
-- roles in it, each of its marks during a rolling upgrade was one.
local cur, failover = nil, false
local cok, cnodes = pcall(redis.call, 'CLUSTER', 'NODES')
if cok then
  cur = roles(cnodes)
  local iok, cinfo = pcall(redis.call, 'CLUSTER', 'INFO')
  epoch = (iok and string.match(cinfo, 'cluster_current_epoch:(%d+)')) or ''
  local enc = encodeRoles(cur)
  local proles = redis.call('GET', KEYS[K.roles])
  if proles ~= enc then redis.call('SET', KEYS[K.roles], enc) end
  -- None stored (the first mark of this release): no failover found.
  failover = proles and failedOver(decodeRoles(proles), cur)
end
local rid = encodeRunID(run, epoch)
local prid = redis.call('GET', KEYS[K.runID])
if prid ~= rid then redis.call('SET', KEYS[K.runID], rid) end
local restarted = prid and decodeRunID(prid) ~= run
local prev = redis.call('GET', KEYS[K.swept])
redis.call('SET', KEYS[K.swept], now)
local start, reason = 0, ''
if prev then
  prev = tonumber(prev)
  if restarted then start, reason = prev, V.redisRestart
  elseif failover then start, reason = prev, V.failover
  elseif now - prev > gapMax then start, reason = prev, V.sweepGap end
elseif lastSeen > 0 then
  start, reason = lastSeen, V.dataLost
end
if reason ~= '' then
  redis.call('ZADD', KEYS[K.blind], now, encodeBlind(start, now, reason, ''))
end
redis.call('ZREMRANGEBYSCORE', KEYS[K.blind], '-inf', now - keep)
if ARGV[4] ~= '' then
  redis.call('HSET', KEYS[K.listeners], ARGV[4], encodeListener(now, ARGV[5]))
end
return {now, start, reason, redis.call('HGETALL', KEYS[K.alive]),
  redis.call('ZRANGE', KEYS[K.blind], now - keep, '+inf', 'BYSCORE'), redis.call('HGETALL', KEYS[K.listeners]),
  redis.call('HGETALL', KEYS[K.activity])}
