local now = redisNowMS()
local mode = ARGV[5]
-- The note block (see HoldNotes). A lapsed grant that cancels a hold
-- restores the silence due again: not stale, and the listener records
-- what becomes of it (grant says nothing of that hold).
local note = 10
local out = grant(K, ARGV[1], now, tonumber(ARGV[2]), ARGV[3], ARGV[4], now - (tonumber(ARGV[7]) or 0),
  tonumber(ARGV[6]), ARGV[8], tonumber(ARGV[9]) or 0, (mode == V.resync or mode == V.lapsed) and mode, false,
  nil, nil, nil, note)
-- Whether the user's route misses the renewing instance (ARGV[4]), whose
-- connection this ping came on: a node restarted without its data lost
-- it, or another instance dropped this one's entry as dead.
out[3] = 0
if ARGV[4] ~= '' and redis.call('HEXISTS', KEYS[K.route], ARGV[4]) == 0 then out[3] = 1 end
return out
