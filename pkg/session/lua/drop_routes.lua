local dropped, kept = 0, 0
for i = 1, #ARGV - 1, 2 do
  local at = tonumber(redis.call('HGET', KEYS[K.stamps], ARGV[i])) or 0
  if at <= tonumber(ARGV[i + 1]) then
    dropped = dropped + redis.call('HDEL', KEYS[K.route], ARGV[i])
    redis.call('HDEL', KEYS[K.stamps], ARGV[i])
  elseif redis.call('HEXISTS', KEYS[K.route], ARGV[i]) == 1 then
    kept = kept + 1
  end
end
return {dropped, kept}
