-- The clock prelude of every script: deadlines, marks and ages are all
-- Redis's clock, never a gateway's or a listener's.
local function redisNowMS()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
