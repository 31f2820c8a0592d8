endSession(K, ARGV[1], redisNowMS(), tonumber(ARGV[2]))
return 1
