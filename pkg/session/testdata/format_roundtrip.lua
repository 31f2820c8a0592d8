-- After one format's codec, its functions named encodeF and decodeF:
-- ARGV[1] a value as Go encoded it, then its fields. Returns the value
-- as Lua encodes the fields, then the fields Lua decodes ARGV[1] to.
local n = #ARGV - 1
local fields = {}
for i = 1, n do fields[i] = ARGV[i + 1] end
return {encodeF(unpack(fields)), decodeF(ARGV[1])}
