-- comment: 0 problem(s)
-- redis.call('GET', ARGV[1])
return 1
