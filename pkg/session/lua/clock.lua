-- The clock prelude of every script: deadlines, marks and ages are all
-- Redis's clock, never a gateway's or a listener's.
local function redisNowMS()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- ms is a whole number of ms as the string a command takes. A Lua number
-- passed to redis.call is formatted with "%.17g", which costs several
-- times "%d" (Redis 7.0): a grant passes four.
local format = string.format
local function ms(n) return format('%d', n) end
