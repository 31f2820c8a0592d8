-- After one object format's codec, its functions named encodeO and
-- decodeO: ARGV[1] a writer's object, ARGV[2] a value to decode, then
-- the added fields' values ('' for none). Returns the value as Lua
-- encodes the object with those fields, then each field Lua decodes
-- ARGV[2] to: '' for nil, a number in decimal digits.
local added = {}
for i = 3, #ARGV do
  if ARGV[i] ~= '' then added[i - 2] = ARGV[i] end
end
local out = {encodeO(ARGV[1], unpack(added, 1, #ARGV - 2))}
local dec = {decodeO(ARGV[2])}
for i = 1, select('#', decodeO(ARGV[2])) do
  local v = dec[i]
  if v == nil then v = ''
  elseif type(v) == 'number' then v = string.format('%d', v) end
  out[#out + 1] = v
end
return out
