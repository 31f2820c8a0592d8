package session

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// The scripts (lua/, see scripts.go) take their time from Redis (TIME),
// so deadlines never depend on a gateway's or listener's clock. Each
// declares in KEYS every key it touches, all of one bucket's hash tag, by
// its key list type (keylists.go): on a Redis Cluster whose slot
// migrates, the node then runs it only where all of them are (see
// pipeline.go), never reading a key where it no longer is.

// renewScript grants a session a TTL and writes its deadline-index entry
// in one step, records the gateway instance that granted it and when,
// and cancels a hold on its last timeout and the stages left of it: the
// user is back, and says so in their timeline (see HoldNotes). ARGV:
// uid, ttl ms, segment, instance, mode, keep ms, pinged ms ago, the
// segment's clock, MaxTurnHold ms, the note block (4).
//
// While the user's clock is held (our turn, or the turn clock before the
// first turn to the user: see turn.go), the deadline it writes is parked
// at the hold's end plus ttl.
//
// A renewal never moves a live deadline earlier: the deadline becomes the
// later of the one written and now+ttl. A user is present while any of
// their devices pings, and each device may be in a segment of its own
// (its token names it): a ping from one with a short TTL must not cut
// the grant one with a long TTL was just given, whose client was told it
// (its pong) and paces its pings by it. The segment and the instance
// stay those of the grant the deadline is, so the guide of that silence
// is the segment's whose grant ran out, and an outage of the instance
// that granted it holds it. The same rule keeps the largest jitter of a
// device's recent pings, and lets a policy that shortens a segment's TTL
// take effect once the grants given before it have run out. The via
// then names that grant's instance and, after a comma, this renewal's:
// the hold rules count the instance that renewed last too, whose
// device's pings an outage of it may be losing while no route names it
// (another instance drops a dead one's route entries). Between
// stages, or while a timeout is held, the deadline is past: any ping
// writes now+ttl.
//
// Mode "resync" restores a grant a gateway could not write while Redis was
// out of reach, or that Redis lost: it never shortens a deadline already
// written (another device, a later ping) nor one held for a recheck,
// but ends a silence between its stages, restores nothing older than a
// renewal or end Redis knows of, and records the renewal at the ping it
// restores. Returns {the session's deadline, this grant's own: now+ttl},
// in ms: a client paces its pings, and reads Redis's clock, by its own;
// and a third value, 1 when the user's route does not name the renewing
// instance (a node that restarted without its data lost it; another
// instance dropped this one's entry as dead), else 0.
//
// Mode "lapsed" is a resync of a grant that ran out while Redis was out
// of reach (ttl: what was left of it, at most 0, ran out that long ago):
// a silence that fell in the outage. It restores the session at its own
// deadline (past: due at once, and the deadline its guide names), in the
// blind interval its gateway recorded first, so that the listener holds it for the grace and then
// guides it once, but only if that silence cannot have been handled
// already: while the user's timeout is pending (an index entry that is
// not a stage, or a held timeout), or when Redis knows nothing of the
// user (no renewed key: the data was lost, or the renewal never landed),
// or between the stages of a silence whose deadline the ping came after:
// the user came back after the guide, and the silence their ping began
// fell in the outage (the stages left of the old one are dropped). Never
// between the stages of a silence the ping is older than (this grant's,
// or a later one: guided), nor when Redis knows a renewal or end as new
// as the ping; with a renewal recorded and no timeout pending, the
// silence was guided or ended, and it restores nothing. It returns {the
// session's deadline or 0, now} when it restores nothing.
var renewScript = newScript[grantKeys]("renew", turnVocab, []codec{sessionFormat, viaFormat, turnFormat, holdNoteCodec{}}, "holdnote", "grant")

// endScript removes a session deliberately ended by its user, and
// records the end as their last renewal: they were there until then. A
// hold it cancels on the user's timeout is said in their timeline (see
// HoldNotes). ARGV: uid, keep ms, the note block (4). It keeps the turn
// state, which expires on its own (the deadline it was last refreshed to
// plus the keep): the user closed a chat window, not the conversation,
// and one waiting for us who opens it again is still held. Only the
// platform's end ends the turn state.
var endScript = newScript[grantKeys]("end", turnVocab, []codec{sessionFormat, viaFormat, turnFormat, holdNoteCodec{}}, "holdnote", "grant")

// candidatesScript lists, by Redis's clock, up to ARGV[1] members of one
// sorted set whose score has come: the index entries whose deadline
// passed, or the held timeouts whose release time came. It reads one
// key, which a migrating slot never refuses: a key the source no longer
// holds is read on the target (ASK). ARGV: limit. Returns {now,
// member...}.
var candidatesScript = newScript[setKeys]("candidates", nil, nil)

// stagedCandidatesScript is candidatesScript for the index entries due
// for a stage past the first, found through the stage hash: a listener of
// keyspace events gets no event for them, and the index may hold many
// entries of stage 1 whose events never came. ARGV: limit. Returns
// {now, member...}.
var stagedCandidatesScript = newScript[stagedKeys]("staged_candidates", nil, nil)

// dueScript decides which of one bucket's candidates are due. It first
// puts back into the index the held timeouts among them (the first
// ARGV[2]) whose release time came, then lists up to ARGV[1] candidates
// whose deadline in the index has passed and whose session key is gone.
// EXISTS on a key past its TTL makes Redis expire it on the spot.
// With ARGV[3] 1 (later stages only), a candidate of the index is listed only when it
// is due for a stage past the first (a listener of keyspace events, which
// do not come again for a later stage). With ARGV[4] 1 it also says where
// each candidate not listed is now (see Confirm). Its keys name each
// candidate's session key, route key and route stamps key, in the order
// of the uids. ARGV:
// limit, held count, later-only flag, report flag, then the candidates'
// uids. Returns {now, {uid, index score or "", hold score or "", staged,
// ...}, uid, due, segment, via, held, routes, stage, ...}: the nested list
// is empty without the report flag, its staged 1 when the index entry is a
// stage past the first (0: a deadline, as a renewal writes); held is 1 when this due time was held
// once already, routes the gateway instances holding the user's
// connections and those whose entries were dropped as dead lately (see
// routedrop.lua), stage a stageFormat value or "" for stage 1.
var dueScript = newScript[dueKeys]("due", nil, nil, "routesof")

// Released returns held timeouts whose release time came to the index,
// as Due does, and the entries due for a stage past the first, but no
// others: for a listener that learns of expiries only from keyspace
// events, which do not come again for a released timeout, and do not
// come at all for a later stage.
func (s *Store) Released(ctx context.Context, limit int) ([]Expired, error) {
	out, _, err := s.sweep(ctx, limit, false)
	if err != nil {
		return nil, fmt.Errorf("release held timeouts: %w", err)
	}
	return out, nil
}

// candidates are the uids of one bucket a sweep decides on.
type candidates struct {
	held []string // held timeouts whose release time came
	due  []string // index entries whose deadline passed, not among held
}

// sweep finds due timeouts in two round trips: candidatesScript reads
// every bucket's candidates, with one key each, then dueScript decides on
// them, in the buckets that have any, with all their keys declared. With
// index false it reads the held timeouts and the entries due for a later
// stage only. It returns the latest Redis clock it saw.
func (s *Store) sweep(ctx context.Context, limit int, index bool) ([]Expired, time.Time, error) {
	laterOnly := 0 // dueScript's ARGV[3]: list index entries due for a later stage only
	if !index {
		laterOnly = 1
	}
	reads := s.runScripts(ctx, 2*Buckets, func(i int) (*redis.Script, []string, []any) {
		b := i % Buckets
		switch {
		case i < Buckets:
			return candidatesScript.call(setKeys{Set: s.ks.HoldKey(b)}, limit)
		case index:
			return candidatesScript.call(setKeys{Set: s.ks.IndexKey(b)}, limit)
		default:
			return stagedCandidatesScript.call(stagedKeys{Stage: s.ks.StageKey(b), Index: s.ks.IndexKey(b)}, limit)
		}
	}, 0)
	var found [Buckets]candidates
	var nowMS int64
	for i, cmd := range reads {
		vals, err := cmd.Slice()
		if err != nil {
			return nil, time.Time{}, err
		}
		ms, ok := int64(0), len(vals) > 0
		if ok {
			ms, ok = vals[0].(int64)
		}
		if !ok {
			return nil, time.Time{}, fmt.Errorf("%w: no time in %v", errReply, vals)
		}
		nowMS = max(nowMS, ms)
		c := &found[i%Buckets]
		for _, v := range vals[1:] {
			uid, _ := v.(string)
			switch {
			case uid == "":
				return nil, time.Time{}, fmt.Errorf("%w: member %v", errReply, v)
			case i < Buckets:
				c.held = append(c.held, uid)
			case !slices.Contains(c.held, uid):
				c.due = append(c.due, uid)
			}
		}
	}
	var busy []int
	for b := range found {
		if len(found[b].held)+len(found[b].due) > 0 {
			busy = append(busy, b)
		}
	}
	decided := s.runScripts(ctx, len(busy), func(i int) (*redis.Script, []string, []any) {
		b := busy[i]
		c := found[b]
		keys := dueKeys{bucketKeys: s.ks.bucketKeys(b)}
		args := []any{limit, len(c.held), laterOnly, 0}
		for _, uid := range slices.Concat(c.held, c.due) {
			keys.Entries = append(keys.Entries, s.ks.SessionKey(uid), s.ks.RouteKey(uid), s.ks.RouteStampKey(uid))
			args = append(args, uid)
		}
		return dueScript.call(keys, args...)
	}, 0)
	var out []Expired
	for _, cmd := range decided {
		got, _, t, err := parseDue(cmd)
		if err != nil {
			return nil, time.Time{}, err
		}
		out = append(out, got...)
		nowMS = max(nowMS, t.UnixMilli())
	}
	return out, time.UnixMilli(nowMS), nil
}

// lookupScript is dueScript for one uid whose key was reported expired.
// ARGV: uid.
// Returns {now} when the session is live again, held, already settled or
// not due yet, else {now, uid, due, segment, via, held, routes, stage}.
var lookupScript = newScript[lookupKeys]("lookup", nil, nil, "routesof")

// settleScript settles index entries whose timeouts are safely produced,
// but only when the due time is still the one produced: a renewal in
// between wrote a new deadline that must stay. An entry with a next stage
// stays in the index, due then for that stage; the last stage's entry
// goes. Its keys name each entry's session key, in the order of the
// entries. ARGV: uid, due, next due (0: none), next stage (stageFormat)
// quadruples.
var settleScript = newScript[entryKeys]("settle", nil, nil)

// followScript follows stages that the replay of a spool produced, late:
// the next stage of each is due its delay after now, by Redis's clock,
// not after the stage was found due. A stage that went to a spool was
// settled with its next stage waiting (AfterReplay), never due, so that
// no replica produces the next stage while this one is only in some
// replica's spool; this is what makes it due. An entry still at the
// replayed stage is settled here: its settle has not come yet (it then
// finds the entry moved and leaves it), or never will (a crash between
// spooling and settling). A next stage scheduled sooner (the stage was
// produced directly too, by another replica) is moved later; a held one
// is put back at the later time when released. A silence the user ended
// (a renewal dropped its stages) is left alone. Its keys name each
// entry's session key, in the order of the entries. ARGV: AfterReplay ms,
// then uid, stage, deadline ms, due ms, delay ms quintuples. Returns how many it moved.
var followScript = newScript[entryKeys]("follow", nil, []codec{stageFormat})

// holdScript moves timeouts out of the index until their release time,
// when dueScript puts them back for a recheck, unless the user renewed in
// between (renewScript cancels the hold). An entry is moved only if its
// due time is still the one decided on and its session is still gone.
// Its keys name each entry's session key, in the order of the entries.
// ARGV: uid, due, release triples. Returns the uids it held.
var holdScript = newScript[entryKeys]("hold", nil, nil)

// Modes of renewScript.
const (
	modeRenew  = "renew"
	modeResync = "resync"
	modeLapsed = "lapsed"
)

// Expired is a session whose deadline passed without a renewal, and the
// stage of that silence now due.
type Expired struct {
	UID      string
	Segment  string
	Deadline time.Time // when the session's TTL ran out
	Detected time.Time // when Redis reported it gone, by Redis's clock
	// Stage is the stage of the silence due, from 1, and Due when: the
	// deadline for stage 1, then each stage's delay after the one before
	// (the index entry's score).
	Stage int
	Due   time.Time
	// NextDue, set by the listener before Settle, is when the next stage
	// of the silence is due; zero when this stage is the last, AfterReplay
	// when this stage went to a spool.
	NextDue time.Time
	// Via is the gateway instance whose grant the deadline is, or ""
	// when it was renewed without one; while a shorter renewal kept that
	// deadline, followed by a comma and the instance that renewed last
	// (see renewScript). Vias lists them.
	Via string
	// Rechecked means this deadline was held once and released: it was
	// checked against the outage rules already.
	Rechecked bool
	// Routes are the gateway instances that hold the user's connections:
	// a user is present while any of their devices pings, so an outage of
	// any of them may have kept a ping from Redis.
	Routes []string
}

// Vias lists the gateway instances Via names: the one whose grant the
// deadline is, then the one that renewed last, if another.
func (e Expired) Vias() []string {
	if e.Via == "" {
		return nil
	}
	return strings.Split(e.Via, viaFormat.sep)
}

// AfterReplay is the NextDue of a stage that went to a listener's spool
// rather than to Kafka: its next stage waits in the index, never due,
// until the replay that produces this stage follows it (FollowReplayed).
// While a stage is only in some replica's spool (that replica cut off
// from Kafka, or down with the spool on its volume), no replica may
// produce the stage after it: the consumer would get them out of order,
// a close before its reminder. Its score is far past any real time, and
// exact as a Redis score.
var AfterReplay = time.UnixMilli(1 << 52)

// Store reads and writes sessions in Redis.
type Store struct {
	rdb redis.UniversalClient
	ks  Keyspace
	// notes is the note block of its renewals and ends (HoldNotes.args),
	// boxed once; nil records nothing.
	notes []any
}

// NewStore returns a Store over rdb.
func NewStore(rdb redis.UniversalClient, ks Keyspace) *Store {
	return &Store{rdb: rdb, ks: ks}
}

// Keyspace is the store's key layout.
func (s *Store) Keyspace() Keyspace { return s.ks }

// WithHoldNotes returns a Store over the same Redis whose renewals and
// ends (Renew, End, a Renewer's, ApplyActivity, WriteRoutes) append n to
// the timeline of a user whose held timeout they cancel (see HoldNotes).
func (s *Store) WithHoldNotes(n HoldNotes) *Store {
	c := *s
	c.notes = n.args(nil)
	return &c
}

// Renew grants uid's session ttl from now, by Redis's clock, in one round
// trip, and returns the session's deadline: the later of that and the one
// it had, or a park while the segment's clock is held (see renewScript).
func (s *Store) Renew(ctx context.Context, uid, segment string, ttl time.Duration, clock Clock) (time.Time, error) {
	if err := checkSegment(uid, segment); err != nil {
		return time.Time{}, err
	}
	ms, err := renewScript.Run(ctx, s.rdb, s.ks.grantKeys(uid), s.withNotes(
		uid, ttl.Milliseconds(), segment, "", modeRenew, RenewedKeep.Milliseconds(), 0,
		string(clock), MaxTurnHold.Milliseconds())...).Int64Slice()
	if err != nil {
		return time.Time{}, fmt.Errorf("renew session %q: %w", uid, err)
	}
	return time.UnixMilli(ms[0]), nil
}

// End deletes uid's session and its index entry, so no timeout follows.
// The turn state stays (see endScript).
func (s *Store) End(ctx context.Context, uid string) error {
	err := endScript.Run(ctx, s.rdb, s.ks.grantKeys(uid), s.withNotes(uid, RenewedKeep.Milliseconds())...).Err()
	if err != nil {
		return fmt.Errorf("end session %q: %w", uid, err)
	}
	return nil
}

// LastRenewed is when uid last renewed or ended its session, by Redis's
// clock, or zero if not within RenewedKeep.
func (s *Store) LastRenewed(ctx context.Context, uid string) (time.Time, error) {
	ms, err := s.rdb.Get(ctx, s.ks.RenewedKey(uid)).Int64()
	if errors.Is(err, redis.Nil) {
		return time.Time{}, nil
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("last renewal of %q: %w", uid, err)
	}
	return time.UnixMilli(ms), nil
}

// Live reports whether uid has a session that has not run out.
func (s *Store) Live(ctx context.Context, uid string) (bool, error) {
	n, err := s.rdb.Exists(ctx, s.ks.SessionKey(uid)).Result()
	if err != nil {
		return false, fmt.Errorf("check session %q: %w", uid, err)
	}
	return n == 1, nil
}

// Due lists expired sessions still in the deadline index, up to limit per
// bucket, in two pipelined round trips (see sweep). It also returns
// Redis's clock at the sweep. On a Redis Cluster, a bucket whose slot is
// migrating fails it (TRYAGAIN) until its keys are in one place again:
// the next sweep tries again, and the time shows as a gap in the sweeps.
func (s *Store) Due(ctx context.Context, limit int) ([]Expired, time.Time, error) {
	out, now, err := s.sweep(ctx, limit, true)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("sweep deadline index: %w", err)
	}
	return out, now, nil
}

// Lookup checks a session reported expired. It returns ok false when the
// session is live again or its timeout was already settled.
func (s *Store) Lookup(ctx context.Context, uid string) (Expired, bool, error) {
	cmd := lookupScript.Run(ctx, s.rdb, lookupKeys{sessionKeys: s.ks.sessionKeys(uid), Route: s.ks.RouteKey(uid), Stamps: s.ks.RouteStampKey(uid)}, uid)
	got, _, err := parseExpired(cmd)
	if err != nil {
		return Expired{}, false, fmt.Errorf("look up expired session %q: %w", uid, err)
	}
	if len(got) == 0 {
		return Expired{}, false, nil
	}
	return got[0], true, nil
}

// LookupMany is Lookup for each of uids, in one pipeline: an expired
// event per session, in a storm tens of thousands of them a second, is
// not a round trip each. Answers are in the order of uids; ok is false
// for a uid whose timeout is not due, or whose lookup failed (its error).
func (s *Store) LookupMany(ctx context.Context, uids []string) (found []Expired, ok []bool, errs []error) {
	// While a slot migrates, a lookup of a user whose keys are split or
	// partly missing is refused until the slot has moved: sent again, as
	// a check is.
	cmds := s.runScripts(ctx, len(uids), func(i int) (*redis.Script, []string, []any) {
		return lookupScript.call(lookupKeys{sessionKeys: s.ks.sessionKeys(uids[i]), Route: s.ks.RouteKey(uids[i]), Stamps: s.ks.RouteStampKey(uids[i])}, uids[i])
	}, DefaultSlotRetry)
	found, ok, errs = make([]Expired, len(uids)), make([]bool, len(uids)), make([]error, len(uids))
	for i, cmd := range cmds {
		got, _, err := parseExpired(cmd)
		switch {
		case err != nil:
			errs[i] = fmt.Errorf("look up expired session %q: %w", uids[i], err)
		case len(got) > 0:
			found[i], ok[i] = got[0], true
		}
	}
	return found, ok, errs
}

// Settle removes the index entries of timeouts that are safely produced.
// An entry whose deadline changed since (the user came back) stays.
func (s *Store) Settle(ctx context.Context, done []Expired) error {
	cmds := s.perBucket(ctx, settleScript, done, func(e Expired) []any {
		if e.NextDue.IsZero() {
			return []any{e.UID, e.Due.UnixMilli(), 0, ""}
		}
		return []any{e.UID, e.Due.UnixMilli(), e.NextDue.UnixMilli(),
			stageFormat.encode(strconv.Itoa(e.Stage+1), strconv.FormatInt(e.Deadline.UnixMilli(), 10))}
	})
	for _, c := range cmds {
		if err := c.Err(); err != nil {
			return fmt.Errorf("settle %d timeouts: %w", len(done), err)
		}
	}
	return nil
}

// Replayed is a stage of a silence that the replay of a spool produced.
type Replayed struct {
	UID      string
	Stage    int
	Deadline time.Time // the silence's
	Due      time.Time // the stage's
	// Next is the delay of the stage after it, in the policy in force;
	// zero when the policy has none any more, so that the sweep finds the
	// silence at once and ends it there.
	Next time.Duration
}

// FollowReplayed makes the next stage of each replayed stage due its
// delay after now, by Redis's clock (see followScript). It is idempotent
// but for moving a next stage a little later: a replay retried after a
// failure, or after a crash, follows its stages again.
func (s *Store) FollowReplayed(ctx context.Context, rs []Replayed) error {
	if len(rs) == 0 {
		return nil
	}
	cmds := perBucketOf(ctx, s, followScript, rs, func(r Replayed) string { return r.UID }, []any{AfterReplay.UnixMilli()},
		func(r Replayed) []any {
			return []any{r.UID, r.Stage, r.Deadline.UnixMilli(), r.Due.UnixMilli(), r.Next.Milliseconds()}
		})
	for _, c := range cmds {
		if err := c.Err(); err != nil {
			return fmt.Errorf("follow %d replayed stages: %w", len(rs), err)
		}
	}
	return nil
}

// perBucket runs script once per bucket of es, in one pipeline, with the
// bucket's keys and each entry's session key declared, and each entry's
// arguments in turn.
func (s *Store) perBucket(ctx context.Context, script script[entryKeys], es []Expired, args func(Expired) []any) []*redis.Cmd {
	return perBucketOf(ctx, s, script, es, func(e Expired) string { return e.UID }, nil, args)
}

// perBucketOf is perBucket for items of any kind, each of the user uid
// returns, with head before the items' arguments.
func perBucketOf[T any](ctx context.Context, s *Store, script script[entryKeys], items []T, uid func(T) string, head []any, args func(T) []any) []*redis.Cmd {
	byBucket := make(map[int][]T)
	var buckets []int
	for _, it := range items {
		b := Bucket(uid(it))
		if byBucket[b] == nil {
			buckets = append(buckets, b)
		}
		byBucket[b] = append(byBucket[b], it)
	}
	return s.runScripts(ctx, len(buckets), func(i int) (*redis.Script, []string, []any) {
		b := buckets[i]
		keys := entryKeys{bucketKeys: s.ks.bucketKeys(b)}
		argv := slices.Clone(head)
		for _, it := range byBucket[b] {
			keys.Sessions = append(keys.Sessions, s.ks.SessionKey(uid(it)))
			argv = append(argv, args(it)...)
		}
		return script.call(keys, argv...)
	}, 0)
}

var errReply = errors.New("unexpected script reply")

// Hold moves timeouts out of the index until release, when the sweep
// rechecks them. One whose user renewed since, or whose deadline changed,
// is left alone. It returns how many it held.
func (s *Store) Hold(ctx context.Context, found []Expired, release time.Time) (int, error) {
	held, err := s.HoldEach(ctx, found, func(Expired) time.Time { return release })
	return countTrue(held), err
}

// HoldEach is Hold with a release time of each timeout's own. It says of
// each of found whether it was held: one whose user renewed since, whose
// deadline changed, or whose bucket's call failed was not.
func (s *Store) HoldEach(ctx context.Context, found []Expired, release func(Expired) time.Time) ([]bool, error) {
	cmds := s.perBucket(ctx, holdScript, found, func(e Expired) []any {
		return []any{e.UID, e.Due.UnixMilli(), release(e).UnixMilli()}
	})
	// A uid has one index entry at a time: the uids held say which. A
	// uid listed twice is held once, by its first listing (the script
	// takes them in order, and the second finds the entry moved).
	done := map[string]int{}
	var firstErr error
	for _, c := range cmds {
		uids, err := c.StringSlice()
		if err != nil {
			firstErr = cmp.Or(firstErr, err)
			continue
		}
		for _, uid := range uids {
			done[uid]++
		}
	}
	held := make([]bool, len(found))
	for i, e := range found {
		held[i] = done[e.UID] > 0
		done[e.UID]--
	}
	if firstErr != nil {
		return held, fmt.Errorf("hold %d timeouts: %w", len(found), firstErr)
	}
	return held, nil
}

func countTrue(bs []bool) int {
	n := 0
	for _, b := range bs {
		if b {
			n++
		}
	}
	return n
}

// parseStage reads a stage hash value (stageFormat).
func parseStage(v string) (stage int, deadline time.Time, ok bool) {
	f, found := stageFormat.decode(v)
	if !found {
		return 0, time.Time{}, false
	}
	n, err1 := strconv.Atoi(f[0])
	ms, err2 := strconv.ParseInt(f[1], 10, 64)
	if err1 != nil || err2 != nil || n < 2 || ms <= 0 {
		return 0, time.Time{}, false
	}
	return n, time.UnixMilli(ms), true
}

// fields of one entry in a due or lookup reply.
const entryFields = 7

// parseExpired decodes a lookup reply, {now, uid, due, segment, via,
// held, routes, stage, ...} (see parseEntries).
func parseExpired(cmd *redis.Cmd) ([]Expired, time.Time, error) {
	vals, err := cmd.Slice()
	if err != nil {
		return nil, time.Time{}, err
	}
	return parseEntries(vals)
}

// parseDue decodes a dueScript reply: its due entries as parseExpired
// does, and the candidates it reported not due.
func parseDue(cmd *redis.Cmd) ([]Expired, []NotDue, time.Time, error) {
	vals, err := cmd.Slice()
	if err != nil {
		return nil, nil, time.Time{}, err
	}
	if len(vals) < 2 {
		return nil, nil, time.Time{}, fmt.Errorf("%w: %d values", errReply, len(vals))
	}
	report, ok := vals[1].([]any)
	if !ok || len(report)%4 != 0 {
		return nil, nil, time.Time{}, fmt.Errorf("%w: not due %v", errReply, vals[1])
	}
	var notDue []NotDue
	for i := 0; i < len(report); i += 4 {
		uid, _ := report[i].(string)
		if uid == "" {
			return nil, nil, time.Time{}, fmt.Errorf("%w: not due %v", errReply, report[i])
		}
		nd := NotDue{UID: uid}
		nd.Index, nd.InIndex = scoreOf(report[i+1])
		nd.Release, nd.Held = scoreOf(report[i+2])
		staged, _ := report[i+3].(int64)
		nd.Staged = staged == 1
		notDue = append(notDue, nd)
	}
	found, now, err := parseEntries(append([]any{vals[0]}, vals[2:]...))
	return found, notDue, now, err
}

// scoreOf reads a sorted-set score a script returned as a string, in ms;
// "" (none) is not ok.
func scoreOf(v any) (ms int64, ok bool) {
	s, _ := v.(string)
	f, err := strconv.ParseFloat(s, 64)
	if s == "" || err != nil {
		return 0, false
	}
	return int64(f), true
}

// parseEntries decodes {now, uid, due, segment, via, held, routes, stage,
// ...}: due is the entry's score in the index, the silence's deadline for
// stage 1; a later stage's deadline comes from its stage value.
func parseEntries(vals []any) ([]Expired, time.Time, error) {
	if len(vals) == 0 || (len(vals)-1)%entryFields != 0 {
		return nil, time.Time{}, fmt.Errorf("%w: %d values", errReply, len(vals))
	}
	nowMS, ok := vals[0].(int64)
	if !ok {
		return nil, time.Time{}, fmt.Errorf("%w: time %v", errReply, vals[0])
	}
	now := time.UnixMilli(nowMS)
	out := make([]Expired, 0, (len(vals)-1)/entryFields)
	for i := 1; i < len(vals); i += entryFields {
		uid, _ := vals[i].(string)
		score, _ := vals[i+1].(string)
		seg, _ := vals[i+2].(string)
		via, _ := vals[i+3].(string)
		held, _ := vals[i+4].(int64)
		var routes []string
		if rs, ok := vals[i+5].([]any); ok {
			for _, r := range rs {
				if name, ok := r.(string); ok {
					routes = append(routes, name)
				}
			}
		}
		ms, err := strconv.ParseFloat(score, 64)
		if uid == "" || err != nil {
			return nil, time.Time{}, fmt.Errorf("%w: entry %v %v", errReply, vals[i], vals[i+1])
		}
		if seg == "" {
			seg = DefaultSegment
		}
		due := time.UnixMilli(int64(ms))
		e := Expired{UID: uid, Segment: seg, Deadline: due, Detected: now, Stage: 1, Due: due,
			Via: via, Rechecked: held == 1, Routes: routes}
		if st, _ := vals[i+6].(string); st != "" {
			stage, deadline, ok := parseStage(st)
			if !ok {
				return nil, time.Time{}, fmt.Errorf("%w: stage %q of %q", errReply, st, uid)
			}
			e.Stage, e.Deadline = stage, deadline
		}
		out = append(out, e)
	}
	return out, now, nil
}
