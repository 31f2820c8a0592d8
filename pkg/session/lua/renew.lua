local now = redisNowMS()
return grant(K, ARGV[1], now, tonumber(ARGV[2]), ARGV[3], ARGV[4], now - (tonumber(ARGV[7]) or 0),
  tonumber(ARGV[6]), ARGV[8], tonumber(ARGV[9]) or 0, ARGV[5] == V.resync, false)
