-- After rolesFormat's codec and lua/roles.lua: the roles CLUSTER NODES (ARGV[1]) gives, as stored.
return encodeRoles(roles(ARGV[1]))
