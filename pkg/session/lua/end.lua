endSession(K, ARGV[1], redisNowMS(), tonumber(ARGV[2]), nil, 3)
return 1
