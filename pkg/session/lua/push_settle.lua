if redis.call('GET', KEYS[K.delivered]) ~= encodePush(V.claimed, ARGV[1]) then return 0 end
if ARGV[2] == '' then
  redis.call('DEL', KEYS[K.delivered])
else
  redis.call('SET', KEYS[K.delivered], encodePush(V.done, ARGV[2]), 'PX', ARGV[3])
end
return 1
