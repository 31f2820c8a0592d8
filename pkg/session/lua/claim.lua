-- One call claims the dedup keys of a bucket's timeouts, each as if
-- alone, in the order given: KEYS[K.dedup + j - 1] is the j-th's key,
-- ARGV[2 + 2j - 1] and ARGV[2 + 2j] its deadline and due ms. Each reads
-- Redis's clock when it is judged, as it did when each was a call.
local claimArg, ttl = ARGV[1], tonumber(ARGV[2])
local function claim(j, n)
  redis.call('SET', KEYS[K.dedup + j - 1], claimArg, 'PX', ttl)
  return encodeDedup(V.outFresh, n or 0)
end
local out = {}
for j = 1, #KEYS - K.dedup + 1 do
  local deadline, due = ARGV[2 + 2 * j - 1], ARGV[2 + 2 * j]
  local v = redis.call('GET', KEYS[K.dedup + j - 1])
  local state, arg = nil, nil
  if v then state, arg = decodeDedup(v) end
  local reply
  if not v or v == claimArg then reply = claim(j, 0)
  elseif state == V.retry then reply = claim(j, tonumber(arg) or 0)
  elseif state == V.claimed then reply = V.outBusy
  -- A bare produced is the value of a release before the deadline was
  -- named in it.
  elseif v == V.produced or v == encodeDedup(V.produced, deadline) or v == encodeDedup(V.stale, deadline) then
    reply = V.outDone
  elseif v == encodeDedup(V.spooled, deadline) then reply = V.outSpooled
  elseif state == V.stale then reply = claim(j)
  elseif redisNowMS() >= (math.floor(tonumber(due) / 60000) + 1) * 60000 then reply = claim(j)
  else reply = V.outDefer end
  out[j] = reply
end
return out
