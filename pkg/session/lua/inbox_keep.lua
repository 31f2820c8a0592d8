if ARGV[6] == '1' then
  local seen = {}
  for i = 8, #ARGV, 2 do seen[ARGV[i]] = tonumber(ARGV[i+1]) end
  local cur = redis.call('HGETALL', KEYS[K.route])
  for i = 1, #cur, 2 do
    if (tonumber(cur[i+1]) or 0) > (seen[cur[i]] or 0) then return 0 end
  end
end
local now = redisNowMS()
-- One entry per guide id: a guide kept ahead of its live delivery, or
-- kept by another way, is kept already (2), unless this keep marks it closed
-- (it then replaces the entry) or the entry has expired.
local mine = decodeInboxEntry(ARGV[1])
-- A guide settled (a connection proved it got it) is kept no more (3).
if mine and (tonumber(redis.call('HGET', KEYS[K.settled], mine) or '0') or 0) > now then return 3 end
if mine then
  local items = redis.call('LRANGE', KEYS[K.inbox], 0, -1)
  for i = 1, #items do
    local id, _, _, exp, closed = decodeInboxEntry(items[i])
    if id == mine then
      if (not exp or exp > now) and (closed or ARGV[7] ~= '1') then return 2 end
      redis.call('LREM', KEYS[K.inbox], 1, items[i])
    end
  end
end
local dl = tonumber(ARGV[5])
local exp = (dl > 0 and dl or now) + tonumber(ARGV[2])
if exp <= now then return -1 end
local closed = nil
if ARGV[7] == '1' then closed = now end
local entry = encodeInboxEntry(ARGV[1], now, exp, closed)
redis.call('LPUSH', KEYS[K.inbox], entry)
if tonumber(ARGV[3]) > 0 then redis.call('LTRIM', KEYS[K.inbox], 0, tonumber(ARGV[3]) - 1) end
local ttl = math.min(exp - now, tonumber(ARGV[4]))
if redis.call('PTTL', KEYS[K.inbox]) < ttl then redis.call('PEXPIRE', KEYS[K.inbox], ttl) end
return 1
