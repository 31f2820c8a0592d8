-- What Redis knows of one user's last grant, for their timeline: {the
-- last renewal or end (ms), the index entry's score, the stage value
-- (stageFormat: between stages), the via}, each "" when there is none.
local uid = ARGV[1]
return {redis.call('GET', KEYS[K.renewed]) or '', redis.call('ZSCORE', KEYS[K.index], uid) or '',
  redis.call('HGET', KEYS[K.stage], uid) or '', redis.call('HGET', KEYS[K.via], uid) or ''}
