-- The sweep mark of the release before the cluster's roles had a key of
-- their own, as it runs in a listener replica not yet upgraded. KEYS:
-- swept, blind, alive, listeners, run id. ARGV as lua/mark.lua's, but
-- the listener's state is 1 when failing.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local gapMax, lastSeen, keep = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local rid = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)') or ''
-- On a cluster, a failover bumps the epoch: until its users' renewals
-- find the promoted master, their deadlines lapse under them.
local cok, cinfo = pcall(redis.call, 'CLUSTER', 'INFO')
if cok then rid = rid .. '/' .. (string.match(cinfo, 'cluster_current_epoch:(%d+)') or '') end
local prid = redis.call('GET', KEYS[5])
if prid ~= rid then redis.call('SET', KEYS[5], rid) end
local restarted = prid and string.match(prid, '^(%x*)') ~= string.match(rid, '^(%x*)')
local prev = redis.call('GET', KEYS[1])
redis.call('SET', KEYS[1], now)
local start, reason = 0, ''
if prev then
  prev = tonumber(prev)
  if restarted then start, reason = prev, 'redis-restart'
  elseif prid and prid ~= rid then start, reason = prev, 'failover'
  elseif now - prev > gapMax then start, reason = prev, 'sweep-gap' end
elseif lastSeen > 0 then
  start, reason = lastSeen, 'data-lost'
end
if reason ~= '' then
  redis.call('ZADD', KEYS[2], now, start .. ':' .. now .. ':' .. reason .. ':')
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - keep)
if ARGV[4] ~= '' then
  local v = now
  if ARGV[5] == '1' then v = now .. ':failing' end
  redis.call('HSET', KEYS[4], ARGV[4], v)
end
return {now, start, reason, redis.call('HGETALL', KEYS[3]),
  redis.call('ZRANGE', KEYS[2], now - keep, '+inf', 'BYSCORE'), redis.call('HGETALL', KEYS[4])}
