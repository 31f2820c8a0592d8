-- After rolesFormat's codec and lua/roles.lua: whether roles stored at the last mark (ARGV[1])
-- and those CLUSTER NODES (ARGV[2]) gives now tell a failover.
return failedOver(decodeRoles(ARGV[1]), roles(ARGV[2])) and 1 or 0
