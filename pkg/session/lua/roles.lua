-- This library decides, in the sweep mark, whether a Redis Cluster
-- failed over since the last mark, from which nodes are masters and which
-- replicas, not from the cluster's epoch: moving a slot to another master
-- (CLUSTER SETSLOT ... NODE, every step of a reshard or a rebalance) bumps
-- the epoch without consensus while no node failed and no renewal waited,
-- and a failover taken from it would hold every deadline for the grace.
--
-- roles reads CLUSTER NODES into node id -> role: 'M' a master serving
-- slots, 'm' a master serving none, 'r' a replica, 'f' a node marked
-- failed, which the roles key stores (rolesFormat, in values.go).
-- failedOver is the rule: a replica that serves slots as a master now
-- (promoted), or a master that served slots and is now failed, a replica,
-- or gone from the cluster. A slot moved between masters, a master added
-- or drained and removed, a replica added or moved: none of them is a
-- failover.
local function roles(nodes)
  local out = {}
  for line in string.gmatch(nodes, '[^\r\n]+') do
    local f = {}
    for w in string.gmatch(line, '%S+') do f[#f + 1] = w end
    local flags = ',' .. (f[3] or '') .. ','
    if #f >= 8 and not string.find(flags, ',handshake,', 1, true) then
      local role = 'r'
      if string.find(flags, ',fail,', 1, true) then
        role = 'f'
      elseif string.find(flags, ',master,', 1, true) then
        role = 'm'
        -- Slots from the ninth field; a slot being imported or migrated
        -- ('[...]') is not served yet, or still.
        for i = 9, #f do
          if string.sub(f[i], 1, 1) ~= '[' then role = 'M' break end
        end
      end
      out[f[1]] = role
    end
  end
  return out
end
local function failedOver(prev, cur)
  for id, was in pairs(prev) do
    local now = cur[id]
    if was == 'r' and now == 'M' then return true end
    if was == 'M' and now ~= 'M' and now ~= 'm' then return true end
  end
  return false
end
