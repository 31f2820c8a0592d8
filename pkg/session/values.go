package session

import (
	"fmt"
	"strconv"

	"github.com/stillthere/stillthere/pkg/userid"
)

// The stored values that the scripts read or write, each laid out once
// (see format, mapFormat, objectFormat): Go reads and writes them through
// the same field lists the scripts' codecs are written from.
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
	// sessionFormat is a session key's value: the user's segment, then
	// the via the bucket's via hash holds for them ("": not known), as
	// the grant that wrote it left them (lua/grant.lua).
	sessionFormat = newFormat("Session", "/", true, field{"segment", false}, field{"via", false})
	// viaFormat is the via of a session: the gateway instance whose
	// grant the deadline is, then the one that renewed last, if another.
	viaFormat = newFormat("Via", ",", true, field{"granter", false}, field{"last", false})
	// dedupFormat is a dedup key's value: a dedup state and its
	// argument (see dedup.go).
	dedupFormat = newFormat("Dedup", ":", false, field{"state", false}, field{"arg", false})
	// pushFormat is a guide's push state for one user: pushClaimed and
	// the claim's token, or pushDone and the outcome.
	pushFormat = newFormat("Push", ":", false, field{"state", false}, field{"arg", false})
	// runIDFormat is the run id key's value, as the sweep mark stores it:
	// the run id of the Redis holding the control keys, and on a cluster
	// its current epoch. The release before the cluster's roles had a key
	// of their own took any change of this value for a failover, so the
	// value keeps its epoch though the mark no longer reads it: a
	// listener of that release, marking beside one of this, must read
	// the value it wrote itself.
	runIDFormat = newFormat("RunID", "/", true, field{"run", false}, field{"epoch", false})
	// rolesFormat is the roles key's value: each cluster node's role (see
	// lua/roles.lua), by node id, as "id:R,...", sorted.
	rolesFormat = newMapFormat("Roles", ",", newFormat("Role", ":", false, field{"id", false}, field{"role", false}))
	// inboxFormat is an inbox entry: the push request's JSON, which the
	// gateway writes and reads back, with the times of its keeping added
	// by inbox_keep.lua. The inbox reads the guide's id and deadline from
	// the request. An entry of a gateway before the added fields has none
	// of them; push.Request ignores them, so a gateway of any release
	// reads an entry as the request.
	inboxFormat = newObjectFormat("InboxEntry",
		objectField{key: "id", text: true},
		objectField{key: "deadline_ms"},             // 0 or absent: unknown, or a gateway before it
		objectField{key: "kept_ms", added: true},    // when it was kept, Unix ms
		objectField{key: "expires_ms", added: true}, // when it expires: its deadline (else kept_ms) plus the max age
		// a close stage's guide whose close was applied: when it was kept,
		// from which on it is judged
		objectField{key: "closed_ms", added: true, optional: true},
	)
)

// listenerFailing is a listener replica's mark state while it cannot
// produce.
const listenerFailing = "failing"

// inboxEntry is what the model reads of an inbox entry (inboxFormat).
// A time is Unix ms; 0 when absent.
type inboxEntry struct {
	ID                                      string
	DeadlineMS, KeptMS, ExpiresMS, ClosedMS int64
}

// decodeInboxEntry reads an inbox entry; ok is false when it is not a
// JSON object.
func decodeInboxEntry(s string) (e inboxEntry, ok bool) {
	v, ok := inboxFormat.decode(s)
	if !ok {
		return inboxEntry{}, false
	}
	n := func(s string) int64 { i, _ := strconv.ParseInt(s, 10, 64); return i }
	return inboxEntry{ID: v[0], DeadlineMS: n(v[1]), KeptMS: n(v[2]), ExpiresMS: n(v[3]), ClosedMS: n(v[4])}, true
}

// encodeInboxEntry is the entry keeping request (the push request's
// JSON) with e's times writes, as inbox_keep.lua does: e's id and
// deadline are the request's own, and not written. ok is false when
// request is not a JSON object with a field.
func encodeInboxEntry(request []byte, e inboxEntry) (string, bool) {
	closed := ""
	if e.ClosedMS != 0 {
		closed = strconv.FormatInt(e.ClosedMS, 10)
	}
	return inboxFormat.encode(string(request), strconv.FormatInt(e.KeptMS, 10), strconv.FormatInt(e.ExpiresMS, 10), closed)
}

// checkSegment refuses a renewal of a segment that is not a segment's
// name (userid.ValidSegment): the session key's value holds the segment
// before a "/" (sessionFormat), so one holding "/" would be read back
// split. Tokens, activity events and the push API are checked already;
// this keeps any other caller of a grant to the same rule.
func checkSegment(uid, segment string) error {
	if !userid.ValidSegment(segment) {
		return fmt.Errorf("renew session %q: segment %q: want 1-64 characters of [A-Za-z0-9._-]", uid, segment)
	}
	return nil
}
