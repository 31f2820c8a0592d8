local now = redisNowMS()
local mode = ARGV[5]
-- The note block (see HoldNotes). A lapsed grant that cancels a hold
-- restores the silence due again: not stale, and the listener records
-- what becomes of it (grant says nothing of that hold).
local note = 10
local state = redis.call('MGET', KEYS[K.renewed], KEYS[K.turn])
local was = tonumber(state[1] or '0') or 0
local out = grant(K, ARGV[1], now, tonumber(ARGV[2]), ARGV[3], ARGV[4], now - (tonumber(ARGV[7]) or 0),
  tonumber(ARGV[6]), ARGV[8], tonumber(ARGV[9]) or 0, (mode == V.resync or mode == V.lapsed) and mode, false,
  was, state[2], nil, note)
-- Whether Redis knew nothing of the user: no renewal or end recorded,
-- which a user's first session and a lost one share.
out[3] = was == 0 and 1 or 0
return out
