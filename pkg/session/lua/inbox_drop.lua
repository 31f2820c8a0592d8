-- Removes uid's inbox entries of the guide ids ARGV[3...], and their
-- leases; with ARGV[2] == '1', not those marked closed (a close stage's
-- whose close was applied). With ARGV[1] > 0, the ids are settled
-- (proven received, or needed no more): each is marked so for ARGV[1]
-- ms, and no keep of it adds it again meanwhile (see inbox_keep.lua).
-- Returns how many entries it removed.
local now = redisNowMS()
local mark = tonumber(ARGV[1])
local drop = {}
for i = 3, #ARGV do
  drop[ARGV[i]] = true
  redis.call('HDEL', KEYS[K.leases], ARGV[i])
  if mark > 0 then redis.call('HSET', KEYS[K.settled], ARGV[i], now + mark) end
end
if mark > 0 then
  -- The marks of ids past theirs go; the key outlives the newest.
  local marks = redis.call('HGETALL', KEYS[K.settled])
  for i = 1, #marks, 2 do
    if (tonumber(marks[i+1]) or 0) <= now then redis.call('HDEL', KEYS[K.settled], marks[i]) end
  end
  if redis.call('PTTL', KEYS[K.settled]) < mark then redis.call('PEXPIRE', KEYS[K.settled], mark) end
end
local items = redis.call('LRANGE', KEYS[K.inbox], 0, -1)
local n = 0
for i = 1, #items do
  local id, _, _, _, closed = decodeInboxEntry(items[i])
  if id and drop[id] and not (closed and ARGV[2] == '1') then
    n = n + redis.call('LREM', KEYS[K.inbox], 1, items[i])
  end
end
return n
