-- After one map format's codec, its functions named encodeM and decodeM:
-- ARGV[1] a value as Go encoded it, then the map's keys and values, in
-- pairs. Returns the value as Lua encodes the map, then the keys and
-- values Lua decodes ARGV[1] to, in pairs, sorted by key.
local t = {}
for i = 2, #ARGV, 2 do t[ARGV[i]] = ARGV[i + 1] end
local out = {encodeM(t)}
local dec, keys = decodeM(ARGV[1]), {}
for k in pairs(dec) do keys[#keys + 1] = k end
table.sort(keys)
for _, k in ipairs(keys) do out[#out + 1] = k; out[#out + 1] = dec[k] end
return out
