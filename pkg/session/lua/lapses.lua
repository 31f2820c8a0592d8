local n = tonumber(ARGV[1])
if n > 0 then
  redis.call('INCRBY', KEYS[#KEYS], n)
  redis.call('EXPIRE', KEYS[#KEYS], tonumber(ARGV[2]))
end
local sum = 0
for i = 1, #KEYS do sum = sum + (tonumber(redis.call('GET', KEYS[i])) or 0) end
return sum
