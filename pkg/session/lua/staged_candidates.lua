local now = redisNowMS()
local out, limit = {now}, tonumber(ARGV[1])
for _, uid in ipairs(redis.call('HKEYS', KEYS[K.stage])) do
  local score = redis.call('ZSCORE', KEYS[K.index], uid)
  if score and tonumber(score) <= now then
    out[#out+1] = uid
    if #out > limit then break end
  end
end
return out
