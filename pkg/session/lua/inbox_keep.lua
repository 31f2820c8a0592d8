if ARGV[6] == '1' then
  local seen = {}
  for i = 8, #ARGV, 2 do seen[ARGV[i]] = tonumber(ARGV[i+1]) end
  local cur = redis.call('HGETALL', KEYS[K.route])
  for i = 1, #cur, 2 do
    if (tonumber(cur[i+1]) or 0) > (seen[cur[i]] or 0) then return 0 end
  end
end
local now = redisNowMS()
local dl = tonumber(ARGV[5])
local exp = (dl > 0 and dl or now) + tonumber(ARGV[2])
if exp <= now then return -1 end
local closed = nil
if ARGV[7] == '1' then closed = now end
local entry = encodeInboxEntry(ARGV[1], now, exp, closed)
redis.call('LPUSH', KEYS[K.inbox], entry)
redis.call('LTRIM', KEYS[K.inbox], 0, tonumber(ARGV[3]) - 1)
local ttl = math.min(exp - now, tonumber(ARGV[4]))
if redis.call('PTTL', KEYS[K.inbox]) < ttl then redis.call('PEXPIRE', KEYS[K.inbox], ttl) end
return 1
