local now = redisNowMS()
local mode = ARGV[5]
-- The note block (see HoldNotes). A lapsed grant that cancels a hold
-- restores the silence due again: not stale, and the listener records
-- what becomes of it (grant says nothing of that hold).
local note = 10
return grant(K, ARGV[1], now, tonumber(ARGV[2]), ARGV[3], ARGV[4], now - (tonumber(ARGV[7]) or 0),
  tonumber(ARGV[6]), ARGV[8], tonumber(ARGV[9]) or 0, (mode == V.resync or mode == V.lapsed) and mode, false,
  nil, nil, nil, note)
