package session

// The stored values that Go and the scripts both read or write, each
// laid out once (see format). Lua-only values (the cluster's roles, the
// run id) are laid out in their script; the inbox entry is the push
// request's JSON (see inboxscripts.go).
var (
	// stageFormat is a stage hash value: the stage an index entry is due
	// for, past the first, and the silence's deadline in ms.
	stageFormat = newFormat("Stage", ":", false, field{"stage", true}, field{"deadline", true})
	// aliveFormat is a gateway instance's heartbeat: its last one, in
	// ms, and the lease it took then, in ms (0: it left).
	aliveFormat = newFormat("Alive", ":", false, field{"last", true}, field{"lease", true})
	// blindFormat is a blind interval's member: start and end in ms,
	// the reason, and the scope (a gateway instance, "" for everyone),
	// which may hold colons.
	blindFormat = newFormat("Blind", ":", false,
		field{"start", true}, field{"stop", true}, field{"reason", false}, field{"scope", false})
	// listenerFormat is a listener replica's last sweep mark: when, in
	// ms, and listenerFailing when it could not produce then.
	listenerFormat = newFormat("Listener", ":", true, field{"at", true}, field{"state", false})
	// viaFormat is the via of a session: the gateway instance whose
	// grant the deadline is, then the one that renewed last, if another.
	viaFormat = newFormat("Via", ",", true, field{"granter", false}, field{"last", false})
	// dedupFormat is a dedup key's value: a dedup state and its
	// argument (see dedup.go).
	dedupFormat = newFormat("Dedup", ":", false, field{"state", false}, field{"arg", false})
	// pushFormat is a guide's push state for one user: pushClaimed and
	// the claim's token, or pushDone and the outcome.
	pushFormat = newFormat("Push", ":", false, field{"state", false}, field{"arg", false})
)

// listenerFailing is a listener replica's mark state while it cannot
// produce.
const listenerFailing = "failing"
