-- holdCancelled appends to a user's timeline, KEYS[k.timeline], what
-- became of their held timeout, whose hold the caller just cancelled:
-- the hold's recheck, then stale (holdNoteRenewed or holdNoteEnded, see
-- holdNoteCodec), stamped with Redis's now, by the note block of ARGV at
-- n (see HoldNotes): the most entries a timeline keeps (0: record
-- nothing), how long in ms it outlives its last entry, the service and
-- the instance that record them.
local function holdCancelled(k, n, stale)
  local max = tonumber(ARGV[n]) or 0
  if max < 1 then return end
  local now = redisNowMS()
  local service, instance = ARGV[n + 2], ARGV[n + 3]
  redis.call('RPUSH', KEYS[k.timeline], now .. ' ' .. encodeHoldNote(holdNoteRechecked, service, instance),
    now .. ' ' .. encodeHoldNote(stale, service, instance))
  redis.call('LTRIM', KEYS[k.timeline], -max, -1)
  redis.call('PEXPIRE', KEYS[k.timeline], ARGV[n + 1])
end

-- stagesCancelled appends to a user's timeline that a grant ended their
-- silence between its stages: holdNoteStagesCancelled, with the stage
-- that was due next and the silence's deadline from the stage hash's
-- value stage ("<stage>:<deadline ms>"), by the note block at n.
local function stagesCancelled(k, n, stage)
  local max = tonumber(ARGV[n]) or 0
  if max < 1 then return end
  local st, d = string.match(stage, '^(%d+):(%d+)$')
  local fields = holdNoteStagesCancelled
  if st then fields = '"stage":' .. st .. ',"deadline_ms":' .. d .. ',' .. fields end
  redis.call('RPUSH', KEYS[k.timeline], redisNowMS() .. ' ' .. encodeHoldNote(fields, ARGV[n + 2], ARGV[n + 3]))
  redis.call('LTRIM', KEYS[k.timeline], -max, -1)
  redis.call('PEXPIRE', KEYS[k.timeline], ARGV[n + 1])
end
