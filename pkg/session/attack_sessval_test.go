package session

import (
	"context"
	"fmt"
	"math/rand"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// The grant and activity scripts of the release before the session key's
// value carried the via (testdata/previous_*.lua): the segments and via
// hashes written on every grant, the segment read from the hash. Loaded
// with the prelude, key table, vocabulary and codecs they were loaded
// with then.
var (
	prevRenewScript    = previousScript[grantKeys]("lua/renew.lua")
	prevEndScript      = previousScript[grantKeys]("lua/end.lua")
	prevActivityScript = previousScript[activityKeys]("testdata/previous_activity.lua")
)

func previousScript[K keyList](file string) script[K] {
	var b strings.Builder
	b.WriteString(luaFile("clock"))
	b.WriteString(keyTable(reflect.TypeFor[K]()))
	vocabulary(&b, turnVocab)
	for _, c := range []codec{viaFormat, turnFormat, holdNoteCodec{}} {
		b.WriteString(c.lua())
	}
	b.WriteString(luaFile("holdnote"))
	b.WriteString(mustReadFile("testdata/previous_grant.lua"))
	b.WriteString(mustReadFile(file))
	return script[K]{Script: redis.NewScript(b.String())}
}

// withPrevious runs f with the previous release's grant scripts in place
// of this one's.
func withPrevious(f func()) {
	r, e, a := renewScript, endScript, activityScript
	renewScript, endScript, activityScript = prevRenewScript, prevEndScript, prevActivityScript
	defer func() { renewScript, endScript, activityScript = r, e, a }()
	f()
}

// userState is what the listener and the hold rules read of one user,
// and the session key.
type userState struct {
	live             bool
	sessSeg, sessVia string
	seg, via         string
	hasSeg, hasVia   bool
	indexed          bool
	score            int64
	stage, held      string
	hold             bool
	whose            string
	renewed          bool
}

func readUser(t *testing.T, s *Store, uid string, current bool) userState {
	t.Helper()
	ctx := context.Background()
	b := Bucket(uid)
	var u userState
	v, err := s.rdb.Get(ctx, s.ks.SessionKey(uid)).Result()
	switch {
	case err == nil:
		u.live = true
		if current {
			f, ok := sessionFormat.decode(v)
			if !ok {
				t.Fatalf("session value %q not of the format", v)
			}
			u.sessSeg, u.sessVia = f[0], f[1]
		} else {
			u.sessSeg = v
		}
	case err != redis.Nil:
		t.Fatal(err)
	}
	hget := func(key string) (string, bool) {
		v, err := s.rdb.HGet(ctx, key, uid).Result()
		if err == redis.Nil {
			return "", false
		}
		if err != nil {
			t.Fatal(err)
		}
		return v, true
	}
	u.seg, u.hasSeg = hget(s.ks.SegmentsKey(b))
	u.via, u.hasVia = hget(s.ks.ViaKey(b))
	u.stage, _ = hget(s.ks.StageKey(b))
	u.held, _ = hget(s.ks.HeldKey(b))
	if sc, err := s.rdb.ZScore(ctx, s.ks.IndexKey(b), uid).Result(); err == nil {
		u.indexed, u.score = true, int64(sc)
	}
	if _, err := s.rdb.ZScore(ctx, s.ks.HoldKey(b), uid).Result(); err == nil {
		u.hold = true
	}
	if tv, err := s.rdb.Get(ctx, s.ks.TurnKey(uid)).Result(); err == nil {
		u.whose, _, _ = strings.Cut(tv, ":")
	}
	u.renewed = s.rdb.Exists(ctx, s.ks.RenewedKey(uid)).Val() == 1
	return u
}

// TestAttackSessionValueMatchesPrevious runs random sequences of
// renewals (every mode, instances, segments, TTLs, clocks), activity
// batches (every kind, several events of one user and of two users of
// one bucket in one call, of no segment and of one), ends, route ends,
// session keys gone at their deadline, holds and settles (last stage
// and next stage) on two keyspaces of one Redis: one with this
// release's scripts, one with the previous release's. After every step
// each user's segments and via entries, session key, index entry, stage,
// hold and turn state must be the same on both (deadlines to a slack for
// the ms the two calls are apart), and on this release's side the
// session key's value must say what the hashes hold. A third keyspace
// runs each step with either release's scripts, at random, as a rolling
// upgrade (or a rollback) does, and must match the previous release's
// too.
func TestAttackSessionValueMatchesPrevious(t *testing.T) {
	srv, ctx := newStore(t)
	rdb := srv.rdb
	ksN, err := NewKeyspace(srv.ks.Prefix() + "n")
	if err != nil {
		t.Fatal(err)
	}
	ksO, err := NewKeyspace(srv.ks.Prefix() + "o")
	if err != nil {
		t.Fatal(err)
	}
	ksM, err := NewKeyspace(srv.ks.Prefix() + "m")
	if err != nil {
		t.Fatal(err)
	}
	cur, prev, mixed := NewStore(rdb, ksN), NewStore(rdb, ksO), NewStore(rdb, ksM)
	rules := SegmentRules{
		Segments: map[string]SegmentRule{"vip": {TTL: 180 * time.Second, Clock: ClockPresence}, "slow": {TTL: 60 * time.Second, Clock: ClockTurn}},
		Unlisted: SegmentRule{TTL: 20 * time.Second, Clock: ClockPresence},
	}
	insts := []string{"gw-a", "gw-b", "", "gw/c", "gw-a,gw-b"}
	segs := []string{"default", "vip", "slow"}
	ttls := []time.Duration{20 * time.Second, 60 * time.Second, 180 * time.Second}
	clocks := []Clock{ClockPresence, ClockTurn}

	seeds := 12
	if testing.Short() {
		seeds = 4
	}
	for seed := 1; seed <= seeds; seed++ {
		rng := rand.New(rand.NewSource(int64(seed)))
		// Three users, two of them of one bucket.
		a := fmt.Sprintf("s%d-a", seed)
		var bb string
		for i := 0; ; i++ {
			bb = fmt.Sprintf("s%d-b%d", seed, i)
			if Bucket(bb) == Bucket(a) {
				break
			}
		}
		users := []string{a, bb, fmt.Sprintf("s%d-c", seed)}
		var trace []string
		both := func(name string, f func(s *Store)) {
			old := rng.Intn(2) == 0
			trace = append(trace, fmt.Sprintf("%s (mixed: previous %v)", name, old))
			f(cur)
			withPrevious(func() { f(prev) })
			if old {
				withPrevious(func() { f(mixed) })
			} else {
				f(mixed)
			}
		}
		for step := 0; step < 120; step++ {
			uid := users[rng.Intn(len(users))]
			switch op := rng.Intn(100); {
			case op < 30:
				seg, inst, ttl, clock := segs[rng.Intn(len(segs))], insts[rng.Intn(len(insts))], ttls[rng.Intn(len(ttls))], clocks[rng.Intn(len(clocks))]
				mode, ago := modeRenew, time.Duration(0)
				switch rng.Intn(6) {
				case 0:
					mode, ago = modeResync, time.Duration(rng.Intn(2))*30*time.Second
				case 1:
					mode, ago = modeLapsed, 30*time.Second
					ttl = -time.Duration(rng.Intn(3)) * time.Second
				}
				both(fmt.Sprintf("renew %s seg=%s inst=%q ttl=%v clock=%s mode=%s ago=%v", uid, seg, inst, ttl, clock, mode, ago), func(s *Store) {
					if err := renewScript.Run(ctx, s.rdb, s.ks.grantKeys(uid), s.withNotes(uid, ttl.Milliseconds(), seg, inst, mode,
						RenewedKeep.Milliseconds(), ago.Milliseconds(), string(clock), MaxTurnHold.Milliseconds())...).Err(); err != nil {
						t.Fatal(err)
					}
				})
			case op < 60:
				n := 1 + rng.Intn(3)
				var evs []Activity
				for i := 0; i < n; i++ {
					u := uid
					if rng.Intn(3) == 0 {
						u = users[rng.Intn(2)] // of one bucket
					}
					e := Activity{UID: u, Clock: clocks[rng.Intn(len(clocks))]}
					switch k := rng.Intn(10); {
					case k < 5:
						e.Kind = ActivityActive
					case k < 7:
						e.Kind = ActivityTurnUser
					case k < 9:
						e.Kind = ActivityTurnUs
						e.MaxHold = []time.Duration{0, 30 * time.Second, 90 * time.Second}[rng.Intn(3)]
					default:
						e.Kind = ActivityEnd
					}
					if rng.Intn(2) == 0 {
						e.Segment = segs[rng.Intn(len(segs))]
					}
					if rng.Intn(3) > 0 {
						e.TTL = ttls[rng.Intn(len(ttls))]
					} else {
						e.Clock = ""
					}
					if rng.Intn(12) == 0 {
						e.At = time.Now().Add(-time.Hour)
					}
					evs = append(evs, e)
				}
				inst := insts[rng.Intn(len(insts))]
				both(fmt.Sprintf("activity inst=%q %+v", inst, evs), func(s *Store) {
					if _, err := s.ApplyActivity(ctx, inst, rules, evs); err != nil {
						t.Fatal(err)
					}
				})
			case op < 66:
				both("end "+uid, func(s *Store) {
					if err := s.End(ctx, uid); err != nil {
						t.Fatal(err)
					}
				})
			case op < 70:
				both("route end "+uid, func(s *Store) {
					if r := s.WriteRoutes(ctx, "gw-a", []RouteCount{{UID: uid, Count: 0, End: true}}, time.Minute, nil); r[0].Err != nil {
						t.Fatal(r[0].Err)
					}
				})
			case op < 82:
				both("session key gone "+uid, func(s *Store) {
					if err := s.rdb.Del(ctx, s.ks.SessionKey(uid)).Err(); err != nil {
						t.Fatal(err)
					}
				})
			case op < 87:
				both("hold "+uid, func(s *Store) {
					u := readUser(t, s, uid, s != prev)
					if !u.indexed {
						return
					}
					due := time.UnixMilli(u.score)
					if _, err := s.Hold(ctx, []Expired{{UID: uid, Due: due, Deadline: due}}, due.Add(10*time.Minute)); err != nil {
						t.Fatal(err)
					}
				})
			default:
				next := rng.Intn(2) == 0
				both(fmt.Sprintf("settle %s next=%v", uid, next), func(s *Store) {
					u := readUser(t, s, uid, s != prev)
					if !u.indexed {
						return
					}
					e := Expired{UID: uid, Due: time.UnixMilli(u.score), Deadline: time.UnixMilli(u.score), Stage: 1}
					if next {
						e.NextDue = e.Due.Add(30 * time.Second)
					}
					if err := s.Settle(ctx, []Expired{e}); err != nil {
						t.Fatal(err)
					}
				})
			}
			// A lapsed grant's session key lives 1 ms, by Redis's clock: real
			// time must pass for it to be gone on both sides. A sleep is at
			// least this long however busy the host, so it cannot be short;
			// a slow host only makes it longer, which changes nothing.
			time.Sleep(2 * time.Millisecond)
			for _, u := range users {
				o := readUser(t, prev, u, false)
				for _, side := range []struct {
					name string
					s    *Store
				}{{"this release", cur}, {"a mix of both", mixed}} {
					n := readUser(t, side.s, u, true)
					if n.live && (n.sessSeg != n.seg || !n.hasSeg || (n.sessVia != "" && (n.sessVia != n.via || !n.hasVia))) {
						t.Fatalf("seed %d step %d: %s: %s: session of %s says %q/%q, the hashes %q/%q\ntrace:\n%s",
							seed, step, side.name, trace[len(trace)-1], u, n.sessSeg, n.sessVia, n.seg, n.via, strings.Join(trace, "\n"))
					}
					d := n.score - o.score
					if n.live != o.live || n.sessSeg != o.sessSeg || n.seg != o.seg || n.hasSeg != o.hasSeg || n.via != o.via || n.hasVia != o.hasVia ||
						n.indexed != o.indexed || d < -500 || d > 500 || (n.stage == "") != (o.stage == "") || (n.held == "") != (o.held == "") ||
						n.hold != o.hold || n.whose != o.whose || n.renewed != o.renewed {
						t.Fatalf("seed %d step %d: %s: %s differs\n %s: %+v\n previous: %+v\ntrace:\n%s",
							seed, step, trace[len(trace)-1], u, side.name, n, o, strings.Join(trace, "\n"))
					}
				}
			}
		}
	}
}
