package session

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stillthere/stillthere/pkg/userid"
)

// Whose turn it is. A segment's clock says when a user's silence counts:
// on the presence clock from their last activity (a ping, an active
// event), on the turn clock only while it is their turn. On both, a turn
// to us holds it: while the user waits for us no silence counts and no
// stage fires, until the next turn to the user, or until the turn's max
// hold has passed, after which the clock runs as if the turn had passed
// to the user then.
//
// The hold is a parked deadline. Every renewal (renewScript, and the
// activity events that renew) reads the user's turn state (TurnKey) and
// the segment's clock; while the clock is held it writes the deadline as
// the hold's end plus the TTL, and the session key lives as long. A
// parked deadline is a deadline like any other, only later: the sweep,
// a prefetched timer's confirmation and a consumer's check all find the
// session live and not due, and the rule that a renewal never moves a
// deadline earlier keeps pings and resyncs from pulling it in. A turn to
// the user is the one thing that moves a deadline earlier: it ends the
// park, and the deadline becomes now plus the TTL.

// Clock is a segment's clock.
type Clock string

const (
	// ClockPresence counts a silence from the user's last activity.
	// It is the clock of a segment that names none ("" reads as it).
	ClockPresence Clock = "presence"
	// ClockTurn counts a silence only while it is the user's turn: until
	// the first turn to the user a session is held, as on our turn.
	ClockTurn Clock = "turn"
)

// Valid reports whether c is a clock ("" is the presence clock).
func (c Clock) Valid() bool { return c == "" || c == ClockPresence || c == ClockTurn }

// ActivityKind is what an activity event says.
type ActivityKind string

const (
	// ActivityActive: the user did something. It renews as a ping does,
	// counting the TTL from its time, and creates the session if there
	// is none; one whose time plus the TTL is past is stale.
	ActivityActive ActivityKind = "active"
	// ActivityTurnUser: we spoke, the turn is the user's. Their clock
	// runs from its time: it renews as active does, and ends a park.
	ActivityTurnUser ActivityKind = "turn_user"
	// ActivityTurnUs: the user waits for us. No silence counts until the
	// next turn to the user, or until MaxHold has passed. It renews as
	// active does, and cancels the stages left.
	ActivityTurnUs ActivityKind = "turn_us"
	// ActivityEnd: the conversation is over. The session ends and the
	// stages left are cancelled, as End does; the turn state becomes
	// "ended" at the end's time, for activityKeep, so that a turn or
	// active event older than the end is stale. A newer one starts
	// afresh.
	ActivityEnd ActivityKind = "end"
)

// MaxTurnHold is the longest a turn to us holds a user's clock, and how
// long one without a max hold of its own does; on the turn clock, the
// longest a session waits for its first turn to the user, from its last
// renewal. A platform that forgets to pass the turn back must not hold a
// user forever.
const MaxTurnHold = 24 * time.Hour

// Activity is one activity event of a platform's servers.
type Activity struct {
	UID string
	// Segment is the user's segment. "" is the segment of the user's
	// session, else DefaultSegment, as the script finds it when it
	// applies the event.
	Segment string
	Kind    ActivityKind
	// At is when it happened. An event older than the state it would
	// change changes nothing (see ApplyActivity): it is compared as
	// given, so that a platform's clock ahead of Redis's keeps its
	// events' order. Zero: now, by Redis's clock. What counts from it (a
	// max hold, the renewal recorded) counts from no later than Redis's
	// now.
	At time.Time
	// MaxHold is how long a turn to us holds at most, from At: 0 is
	// MaxTurnHold, more is refused. ActivityTurnUs only.
	MaxHold time.Duration
	// TTL is the segment's session TTL with its jitter, and Clock its
	// clock, from the policy in force. Not read for ActivityEnd. A TTL of
	// 0 is the segment's by the rules ApplyActivity is given, resolved by
	// the script with the segment: the rule's TTL plus Jitter, truncated
	// to whole ms as a ping's grant is, and the rule's clock.
	TTL   time.Duration
	Clock Clock
	// Jitter is added to the rule's TTL when TTL is 0: a draw in [0, the
	// policy's jitter), as each ping's grant has its own.
	Jitter time.Duration
}

// SegmentRule is what a segment's events are granted: its session TTL,
// before jitter, and its clock.
type SegmentRule struct {
	TTL   time.Duration
	Clock Clock
}

// SegmentRules are the policy's rules by segment, for the events whose
// TTL the script resolves (Activity.TTL 0): Segments by name, Unlisted
// for every other segment.
type SegmentRules struct {
	Segments map[string]SegmentRule
	Unlisted SegmentRule
}

// Of is the rule of segment, as the script looks it up ("" is
// DefaultSegment).
func (r SegmentRules) Of(segment string) SegmentRule {
	if segment == "" {
		segment = DefaultSegment
	}
	if rule, ok := r.Segments[segment]; ok {
		return rule
	}
	return r.Unlisted
}

// check names what is wrong with the rules.
func (r SegmentRules) check() error {
	for name, rule := range r.Segments {
		if !userid.ValidSegment(name) {
			return fmt.Errorf("rule of segment %q: not a valid segment name", name)
		}
		if err := rule.check(); err != nil {
			return fmt.Errorf("rule of segment %s: %w", name, err)
		}
	}
	if err := r.Unlisted.check(); err != nil {
		return fmt.Errorf("rule of the segments not listed: %w", err)
	}
	return nil
}

func (r SegmentRule) check() error {
	if r.TTL < time.Millisecond || r.TTL > MaxTurnHold {
		return fmt.Errorf("ttl %v: want 1ms to %v", r.TTL, MaxTurnHold)
	}
	if !r.Clock.Valid() {
		return fmt.Errorf("clock %q: want %s or %s", r.Clock, ClockPresence, ClockTurn)
	}
	return nil
}

// activityKeep is how long the events' state outlives a deadline (the
// last renewal's time, the turn state; an end's, from the end): at
// least RenewedKeep, and long enough that an event older than it is
// over (its time plus its TTL and jitter past) before it is forgotten.
// Else an active sent again, or late, between the two would be applied:
// with a segment's TTL over RenewedKeep, a conversation the platform
// ended would come back, and its user be guided. A policy's jitter is
// at most half its shortest TTL.
func activityKeep(rules SegmentRules, events []Activity) time.Duration {
	longest := rules.Unlisted.TTL
	for _, rule := range rules.Segments {
		longest = max(longest, rule.TTL)
	}
	for _, e := range events {
		longest = max(longest, e.TTL)
	}
	return max(RenewedKeep, longest+longest/2)
}

// args is the rules as the activity script reads them, after the events.
func (r SegmentRules) args() []any {
	out := make([]any, 0, 3+3*len(r.Segments))
	out = append(out, len(r.Segments))
	for name, rule := range r.Segments {
		out = append(out, name, rule.TTL.Nanoseconds(), string(rule.Clock))
	}
	return append(out, r.Unlisted.TTL.Nanoseconds(), string(r.Unlisted.Clock))
}

// ActivityResult is what a batch of activity events did.
type ActivityResult struct {
	Applied int // events applied
	Stale   int // events older than the state they would change: nothing changed
	// Turned are the events, by their index in the batch (in order), that changed
	// whose turn it is: a turn to the user or to us over another (or
	// none), an end over a turn. Applied events all the same.
	Turned []int
	// Segments are the segments of the Turned events, by index, as the
	// script resolved them.
	Segments map[int]string
}

// Words of the turn state and the activity script, passed to the scripts
// as their vocabulary (see scripts.go).
const (
	turnUser  = "user"  // the user's turn
	turnUs    = "us"    // our turn
	turnEnded = "ended" // no turn: the platform ended the conversation at since
	turnWait  = "wait"  // no turn yet: the turn clock parks until the first turn to the user
)

// turnWords is the vocabulary of renewScript and activityScript, which
// share the grant (lua/grant.lua).
type turnWords struct{ Resync, Lapsed, ClockTurn, User, Us, Ended, Wait, Active, TurnUser, TurnUs, Ending string }

var turnVocab = turnWords{Resync: modeResync, Lapsed: modeLapsed, ClockTurn: string(ClockTurn), User: turnUser, Us: turnUs,
	Ended: turnEnded, Wait: turnWait, Active: string(ActivityActive), TurnUser: string(ActivityTurnUser),
	TurnUs: string(ActivityTurnUs), Ending: string(ActivityEnd)}

// turnFormat is the turn state's value: whose turn (turnUser, turnUs),
// since when (the event's time as sent, which may be ahead of Redis's
// clock), and till when a turn to us holds, in ms (0 for the user's); or turnEnded, since the platform's end; or turnWait, the turn
// clock's park until the first turn to the user, till when, since the
// state it replaced (an end's time, else 0: a ping's time must not make
// the platform's turns stale). Neither is a turn, but the ended state
// orders: an event older than the end is stale, so a turn sent before
// the end cannot bring the conversation back. The wait state records the
// park, so that a turn to the user ends it whatever the segment's clock
// is by then (the operator may have switched it to presence). A wait
// this release writes has a fourth field, kept: the latest deadline the
// user's activity gave unheld while the park stands, on any device (the
// park's own deadline hides it in the index, and a park given up keeps
// it), and 0 once the park is given up (the state kept for its since).
// An earlier release takes a value of four fields for no turn state: its
// turn to the user gives such a park up on the turn clock, as it gives a
// wait up.
var turnFormat = newFormat("Turn", ":", true, field{"whose", false}, field{"since", true}, field{"till", true}, field{"kept", true})

// activityScript applies one bucket's activity events, in order, each
// as its kind says (see ActivityKind), through the grant renewScript
// makes and the end endScript makes (lua/grant.lua). An event older than
// the state it would change is stale and changes nothing: a turn older
// than the turn stored; an active event older than the user's last
// renewal; an end older than either; any event older than the
// platform's end stored in the turn state; an active or a turn to the
// user whose time plus its TTL is past (its silence was over before it
// reached us: a replayed backlog must not start fresh ones). A turn event records the turn as
// the user's or ours, since its time; a turn to us holds until its time
// plus its max hold. An event that cancels a hold on the user's timeout
// says so in their timeline (see HoldNotes). Keys: the bucket's, then
// each event's user's session, renewed, turn and timeline keys
// (activityKeys). ARGV: event count, instance, keep ms, MaxTurnHold ms,
// DefaultSegment, the note block (4), then per event uid, kind, segment
// ("": the user's, else DefaultSegment), ttl ms (0: the segment's by the
// rules), clock, at ms (0: now), max hold ms, jitter ns; then the rules
// (SegmentRules.args). Returns 1 (applied), 2 (applied, and it changed
// whose turn it is) or 0 (stale) per event, and the segment of each that
// changed whose turn it is, in order.
var activityScript = newScript[activityKeys]("activity", turnVocab, []codec{sessionFormat, viaFormat, turnFormat, holdNoteCodec{}}, "holdnote", "grant")

// activityArgs is the number of ARGV of one event of activityScript.
const activityArgs = 8

// ApplyActivity applies activity events, as the user's gateway instance
// instance would (its name is recorded as a renewing gateway's: an outage
// of it holds the deadlines it wrote). An event of no TTL takes its
// segment's from rules, in the script, with the segment it resolves: no
// round trip first to learn a user's segment. It makes one script call per
// bucket the events touch, so that a user's events, all of one bucket,
// apply in the order given; the calls go in two pipelines at once
// (runScriptsOverlapped), each of half the buckets. A batch with an invalid
// event is refused whole, naming it, before anything is sent. When a
// bucket's call fails, the others' events may have applied: the error
// says so, and the result counts them.
func (s *Store) ApplyActivity(ctx context.Context, instance string, rules SegmentRules, events []Activity) (ActivityResult, error) {
	ruled := false
	for i, e := range events {
		if err := e.check(); err != nil {
			return ActivityResult{}, fmt.Errorf("activity event %d: %w", i, err)
		}
		ruled = ruled || (e.TTL == 0 && e.Kind != ActivityEnd)
	}
	if ruled {
		if err := rules.check(); err != nil {
			return ActivityResult{}, fmt.Errorf("activity rules: %w", err)
		}
	}
	ruleArgs := rules.args()
	keep := activityKeep(rules, events)
	byBucket := make(map[int][]int)
	var buckets []int
	for i, e := range events {
		b := Bucket(e.UID)
		if byBucket[b] == nil {
			buckets = append(buckets, b)
		}
		byBucket[b] = append(byBucket[b], i)
	}
	call := func(i int) (*redis.Script, []string, []any) {
		idx := byBucket[buckets[i]]
		keys := activityKeys{bucketKeys: s.ks.bucketKeys(buckets[i]), Users: make([]string, 0, 4*len(idx))}
		notes := s.noteBlock()
		argv := make([]any, 0, 5+len(notes)+activityArgs*len(idx)+len(ruleArgs))
		argv = append(argv, len(idx), instance, keep.Milliseconds(), MaxTurnHold.Milliseconds(), DefaultSegment)
		argv = append(argv, notes...)
		for _, j := range idx {
			e := events[j]
			keys.Users = append(keys.Users, s.ks.SessionKey(e.UID), s.ks.RenewedKey(e.UID), s.ks.TurnKey(e.UID),
				s.ks.TimelineKey(e.UID))
			at := int64(0)
			if !e.At.IsZero() {
				at = max(e.At.UnixMilli(), 1)
			}
			hold := e.MaxHold
			if hold == 0 {
				hold = MaxTurnHold
			}
			argv = append(argv, e.UID, string(e.Kind), e.Segment, e.TTL.Milliseconds(), string(e.Clock), at, hold.Milliseconds(),
				e.Jitter.Nanoseconds())
		}
		argv = append(argv, ruleArgs...)
		return activityScript.call(keys, argv...)
	}
	cmds := s.runScriptsOverlapped(ctx, len(buckets), call, DefaultSlotRetry)
	var res ActivityResult
	var failed, lost int
	var firstErr error
	for i, cmd := range cmds {
		n := len(byBucket[buckets[i]])
		got, segs, err := activityReply(cmd)
		if err == nil && len(got) != n {
			err = fmt.Errorf("%w: %d outcomes for %d events", errReply, len(got), n)
		}
		if err != nil {
			failed++
			lost += n
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		for j, v := range got {
			if v >= 1 {
				res.Applied++
			} else {
				res.Stale++
			}
			if v == 2 {
				at := byBucket[buckets[i]][j]
				res.Turned = append(res.Turned, at)
				seg := DefaultSegment
				if len(segs) > 0 {
					seg, segs = cmp.Or(segs[0], DefaultSegment), segs[1:]
				}
				if res.Segments == nil {
					res.Segments = map[int]string{}
				}
				res.Segments[at] = seg
			}
		}
	}
	slices.Sort(res.Turned)
	if firstErr != nil {
		return res, fmt.Errorf("apply activity: %d of %d buckets (%d events) failed, the others applied: %w",
			failed, len(buckets), lost, firstErr)
	}
	return res, nil
}

// activityReply reads the activity script's reply: an outcome per event,
// and the segments of those that turned.
func activityReply(cmd *redis.Cmd) (outcomes []int64, segs []string, err error) {
	v, err := cmd.Slice()
	if err != nil {
		return nil, nil, err
	}
	if len(v) != 2 {
		return nil, nil, fmt.Errorf("%w: activity reply of %d parts, want 2", errReply, len(v))
	}
	codes, ok1 := v[0].([]any)
	names, ok2 := v[1].([]any)
	if !ok1 || !ok2 {
		return nil, nil, fmt.Errorf("%w: activity reply %v", errReply, v)
	}
	outcomes = make([]int64, len(codes))
	for i, c := range codes {
		if outcomes[i], ok1 = c.(int64); !ok1 {
			return nil, nil, fmt.Errorf("%w: activity outcome %v", errReply, c)
		}
	}
	segs = make([]string, len(names))
	for i, s := range names {
		segs[i], _ = s.(string)
	}
	return outcomes, segs, nil
}

// check names what is wrong with an event.
func (e Activity) check() error {
	if !userid.Valid(e.UID) {
		return fmt.Errorf("uid %q: not a valid user id", e.UID)
	}
	if e.Segment != "" && !userid.ValidSegment(e.Segment) {
		return fmt.Errorf("segment %q: not a valid segment name", e.Segment)
	}
	switch e.Kind {
	case ActivityEnd:
		return nil
	case ActivityActive, ActivityTurnUser, ActivityTurnUs:
	default:
		return fmt.Errorf("kind %q: want %s, %s, %s or %s", e.Kind, ActivityActive, ActivityTurnUser, ActivityTurnUs, ActivityEnd)
	}
	if e.TTL == 0 {
		if e.Jitter < 0 || e.Jitter > MaxTurnHold {
			return fmt.Errorf("jitter %v: want 0 to %v", e.Jitter, MaxTurnHold)
		}
	} else if e.TTL < time.Millisecond {
		return fmt.Errorf("ttl %v: want at least 1ms, or 0 for the rules'", e.TTL)
	}
	if !e.Clock.Valid() {
		return fmt.Errorf("clock %q: want %s or %s", e.Clock, ClockPresence, ClockTurn)
	}
	if e.MaxHold < 0 || e.MaxHold > MaxTurnHold || (e.MaxHold != 0 && e.Kind != ActivityTurnUs) {
		return fmt.Errorf("max hold %v: want 0 to %v, on %s only", e.MaxHold, MaxTurnHold, ActivityTurnUs)
	}
	return nil
}

// TurnState is whose turn it is in a user's conversation.
type TurnState struct {
	// Ours: the user waits for us, until Until; else it is the user's
	// turn.
	Ours  bool
	Since time.Time
	Until time.Time
}

// Turn reads uid's turn state; ok is false when there is none, as after
// the platform's end.
func (s *Store) Turn(ctx context.Context, uid string) (TurnState, bool, error) {
	v, err := s.rdb.Get(ctx, s.ks.TurnKey(uid)).Result()
	if err == redis.Nil {
		return TurnState{}, false, nil
	}
	if err != nil {
		return TurnState{}, false, fmt.Errorf("read turn of %q: %w", uid, err)
	}
	f, ok := turnFormat.decode(v)
	if !ok {
		return TurnState{}, false, fmt.Errorf("turn of %q: %w: %q", uid, errReply, v)
	}
	if f[0] != turnUser && f[0] != turnUs {
		return TurnState{}, false, nil
	}
	var since, until int64
	fmt.Sscan(f[1], &since)
	fmt.Sscan(f[2], &until)
	st := TurnState{Ours: f[0] == turnUs, Since: time.UnixMilli(since)}
	if st.Ours {
		st.Until = time.UnixMilli(until)
	}
	return st, true, nil
}
