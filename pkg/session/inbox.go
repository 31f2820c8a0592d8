package session

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// The gateway's part of the model: a push's claim of a guide id for one
// user, and the user's inbox of guides kept while they have no
// connection. The push flow that uses them is the gateway's (push.go
// there).

// Outcomes of a push claim (ClaimPush).
const (
	PushFresh = "fresh" // claimed: push it
	PushBusy  = "busy"  // another push of it is under way
	PushDone  = "done"  // pushed before
	PushStale = "stale" // the user renewed after the guide's deadline
)

// Push states, the first field of a DeliveredKey's value (pushFormat).
const (
	pushClaimed = "c" // c:<token>, a push under way
	pushDone    = "d" // d:<outcome>, what the push did
)

// pushWords are the push states and claim outcomes the push scripts use.
type pushWords struct{ Claimed, Done, OutFresh, OutBusy, OutDone, OutStale string }

var pushVocab = pushWords{Claimed: pushClaimed, Done: pushDone,
	OutFresh: PushFresh, OutBusy: PushBusy, OutDone: PushDone, OutStale: PushStale}

// pushClaimScript claims a guide id for one user. It reads, besides the
// user's key of the id, the id's key as gateways before uid scoping wrote
// it, so that a guide they delivered is not delivered again after an
// upgrade. ARGV: claim token, claim ms, deadline ms (0 unknown). Returns
// one of the Push outcomes.
var pushClaimScript = newScript[pushClaimKeys]("push_claim", pushVocab, []codec{pushFormat})

// pushSettleScript records the outcome of a claimed push, or releases
// the claim when the outcome is empty; only while the claim is the
// caller's. ARGV: claim token, outcome, keep ms.
var pushSettleScript = newScript[deliveredKeys]("push_settle", pushVocab, []codec{pushFormat})

// ClaimPush claims guide id for uid for a push named token, for ttl. A
// deadline (Unix ms, 0 unknown) older than the user's last renewal makes
// it stale, unless id is a close stage whose close was decided applied
// (see CommitClose); one decided cancelled is stale. It returns one of
// the Push outcomes.
func (s *Store) ClaimPush(ctx context.Context, uid, id, token string, ttl time.Duration, deadlineMS int64) (string, error) {
	keys := pushClaimKeys{Delivered: s.ks.DeliveredKey(uid, id), Pushed: s.ks.PushedKey(uid, id), Renewed: s.ks.RenewedKey(uid),
		Close: s.ks.CloseKey(uid, id)}
	return pushClaimScript.Run(ctx, s.rdb, keys, token, ttl.Milliseconds(), deadlineMS).Text()
}

// LaterStageGoes reports whether a stage after stage of uid's silence
// that ran out at deadlineMS goes to the user's devices: one being pushed
// (claimed), settled with one of outcomes, or pushed by a gateway from
// before uid scoping, unless its close was cancelled (see CommitClose).
// One whose close no connection decided yet is decided now, applied: the
// caller sends its earlier stage because of it, and a close must not be
// cancelled after its reminder went out. (A later stage that is no close
// keeps the decision unread.) The stages are found by the ids the
// listener gives them (timeoutevent.StageID); decisions are kept for keep.
func (s *Store) LaterStageGoes(ctx context.Context, uid string, deadlineMS int64, stage int, keep time.Duration, outcomes ...string) (bool, error) {
	for st := stage + 1; st <= timeoutevent.MaxStages; st++ {
		id := timeoutevent.StageID(uid, deadlineMS, st)
		vals, err := s.rdb.MGet(ctx, s.ks.DeliveredKey(uid, id), s.ks.PushedKey(uid, id), s.ks.CloseKey(uid, id)).Result()
		if err != nil {
			return false, fmt.Errorf("later stages of %q's silence: %w", uid, err)
		}
		switch c, _ := vals[2].(string); c {
		case closeApplied:
			return true, nil
		case closeCancelled:
			continue
		}
		if !pushedAs(vals[0], vals[1], outcomes) {
			continue
		}
		// Applied now, its time kept (see CloseAppliedAt), unless decided
		// meanwhile by a connection about to write it.
		applied, err := s.ApplyClose(ctx, uid, id, keep)
		if err != nil {
			return false, fmt.Errorf("apply the close of a later stage of %q's silence: %w", uid, err)
		}
		if applied {
			return true, nil
		}
	}
	return false, nil
}

// pushedAs reports whether a push state (DeliveredKey's, PushedKey's, as
// MGET read them) says a push is under way, settled with one of outcomes,
// or done by a gateway from before uid scoping.
func pushedAs(delivered, legacy any, outcomes []string) bool {
	if _, ok := legacy.(string); ok {
		return true
	}
	str, ok := delivered.(string)
	if !ok {
		return false
	}
	f, ok := pushFormat.decode(str)
	return ok && (f[0] == pushClaimed || f[0] == pushDone && slices.Contains(outcomes, f[1]))
}

// SettlePush records the outcome of the push token claimed guide id for
// uid with, kept for keep, or releases the claim when outcome is "".
func (s *Store) SettlePush(ctx context.Context, uid, id, token, outcome string, keep time.Duration) error {
	return pushSettleScript.Run(ctx, s.rdb, deliveredKeys{Delivered: s.ks.DeliveredKey(uid, id)},
		token, outcome, keep.Milliseconds()).Err()
}

// inboxKeepScript adds a guide to a user's capped inbox, unless a
// connection of the user registered since the route was read (returns
// 0: route again) or the guide is past its max age (returns -1). The
// inbox holds one entry per guide id: a guide it holds already (kept
// ahead of its live delivery, see the gateway's push.go) is kept as it is
// (returns 2), unless this keep marks it closed, which replaces it; and
// one settled (a connection proved it got it, see DropFromInboxes) is not
// kept (returns 3). An
// entry (inboxFormat) is the request's JSON with kept_ms and expires_ms
// added: its deadline (or, unknown or a later stage's, the time it was
// kept) plus the max age; and closed_ms, the time it was kept, for a
// close stage's guide whose close was applied. Older gateways read it as
// a request. ARGV:
// request JSON, max age ms, cap, inbox ttl ms, deadline ms (0: count from
// now), check route (1/0), closed (1/0), then the route as read:
// instance, count pairs. Returns 1 when kept.
var inboxKeepScript = newScript[inboxKeepKeys]("inbox_keep", nil, []codec{inboxFormat})

// Keep is a guide to keep in its user's inbox.
type Keep struct {
	Entry  []byte        // the push request's JSON
	MaxAge time.Duration // from From, or from when it is kept
	From   int64         // Unix ms the max age counts from; 0: now
	Cap    int           // entries the inbox keeps, the newest; 0: no trim
	TTL    time.Duration // the longest the inbox lives
	Closed bool          // a close stage's guide whose close was applied
	// With CheckRoute, the guide is not kept if a connection registered
	// since Routes, the user's route, was read.
	CheckRoute bool
	Routes     map[string]string
}

// What became of a guide to keep.
const (
	KeptRouteChanged = 0  // a connection registered since the route was read
	KeptQueued       = 1  // kept
	KeptAlready      = 2  // an entry of its id is kept already
	KeptSettled      = 3  // settled (proven received): not kept
	KeptTooOld       = -1 // past its max age
)

// KeepGuide keeps a guide in uid's inbox, and returns one of the Kept
// outcomes.
func (s *Store) KeepGuide(ctx context.Context, uid string, k Keep) (int, error) {
	check, closed := 0, 0
	if k.CheckRoute {
		check = 1
	}
	if k.Closed {
		closed = 1
	}
	args := []any{k.Entry, k.MaxAge.Milliseconds(), k.Cap, k.TTL.Milliseconds(), k.From, check, closed}
	for inst, n := range k.Routes {
		args = append(args, inst, n)
	}
	keys := inboxKeepKeys{Inbox: s.ks.InboxKey(uid), Route: s.ks.RouteKey(uid), Settled: s.ks.InboxSettledKey(uid)}
	return inboxKeepScript.Run(ctx, s.rdb, keys, args...).Int()
}

// inboxDropScript removes a user's inbox entries of some guide ids, with
// their leases, and may mark them settled (see DropFromInboxes). ARGV:
// how long to mark them settled, ms (0: not), whether to leave entries
// marked closed (1/0), then the ids. Returns how many entries it removed.
var inboxDropScript = newScript[inboxDropKeys]("inbox_drop", nil, []codec{inboxFormat})

// InboxDrop is a guide to take out of its user's inbox.
type InboxDrop struct{ UID, ID string }

// DropHow is how DropFromInboxes takes guides out.
type DropHow struct {
	// Settled marks each id settled this long (its user has it, or needs
	// it no more): a keep of it meanwhile adds nothing (KeptSettled).
	// 0: not marked.
	Settled time.Duration
	// KeepClosed leaves an entry of a close stage whose close was
	// applied (Keep.Closed): a client's word of activity, which found
	// the guide superseded, does not drop those.
	KeepClosed bool
}

// DropFromInboxes removes each drop's inbox entries, and their leases, in
// one pipeline: guides kept ahead of their live delivery once a
// connection proved it got them, or found superseded, or that reached
// nobody; how says how (see DropHow). It returns how many calls
// succeeded, and the first error.
func (s *Store) DropFromInboxes(ctx context.Context, drops []InboxDrop, how DropHow) (int, error) {
	keepClosed := 0
	if how.KeepClosed {
		keepClosed = 1
	}
	cmds := s.runScripts(ctx, len(drops), func(i int) (*redis.Script, []string, []any) {
		d := drops[i]
		keys := inboxDropKeys{Inbox: s.ks.InboxKey(d.UID), Leases: s.ks.InboxLeaseKey(d.UID), Settled: s.ks.InboxSettledKey(d.UID)}
		return inboxDropScript.call(keys, how.Settled.Milliseconds(), keepClosed, d.ID)
	}, DefaultSlotRetry)
	n := 0
	for _, c := range cmds {
		if c.Err() == nil {
			n++
		}
	}
	return n, firstErr(cmds)
}

// inboxTakeScript returns up to ARGV[1] inbox entries, oldest first,
// without removing them: an entry leaves the inbox once written to a
// socket. Each returned is leased for ARGV[2] ms, so that another
// connection of the user does not take it meanwhile; its lease goes when
// it is written, or when the connection ends first. Entries past their
// expiry, those whose user renewed after their deadline (stale), and
// those whose deadline falls while the user was present by their
// client's word (superseded) are removed on the way; entries of older
// gateways, which carry neither, are handed over. An entry marked
// closed_ms (a close stage's guide whose close was applied) is never
// superseded: the chat was closed, whatever the client says of its user
// since. For a connection open since before that time it is never stale:
// that device was there and was never told. For another, a renewal after
// that time makes it stale for that connection only: it is left in the
// inbox, neither handed nor leased, for a device open since before it
// (on this instance or another) whose take may come later, and goes at
// its expiry. ARGV: limit, lease ms, then the client's
// word: how long before now the user was last active (ms; -1: not said),
// the TTL a renewal then would have granted (ms), a present-until time
// already known (Unix ms; 0: none), and when the taking connection
// opened (Unix ms; 0: not said).
// Returns {stale count s, expired count e, present until (0: none),
// superseded count n, s stale entries, e expired entries, n superseded
// entries, entry...}: the entries dropped, for the user's timeline.
var inboxTakeScript = newScript[inboxTakeKeys]("inbox_take", nil, []codec{inboxFormat})

// Taken is what a take of an inbox found.
type Taken struct {
	Items      []string // entries leased to the caller, oldest first
	Superseded []string // entries dropped: the user was present at their deadline
	Stale      []string // entries dropped: the user renewed after their deadline
	Expired    []string // entries dropped: past their expiry
	// PresentUntil is the present-until time now known, Unix ms; 0: none.
	PresentUntil int64
}

// TakeWord is what a take of an inbox is judged by (see inboxTakeScript).
type TakeWord struct {
	// AgoMS is how long before now the client says the user was last
	// active (-1: not said); TTLMS the TTL a renewal then would have
	// granted.
	AgoMS, TTLMS int64
	// KnownMS is a present-until time already known (Unix ms; 0: none).
	KnownMS int64
	// OpenedMS is when the taking connection opened (Unix ms; 0: not
	// said): a close applied after it is handed over whatever renewed.
	OpenedMS int64
}

// TakeInbox leases up to limit of uid's inbox entries for lease (see
// inboxTakeScript), judging them by w.
func (s *Store) TakeInbox(ctx context.Context, uid string, limit int, lease time.Duration, w TakeWord) (Taken, error) {
	keys := inboxTakeKeys{Inbox: s.ks.InboxKey(uid), Renewed: s.ks.RenewedKey(uid), Leases: s.ks.InboxLeaseKey(uid)}
	vals, err := inboxTakeScript.Run(ctx, s.rdb, keys, limit, lease.Milliseconds(), w.AgoMS, w.TTLMS, w.KnownMS, w.OpenedMS).Slice()
	if err != nil {
		return Taken{}, err
	}
	if len(vals) < 4 {
		return Taken{}, fmt.Errorf("%d values", len(vals))
	}
	var t Taken
	t.PresentUntil, _ = vals[2].(int64)
	rest := vals[4:]
	var lists [3][]string // stale, expired, superseded
	for i, at := range []int{0, 1, 3} {
		n, _ := vals[at].(int64)
		if n < 0 || int(n) > len(rest) {
			return Taken{}, fmt.Errorf("%d dropped entries of %d values", n, len(vals))
		}
		for _, v := range rest[:n] {
			if s, ok := v.(string); ok {
				lists[i] = append(lists[i], s)
			}
		}
		rest = rest[n:]
	}
	t.Stale, t.Expired, t.Superseded = lists[0], lists[1], lists[2]
	for _, v := range rest {
		if s, ok := v.(string); ok {
			t.Items = append(t.Items, s)
		}
	}
	return t, nil
}
