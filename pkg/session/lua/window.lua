local now = redisNowMS()
local ahead, limit = tonumber(ARGV[2]), tonumber(ARGV[3])
local out = {now, 0}
local overdue = redis.call('ZRANGE', KEYS[K.set], '-inf', now, 'BYSCORE', 'LIMIT', 0, limit, 'WITHSCORES')
for _, v in ipairs(overdue) do out[#out+1] = v end
out[2] = #overdue / 2
-- The new part starts after what was fetched before, or after now: the
-- overdue part above covers the rest.
local from = now
if ARGV[1] ~= '' and tonumber(ARGV[1]) > now then from = tonumber(ARGV[1]) end
local new = redis.call('ZRANGE', KEYS[K.set], '(' .. from, now + ahead, 'BYSCORE', 'LIMIT', 0, limit, 'WITHSCORES')
for _, v in ipairs(new) do out[#out+1] = v end
return out
