package session

// The key lists of the scripts. Each type is one script's KEYS: list
// returns them in the order of its fields (TestKeyListsFollowTheirFields
// holds it to that), and the script names them by field, K.index for
// Index (see keyTable). A []string last is a tail of keys of a varying
// count, K.<name> the index of its first. On a Redis Cluster every key
// of one list is of one slot: a session's bucket hash tag, or {ctl}.

// bucketKeys are the keys of one bucket's deadline index.
type bucketKeys struct{ Index, Segments, Via, Hold, Held, Stage string }

func (k bucketKeys) list() []string {
	return []string{k.Index, k.Segments, k.Via, k.Hold, k.Held, k.Stage}
}

// sessionKeys are the keys of one user's session.
type sessionKeys struct {
	Session string
	bucketKeys
	Renewed, Turn string
}

func (k sessionKeys) list() []string {
	return append(append([]string{k.Session}, k.bucketKeys.list()...), k.Renewed, k.Turn)
}

// grantKeys are the keys of one user's session and the user's timeline,
// which a grant or an end that cancels a hold appends to, and the user's
// route, which a renewal checks for its instance: renew.lua, end.lua.
type grantKeys struct {
	sessionKeys
	Timeline, Route string
}

// list is in one allocation: every renewal builds one.
func (k grantKeys) list() []string {
	b := k.bucketKeys
	return []string{k.Session, b.Index, b.Segments, b.Via, b.Hold, b.Held, b.Stage, k.Renewed, k.Turn, k.Timeline, k.Route}
}

// activityKeys are a bucket's keys and, for each activity event, its
// user's session, renewed, turn and timeline keys, in the order of the
// events: activity.lua.
type activityKeys struct {
	bucketKeys
	Users []string
}

func (k activityKeys) list() []string { return append(k.bucketKeys.list(), k.Users...) }

// lookupKeys: lookup.lua.
type lookupKeys struct {
	sessionKeys
	Route, Stamps string
}

func (k lookupKeys) list() []string { return append(k.sessionKeys.list(), k.Route, k.Stamps) }

// entryKeys are a bucket's keys and the session key of each entry a
// script decides on, in the order of its arguments: settle.lua,
// follow.lua, hold.lua.
type entryKeys struct {
	bucketKeys
	Sessions []string
}

func (k entryKeys) list() []string { return append(k.bucketKeys.list(), k.Sessions...) }

// dueKeys are a bucket's keys and, for each candidate, its session key,
// its route key and its route stamps key: due.lua.
type dueKeys struct {
	bucketKeys
	Entries []string
}

func (k dueKeys) list() []string { return append(k.bucketKeys.list(), k.Entries...) }

// setKeys: candidates.lua, over the index or the hold set.
type setKeys struct{ Set string }

func (k setKeys) list() []string { return []string{k.Set} }

// stagedKeys: staged_candidates.lua.
type stagedKeys struct{ Stage, Index string }

func (k stagedKeys) list() []string { return []string{k.Stage, k.Index} }

// heartbeatKeys: heartbeat.lua.
type heartbeatKeys struct{ Alive, Blind string }

func (k heartbeatKeys) list() []string { return []string{k.Alive, k.Blind} }

// blindKeys: blind_since.lua.
type blindKeys struct{ Blind string }

func (k blindKeys) list() []string { return []string{k.Blind} }

// markKeys: mark.lua.
type markKeys struct{ Swept, Blind, Alive, Listeners, RunID, Roles, Activity string }

func (k markKeys) list() []string {
	return []string{k.Swept, k.Blind, k.Alive, k.Listeners, k.RunID, k.Roles, k.Activity}
}

// feedKeys: activity_caught_up.lua.
type feedKeys struct{ Activity, Blind string }

func (k feedKeys) list() []string { return []string{k.Activity, k.Blind} }

// lapseKeys are a count's token, and the lapse keys of a window up to the
// second lapses were found in and of the seconds after it, one a second,
// oldest first: lapses.lua.
type lapseKeys struct {
	Token   string
	Seconds []string
}

func (k lapseKeys) list() []string { return append([]string{k.Token}, k.Seconds...) }

// aliveKeys: instances.lua.
type aliveKeys struct{ Alive string }

func (k aliveKeys) list() []string { return []string{k.Alive} }

// routeKeys: route.lua, which writes a route and may end the session.
type routeKeys struct {
	Route string
	sessionKeys
	Stamps, Timeline, Inbox string
}

func (k routeKeys) list() []string {
	return append(append([]string{k.Route}, k.sessionKeys.list()...), k.Stamps, k.Timeline, k.Inbox)
}

// routeStampKeys: drop_routes.lua.
type routeStampKeys struct{ Route, Stamps string }

func (k routeStampKeys) list() []string { return []string{k.Route, k.Stamps} }

// dedupKeys: retry_elsewhere.lua, mark_stale.lua.
type dedupKeys struct{ Dedup string }

func (k dedupKeys) list() []string { return []string{k.Dedup} }

// dedupEachKeys: claim.lua, release_claim.lua: the dedup keys of
// timeouts of one bucket, one each.
type dedupEachKeys struct{ Dedup []string }

func (k dedupEachKeys) list() []string { return k.Dedup }

// pushClaimKeys: push_claim.lua.
type pushClaimKeys struct{ Delivered, Pushed, Renewed, Close string }

func (k pushClaimKeys) list() []string { return []string{k.Delivered, k.Pushed, k.Renewed, k.Close} }

// deliveredKeys: push_settle.lua.
type deliveredKeys struct{ Delivered string }

// closeKeys: close_commit.lua.
type closeKeys struct{ Renewed, Close, CloseAt string }

func (k closeKeys) list() []string { return []string{k.Renewed, k.Close, k.CloseAt} }

func (k deliveredKeys) list() []string { return []string{k.Delivered} }

// inboxKeepKeys: inbox_keep.lua.
type inboxKeepKeys struct{ Inbox, Route, Settled string }

func (k inboxKeepKeys) list() []string { return []string{k.Inbox, k.Route, k.Settled} }

// inboxDropKeys: inbox_drop.lua.
type inboxDropKeys struct{ Inbox, Leases, Settled string }

func (k inboxDropKeys) list() []string { return []string{k.Inbox, k.Leases, k.Settled} }

// inboxTakeKeys: inbox_take.lua.
type inboxTakeKeys struct{ Inbox, Renewed, Leases string }

func (k inboxTakeKeys) list() []string { return []string{k.Inbox, k.Renewed, k.Leases} }

// checkKeys: check.lua: per user of one bucket, its session key and its
// renewed key.
type checkKeys struct{ Entries []string }

func (k checkKeys) list() []string { return k.Entries }

// timelineAddKeys: timeline_add.lua: per entry, its user's timeline, all
// of one bucket.
type timelineAddKeys struct{ Entries []string }

func (k timelineAddKeys) list() []string { return k.Entries }

// timelineKeys: timeline_read.lua.
type timelineKeys struct{ Timeline string }

func (k timelineKeys) list() []string { return []string{k.Timeline} }
