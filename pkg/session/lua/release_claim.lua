-- Each of KEYS[K.dedup...] is deleted if it is still the claim ARGV[1].
local n = 0
for j = 1, #KEYS - K.dedup + 1 do
  if redis.call('GET', KEYS[K.dedup + j - 1]) == ARGV[1] then
    n = n + redis.call('DEL', KEYS[K.dedup + j - 1])
  end
end
return n
