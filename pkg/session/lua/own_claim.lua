-- ownClaim reports whether the dedup value v is still the claim (a
-- DedupClaim value) of the same listener, noted (mark_stale.lua) or not.
local function ownClaim(v, claim)
  if not v then return false end
  if v == claim then return true end
  local state, arg = decodeDedup(v)
  if state ~= V.noted then return false end
  local _, holder = decodeNote(arg)
  local _, mine = decodeDedup(claim)
  return holder ~= nil and holder == mine
end
