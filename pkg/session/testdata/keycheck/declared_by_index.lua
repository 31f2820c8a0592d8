-- declared by index: 0 problem(s)
for i = 1, #KEYS do redis.call('DEL', KEYS[i]) end redis.call("INCRBY", KEYS[#KEYS], 1)
