local now = redisNowMS()
local dropped, kept = 0, 0
for i = 1, #ARGV - 1, 2 do
  if dropDeadRoute(K.route, K.stamps, ARGV[i], tonumber(ARGV[i + 1]), now) == 1 then
    dropped = dropped + 1
  elseif redis.call('HEXISTS', KEYS[K.route], ARGV[i]) == 1 then
    kept = kept + 1
  end
end
return {dropped, kept}
