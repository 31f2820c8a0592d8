package session

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stillthere/stillthere/pkg/redisserver"
	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
)

func TestParseBlindInterval(t *testing.T) {
	good := []BlindInterval{
		{Start: time.UnixMilli(10), End: time.UnixMilli(20), Reason: BlindSweepGap},
		{Start: time.UnixMilli(10), End: time.UnixMilli(10), Reason: BlindGateway, Scope: "gw:1:x"},
	}
	for _, b := range good {
		got, err := ParseBlindInterval(b.member())
		if err != nil || !got.Start.Equal(b.Start) || !got.End.Equal(b.End) || got.Scope != b.Scope || got.Reason != b.Reason {
			t.Errorf("ParseBlindInterval(%q) = %+v, %v; want %+v", b.member(), got, err, b)
		}
	}
	for _, m := range []string{"", "1:2", "1:2:", "a:2:x:", "1:b:x:", "5:1:x:", "-1:2:x:", "1:2::gw"} {
		if _, err := ParseBlindInterval(m); err == nil {
			t.Errorf("ParseBlindInterval(%q): want an error", m)
		}
	}
}

func FuzzParseBlindInterval(f *testing.F) {
	f.Add("10:20:sweep-gap:")
	f.Add("10:20:gateway-gap:gw:1")
	f.Add("1:2")
	f.Fuzz(func(t *testing.T, m string) {
		b, err := ParseBlindInterval(m)
		if err != nil {
			return
		}
		if b.End.Before(b.Start) || b.Reason == "" {
			t.Fatalf("ParseBlindInterval(%q) = %+v: end before start or no reason", m, b)
		}
		again, err := ParseBlindInterval(b.member())
		if err != nil || again != b {
			t.Fatalf("round trip of %q: %+v, %v; want %+v", m, again, err, b)
		}
	})
}

// renewVia renews uid through a Renewer of gateway instance inst.
func renewVia(t *testing.T, s *Store, inst, uid string, ttl time.Duration) time.Time {
	t.Helper()
	r := NewRenewer(s, RenewerConfig{Instance: inst})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx) }()
	defer func() { cancel(); <-done }()
	d, err := r.Renew(context.Background(), uid, "default", ttl, ClockPresence)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestHoldReleaseAndRenew(t *testing.T) {
	s, ctx := newStore(t)
	var last time.Time
	for _, uid := range []string{"held", "back", "moved"} {
		last = renewVia(t, s, "gw-1", uid, 50*time.Millisecond)
	}
	redisPast(t, s.rdb, last)
	due, now, err := s.Due(ctx, 100)
	if err != nil || len(due) != 3 {
		t.Fatalf("Due = %+v, %v; want 3", due, err)
	}
	for _, e := range due {
		if e.Via != "gw-1" || e.Rechecked {
			t.Fatalf("entry %+v: want via gw-1, not rechecked", e)
		}
	}
	// A deadline that changed since it was found is not held.
	stale := due[2]
	stale.Due = stale.Due.Add(-time.Millisecond)
	release := now.Add(300 * time.Millisecond)
	n, err := s.Hold(ctx, []Expired{due[0], due[1], stale}, release)
	if err != nil || n != 2 {
		t.Fatalf("Hold = %d, %v; want 2", n, err)
	}
	heldUID, backUID := due[0].UID, due[1].UID
	if got, _, _ := s.Due(ctx, 100); len(got) != 1 || got[0].UID != due[2].UID {
		t.Fatalf("Due while held = %+v, want only %s", got, due[2].UID)
	}
	// The user who comes back cancels their hold.
	renewVia(t, s, "gw-2", backUID, time.Minute)
	// Past the release time of both holds: a hold the renewal did not
	// cancel would bring its user back now too.
	redisPast(t, s.rdb, release)
	got, _, err := s.Due(ctx, 100)
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]Expired{}
	for _, e := range got {
		found[e.UID] = e
	}
	if e, ok := found[heldUID]; !ok || !e.Rechecked || !e.Deadline.Equal(due[0].Deadline) {
		t.Fatalf("after release: %+v; want %s back with its deadline, rechecked", got, heldUID)
	}
	if _, ok := found[backUID]; ok {
		t.Fatalf("%s came back, yet is due again", backUID)
	}
	if err := s.Settle(ctx, []Expired{found[heldUID]}); err != nil {
		t.Fatal(err)
	}
	if n, _ := s.rdb.HLen(ctx, s.ks.HeldKey(Bucket(heldUID))).Result(); n != 0 {
		t.Errorf("held marks after settling: %d", n)
	}
}

func TestResyncNeverExtends(t *testing.T) {
	s, ctx := newStore(t)
	r := runRenewer(t, s)

	// "later" has a deadline from another device further out than the
	// grant being restored; "lost" lost its session with Redis's data. (A
	// grant with nothing left is a lapsed one: see TestResyncLapsed.)
	later, err := r.Renew(ctx, "later", "default", time.Minute, ClockPresence)
	if err != nil {
		t.Fatal(err)
	}
	n, err := r.Resync(ctx, []Grant{
		{UID: "later", Segment: "default", Left: 10 * time.Second},
		{UID: "lost", Segment: "vip", Left: 20 * time.Second},
	})
	if err != nil || n != 2 {
		t.Fatalf("Resync = %d, %v; want 2 sent", n, err)
	}
	score := func(uid string) time.Time {
		v, err := s.rdb.ZScore(ctx, s.ks.IndexKey(Bucket(uid)), uid).Result()
		if err != nil {
			return time.Time{}
		}
		return time.UnixMilli(int64(v))
	}
	if got := score("later"); !got.Equal(later) {
		t.Errorf("later: deadline %v, want the later one kept, %v", got, later)
	}
	rnow, _ := s.rdb.Time(ctx).Result()
	if got := score("lost"); got.Sub(rnow) > 20*time.Second || got.Sub(rnow) < 19*time.Second {
		t.Errorf("lost: deadline %v from now, want just under 20s", got.Sub(rnow))
	}
	if pttl, _ := s.rdb.PTTL(ctx, s.ks.SessionKey("lost")).Result(); pttl > 20*time.Second || pttl < 19*time.Second {
		t.Errorf("lost: PTTL %v, want just under 20s", pttl)
	}
	if via, _ := s.rdb.HGet(ctx, s.ks.ViaKey(Bucket("lost")), "lost").Result(); via != "gw-1" {
		t.Errorf("lost: via %q, want gw-1", via)
	}
}

func TestMarkFindsGaps(t *testing.T) {
	s, ctx := newStore(t)
	mark := func(m SweepMark) Control {
		t.Helper()
		m.Keep, m.GapMax = time.Hour, 200*time.Millisecond
		c, err := s.Mark(ctx, m)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	first := mark(SweepMark{Listener: "l1"})
	if first.Gap != nil {
		t.Fatalf("first mark ever found a gap: %+v", first.Gap)
	}
	if l, ok := first.Listeners["l1"]; !ok || l.Failing {
		t.Fatalf("listeners = %v, want l1", first.Listeners)
	}
	second := mark(SweepMark{LastSeen: first.Now})
	if second.Gap != nil {
		t.Fatalf("quick second mark found a gap: %+v", second.Gap)
	}
	redisPast(t, s.rdb, second.Now.Add(200*time.Millisecond)) // GapMax
	third := mark(SweepMark{LastSeen: second.Now})
	if third.Gap == nil || third.Gap.Reason != BlindSweepGap || !third.Gap.Start.Equal(second.Now) {
		t.Fatalf("mark past GapMax: gap %+v, want a sweep gap from %v", third.Gap, second.Now)
	}
	if len(third.Blind) != 1 || third.Blind[0] != *third.Gap {
		t.Fatalf("blind intervals = %+v, want the gap", third.Blind)
	}
	// Redis lost its data: the sweep mark is gone.
	if err := s.rdb.Del(ctx, s.ks.SweptKey()).Err(); err != nil {
		t.Fatal(err)
	}
	fourth := mark(SweepMark{LastSeen: third.Now})
	if fourth.Gap == nil || fourth.Gap.Reason != BlindDataLost {
		t.Fatalf("mark after data loss: gap %+v, want data-lost", fourth.Gap)
	}
}

func TestHeartbeatGaps(t *testing.T) {
	s, ctx := newStore(t)
	blind := func() []string {
		m, err := s.rdb.ZRange(ctx, s.ks.BlindKey(), 0, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	// Leases long where the test needs them not to run out, so that a
	// busy machine's pauses do not: the first, until the second beat; the
	// one after the gap, until the mark at the end.
	if b, err := s.Heartbeat(ctx, "gw-1", time.Minute); err != nil || !b.First || b.Gap {
		t.Fatalf("gw-1's first heartbeat = %+v, %v; want a first, no gap", b, err)
	}
	beat, err := s.Heartbeat(ctx, "gw-1", 100*time.Millisecond)
	if err != nil || beat.First || beat.Gap {
		t.Fatalf("gw-1's second heartbeat within its lease = %+v, %v; want no gap", beat, err)
	}
	if b := blind(); len(b) != 0 {
		t.Fatalf("blind intervals after steady heartbeats: %v", b)
	}
	redisPast(t, s.rdb, beat.Now.Add(100*time.Millisecond)) // its lease ran out
	// gw-1 missed its lease; gw-2 starts while no instance is alive.
	if _, err := s.Heartbeat(ctx, "gw-2", 100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if b, err := s.Heartbeat(ctx, "gw-1", time.Minute); err != nil || !b.Gap || b.First {
		t.Fatalf("gw-1's heartbeat after its lease ran out = %+v, %v; want a gap", b, err)
	}
	var reasons []string
	for _, m := range blind() {
		b, err := ParseBlindInterval(m)
		if err != nil {
			t.Fatal(err)
		}
		reasons = append(reasons, b.Reason+"/"+b.Scope)
	}
	if len(reasons) != 2 || !contains(reasons, BlindFleetDown+"/") || !contains(reasons, BlindGateway+"/gw-1") {
		t.Fatalf("blind intervals = %v, want a fleet-down and gw-1's gap", reasons)
	}
	if err := s.Leave(ctx, "gw-2"); err != nil {
		t.Fatal(err)
	}
	c, err := s.Mark(ctx, SweepMark{GapMax: time.Hour, Keep: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if c.Instances["gw-2"].AliveAt(c.Now) || !c.Instances["gw-1"].AliveAt(c.Now) {
		t.Fatalf("instances %+v at %v: want gw-1 alive, gw-2 gone", c.Instances, c.Now)
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// TestLapsesCountAcrossReplicas: each replica counts its lapses into the
// second of its mark, and sums from the window before it up to the
// second the count runs in: whichever of two replicas marked first, or
// counted first, the later count sees both shares.
func TestLapsesCountAcrossReplicas(t *testing.T) {
	s, ctx := newStore(t)
	cur, _ := s.rdb.Time(ctx).Result()
	// Long out of any window this test's calls can sum.
	if err := s.rdb.Set(ctx, s.ks.LapsesKey(cur.Unix()-30), 1000, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	early := cur.Add(-time.Second) // replica A's mark, the second before
	if n, err := s.Lapses(ctx, cur, 10*time.Second, 20, tok()); err != nil || n != 20 {
		t.Fatalf("B's Lapses = %d, %v; want 20", n, err)
	}
	if n, err := s.Lapses(ctx, early, 10*time.Second, 30, tok()); err != nil || n != 50 {
		t.Fatalf("A's Lapses, counted after B's = %d, %v; want 50, B's share too", n, err)
	}
	if n, err := s.Lapses(ctx, cur, 10*time.Second, 0, tok()); err != nil || n != 50 {
		t.Fatalf("B's Lapses again = %d, %v; want 50, A's share too", n, err)
	}
	if v, _ := s.rdb.Get(ctx, s.ks.LapsesKey(early.Unix())).Int(); v != 30 {
		t.Fatalf("A's second counts %d, want its 30: a share is counted in its mark's second", v)
	}
	// A count long after its mark (a stalled batch) sees the shares
	// counted since, up to now.
	late := cur.Add(-90 * time.Second)
	if n, err := s.Lapses(ctx, late, 10*time.Second, 5, tok()); err != nil || n != 1055 {
		t.Fatalf("a count 90s after its mark = %d, %v; want 1055, everything since the window before its mark", n, err)
	}
	// A mark ahead of Redis's clock (read on a node since failed over
	// from) sums its own window.
	if n, err := s.Lapses(ctx, cur.Add(time.Hour), 10*time.Second, 7, tok()); err != nil || n != 7 {
		t.Fatalf("Lapses of a mark an hour ahead = %d, %v; want 7", n, err)
	}
}

// tokens names each count of the tests uniquely (tok).
var tokens atomic.Int64

func tok() string { return fmt.Sprintf("test-%d", tokens.Add(1)) }

// TestLapsesCountedOnce: a count run again under its token (a client's
// retry of a late reply, a caller's second try of a count that failed but
// ran) adds its lapses once, and still sums the window.
func TestLapsesCountedOnce(t *testing.T) {
	s, ctx := newStore(t)
	cur, _ := s.rdb.Time(ctx).Result()
	for try := range 3 {
		if n, err := s.Lapses(ctx, cur, 10*time.Second, 30, "batch-1"); err != nil || n != 30 {
			t.Fatalf("try %d: Lapses = %d, %v; want 30, counted once", try, n, err)
		}
	}
	if n, err := s.Lapses(ctx, cur, 10*time.Second, 5, "batch-2"); err != nil || n != 35 {
		t.Fatalf("another count = %d, %v; want 35", n, err)
	}
	// A count that fails on the way (its counter is no counter) adds
	// nothing, and adds its lapses when tried again under its token.
	later := cur.Add(3 * time.Second)
	if err := s.rdb.HSet(ctx, s.ks.LapsesKey(later.Unix()), "not", "a counter").Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Lapses(ctx, later, 10*time.Second, 7, "batch-3"); err == nil {
		t.Fatal("a count into a broken counter did not fail")
	}
	s.rdb.Del(ctx, s.ks.LapsesKey(later.Unix()))
	if n, err := s.Lapses(ctx, later, 10*time.Second, 7, "batch-3"); err != nil || n != 42 {
		t.Fatalf("the failed count tried again = %d, %v; want 42: its 7 added now", n, err)
	}
}

// TestLapsesWindow: a count sums the window before its mark's second: a
// second older than that is left out.
func TestLapsesWindow(t *testing.T) {
	s, ctx := newStore(t)
	cur, err := s.rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	mark := cur.Add(-3 * time.Second)
	sec := mark.Unix()
	for k, v := range map[int64]int{sec - 10: 7, sec - 9: 5, sec: 3, sec + 2: 11} {
		if err := s.rdb.Set(ctx, s.ks.LapsesKey(k), v, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := s.Lapses(ctx, mark, 10*time.Second, 0, tok()); err != nil || n != 19 {
		t.Fatalf("Lapses = %d, %v; want 19: the window's 5 and 3, the 11 counted since, not the 7 of the second before the window", n, err)
	}
}

// TestMarkFindsRestart: a Redis restarted from its AOF, quicker than the
// sweep gap, is still a blind interval: the pings sent while it was down
// were lost.
func TestMarkFindsRestart(t *testing.T) {
	srv, err := redisserver.Start(context.Background(), redisserver.Options{AOF: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	rdb := redistest.Client(t, srv)
	ks, _ := NewKeyspace(redistest.Prefix(t))
	s, ctx := NewStore(rdb, ks), context.Background()
	m := SweepMark{GapMax: time.Hour, Keep: time.Hour}
	first, err := s.Mark(ctx, m)
	if err != nil || first.Gap != nil {
		t.Fatalf("first mark: %+v, %v", first.Gap, err)
	}
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	m.LastSeen = first.Now
	var c Control
	eventually(t, 5*time.Second, "a mark once the client reconnects", func() bool {
		c, err = s.Mark(ctx, m)
		return err == nil
	})
	if c.Gap == nil || c.Gap.Reason != BlindRestart || !c.Gap.Start.Equal(first.Now) {
		t.Fatalf("mark after a restart: gap %+v, want a redis-restart from %v", c.Gap, first.Now)
	}
	again, err := s.Mark(ctx, m)
	if err != nil || again.Gap != nil {
		t.Fatalf("second mark after the restart: %+v, %v; want no gap", again.Gap, err)
	}
}

// TestLastRenewed: a renewal, a resync and an end each record when the user
// was last there; a resync records its ping's time, never moving it back.
func TestLastRenewed(t *testing.T) {
	s, ctx := newStore(t)
	if at, err := s.LastRenewed(ctx, "u"); err != nil || !at.IsZero() {
		t.Fatalf("LastRenewed before any renewal = %v, %v", at, err)
	}
	deadline, err := s.Renew(ctx, "u", "default", time.Second, ClockPresence)
	if err != nil {
		t.Fatal(err)
	}
	at, err := s.LastRenewed(ctx, "u")
	if err != nil || !at.Equal(deadline.Add(-time.Second)) {
		t.Fatalf("LastRenewed = %v, %v; want the renewal, %v", at, err, deadline.Add(-time.Second))
	}
	if ttl := s.rdb.PTTL(ctx, s.ks.RenewedKey("u")).Val(); ttl < RenewedKeep || ttl > RenewedKeep+time.Second {
		t.Errorf("renewal kept %v, want the session's TTL and RenewedKeep", ttl)
	}
	r := NewRenewer(s, RenewerConfig{})
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); r.Run(rctx) }()
	defer func() { cancel(); <-done }()
	// A resync of a ping older than the last renewal records nothing new.
	if _, err := r.Resync(ctx, []Grant{{UID: "u", Segment: "default", Left: 5 * time.Second, Ago: time.Minute}}); err != nil {
		t.Fatal(err)
	}
	if again, _ := s.LastRenewed(ctx, "u"); !again.Equal(at) {
		t.Errorf("after resyncing an older ping: %v, want %v", again, at)
	}
	redisPast(t, s.rdb, at) // the end comes later, by Redis's clock
	if err := s.End(ctx, "u"); err != nil {
		t.Fatal(err)
	}
	if ended, _ := s.LastRenewed(ctx, "u"); !ended.After(at) {
		t.Errorf("after the end: %v, want later than %v", ended, at)
	}
}

// TestClusterFailoverRule runs the sweep mark's failover rule (the Lua of
// lua/roles.lua) on CLUSTER NODES replies: a reshard's steps are not a
// failover, though each may bump the epoch; a promoted replica, or a
// master that served slots and failed, became a replica or left, is.
func TestClusterFailoverRule(t *testing.T) {
	s, ctx := newStore(t)
	encode := redis.NewScript(rolesFormat.lua() + luaFile("roles") + testdataLua(t, "roles_encode"))
	decide := redis.NewScript(rolesFormat.lua() + luaFile("roles") + testdataLua(t, "roles_decide"))
	// Three masters, a1 b2 c3, and a1's replica d4.
	const steady = `a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460
b2 127.0.0.1:7001@17001 master - 0 1 2 connected 5461-10922
c3 127.0.0.1:7002@17002 master - 0 1 3 connected 10923-16383
d4 127.0.0.1:7003@17003 slave a1 0 1 1 connected
`
	tests := []struct {
		name string
		prev string // CLUSTER NODES at the last mark; or, with stored, the value stored
		cur  string
		// stored is prev as a version before this one stored it, raw.
		stored   bool
		failover bool
	}{
		{"steady", steady, steady, false, false},
		{"slot moved to another master (new epoch)", steady, `a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 1-5460
b2 127.0.0.1:7001@17001 master - 0 1 4 connected 0 5461-10922
c3 127.0.0.1:7002@17002 master - 0 1 3 connected 10923-16383
d4 127.0.0.1:7003@17003 slave a1 0 1 1 connected
`, false, false},
		{"slot migrating", steady, `a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460 [0->-b2]
b2 127.0.0.1:7001@17001 master - 0 1 2 connected 5461-10922
c3 127.0.0.1:7002@17002 master - 0 1 3 connected 10923-16383
d4 127.0.0.1:7003@17003 slave a1 0 1 1 connected
`, false, false},
		{"master added", steady, steady + "e5 127.0.0.1:7004@17004 master - 0 1 0 connected\n", false, false},
		{"slot to the added master", steady + "e5 127.0.0.1:7004@17004 master - 0 1 0 connected\n",
			`a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 1-5460
b2 127.0.0.1:7001@17001 master - 0 1 2 connected 5461-10922
c3 127.0.0.1:7002@17002 master - 0 1 3 connected 10923-16383
d4 127.0.0.1:7003@17003 slave a1 0 1 1 connected
e5 127.0.0.1:7004@17004 master - 0 1 5 connected 0
`, false, false},
		{"master drained", steady, `a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected
b2 127.0.0.1:7001@17001 master - 0 1 4 connected 0-10922
c3 127.0.0.1:7002@17002 master - 0 1 3 connected 10923-16383
d4 127.0.0.1:7003@17003 slave b2 0 1 4 connected
`, false, false},
		{"drained master removed", `a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-16383
e5 127.0.0.1:7004@17004 master - 0 1 0 connected
`, `a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-16383
`, false, false},
		{"replica added, node in handshake", steady, steady +
			"f6 127.0.0.1:7005@17005 slave b2 0 1 2 connected\n" +
			"0f 127.0.0.1:7006@17006 handshake - 0 0 0 connected\n", false, false},
		{"replica failed", steady, `a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460
b2 127.0.0.1:7001@17001 master - 0 1 2 connected 5461-10922
c3 127.0.0.1:7002@17002 master - 0 1 3 connected 10923-16383
d4 127.0.0.1:7003@17003 slave,fail a1 0 1 1 disconnected
`, false, false},
		{"master suspected, not failed", steady, `a1 127.0.0.1:7000@17000 master,fail? - 0 0 1 disconnected 0-5460
b2 127.0.0.1:7001@17001 myself,master - 0 1 2 connected 5461-10922
c3 127.0.0.1:7002@17002 master - 0 1 3 connected 10923-16383
d4 127.0.0.1:7003@17003 slave a1 0 1 1 connected
`, false, false},
		{"master failed", steady, `a1 127.0.0.1:7000@17000 master,fail - 0 0 1 disconnected 0-5460
b2 127.0.0.1:7001@17001 myself,master - 0 1 2 connected 5461-10922
c3 127.0.0.1:7002@17002 master - 0 1 3 connected 10923-16383
d4 127.0.0.1:7003@17003 slave a1 0 1 1 connected
`, false, true},
		{"replica promoted in a takeover", steady, `a1 127.0.0.1:7000@17000 master,fail - 0 0 1 disconnected
b2 127.0.0.1:7001@17001 myself,master - 0 1 2 connected 5461-10922
c3 127.0.0.1:7002@17002 master - 0 1 3 connected 10923-16383
d4 127.0.0.1:7003@17003 master - 0 1 4 connected 0-5460
`, false, true},
		{"graceful failover", steady, `a1 127.0.0.1:7000@17000 myself,slave d4 0 0 4 connected
b2 127.0.0.1:7001@17001 master - 0 1 2 connected 5461-10922
c3 127.0.0.1:7002@17002 master - 0 1 3 connected 10923-16383
d4 127.0.0.1:7003@17003 master - 0 1 4 connected 0-5460
`, false, true},
		{"serving master gone", steady, `b2 127.0.0.1:7001@17001 myself,master - 0 1 2 connected 5461-10922
c3 127.0.0.1:7002@17002 master - 0 1 3 connected 10923-16383
d4 127.0.0.1:7003@17003 slave a1 0 1 1 connected
`, false, true},
		{"stored by a version that kept the epoch", "4", steady, true, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			prev := tc.prev
			if !tc.stored {
				var err error
				if prev, err = encode.Run(ctx, s.rdb, nil, tc.prev).Text(); err != nil {
					t.Fatal(err)
				}
			}
			got, err := decide.Run(ctx, s.rdb, nil, prev, tc.cur).Int()
			if err != nil {
				t.Fatal(err)
			}
			if (got == 1) != tc.failover {
				t.Errorf("failover = %v, want %v (roles before %q)", got == 1, tc.failover, prev)
			}
		})
	}
}

// TestMarkTellsFailoverFromReshard: on a real cluster with replicas, a
// slot handed to another master (which bumps the epoch) is no blind
// interval; a graceful CLUSTER FAILOVER of a master that does not hold
// the control keys, a replica promoted and its master demoted, is one,
// recorded once.
func TestMarkTellsFailoverFromReshard(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster with replicas")
	}
	t.Parallel()
	c := redistest.StartCluster(t)
	ctx := context.Background()
	if err := c.AddReplicas(ctx); err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	t.Cleanup(func() { rdb.Close() })
	ks, _ := NewKeyspace(redistest.Prefix(t))
	s := NewStore(rdb, ks)
	var last time.Time
	mark := func() *BlindInterval {
		t.Helper()
		m, err := s.Mark(ctx, SweepMark{GapMax: time.Hour, Keep: time.Hour, LastSeen: last})
		if err != nil {
			t.Fatal(err)
		}
		last = m.Now
		return m.Gap
	}
	if gap := mark(); gap != nil {
		t.Fatalf("first mark: %+v", gap)
	}

	ctlSlot, err := c.SlotOf(ctx, ks.AliveKey())
	if err != nil {
		t.Fatal(err)
	}
	ctl, err := c.SlotOwner(ctx, ctlSlot)
	if err != nil {
		t.Fatal(err)
	}
	// Hand a slot of another master to a third, neither the control
	// keys' master.
	other := (ctl + 1) % len(c.Masters)
	third := (ctl + 2) % len(c.Masters)
	var slot int
	for slot = 0; ; slot++ {
		if owner, err := c.SlotOwner(ctx, slot); err != nil {
			t.Fatal(err)
		} else if owner == other {
			break
		}
	}
	if err := c.MigrateSlot(ctx, slot, third, 100, 0); err != nil {
		t.Fatal(err)
	}
	if gap := mark(); gap != nil {
		t.Fatalf("mark after slot %d moved between masters: %+v, want no blind interval", slot, gap)
	}

	// Fail other over gracefully: its replica takes over once in sync, and
	// it becomes a replica.
	rc := redistest.Client(t, c.Replicas[other])
	if err := rc.Do(ctx, "CLUSTER", "FAILOVER").Err(); err != nil {
		t.Fatal(err)
	}
	var gap *BlindInterval
	if !waitFor(30*time.Second, func() bool { gap = mark(); return gap != nil }) {
		role, _ := rc.Do(ctx, "ROLE").Slice()
		t.Fatalf("no blind interval within 30s of a graceful failover; the replica's role: %v", role)
	}
	if gap.Reason != BlindFailover {
		t.Fatalf("mark after a graceful failover: %+v, want a failover", gap)
	}
	// Once the control keys' master sees the old master as a replica, the
	// failover is over: marks find nothing more.
	oldID, err := redistest.Client(t, c.Masters[other]).Do(ctx, "CLUSTER", "MYID").Text()
	if err != nil {
		t.Fatal(err)
	}
	ctlClient := redistest.Client(t, c.Masters[ctl])
	var nodes string
	if !waitFor(30*time.Second, func() bool {
		if nodes, err = ctlClient.ClusterNodes(ctx).Result(); err != nil {
			t.Fatal(err)
		}
		return slices.ContainsFunc(strings.Split(nodes, "\n"), func(l string) bool {
			f := strings.Fields(l)
			return len(f) > 2 && f[0] == oldID && strings.Contains(f[2], "slave")
		})
	}) {
		t.Fatalf("the old master is no replica within 30s:\n%s", nodes)
	}
	mark()
	if again := mark(); again != nil {
		t.Fatalf("mark after the failover was over: %+v, want none", again)
	}
}

// TestRecordBlindSince: an interval recorded again while it lasts keeps
// its start, ends at Redis's now, and replaces its last record.
func TestRecordBlindSince(t *testing.T) {
	s, ctx := newStore(t)
	first, err := s.RecordBlindSince(ctx, time.Time{}, "gw-1", BlindDrain, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !first.End.Equal(first.Start) || first.Scope != "gw-1" || first.Reason != BlindDrain {
		t.Fatalf("first record %+v: want an instant of gw-1's drain", first)
	}
	// Real time must pass for the interval to grow, by Redis's clock.
	redisPast(t, s.rdb, first.End)
	again, err := s.RecordBlindSince(ctx, first.Start, "gw-1", BlindDrain, &first)
	if err != nil {
		t.Fatal(err)
	}
	if !again.Start.Equal(first.Start) || !again.End.After(first.End) {
		t.Fatalf("record again %+v after %+v: want the same start and a later end", again, first)
	}
	ms, err := s.rdb.ZRange(ctx, s.ks.BlindKey(), 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 1 || ms[0] != again.member() {
		t.Fatalf("blind intervals %q; want only %q", ms, again.member())
	}
}

// TestResyncAgesItsGrant: a resync's grant is measured when the gateway
// takes it, and may reach Redis seconds later (queued behind an outage's
// retries, or behind the batches before it). Its deadline is the grant's
// own, not that much later, and its renewal is recorded at its ping; one
// that ran out meanwhile is restored as lapsed (its silence fell in the
// outage). A Redis master restarted empty, a resync that waited 1.4 s: the
// guide named a deadline 1.4 s past the one the user was granted.
func TestResyncAgesItsGrant(t *testing.T) {
	s, ctx := newStore(t)
	r := runRenewer(t, s)

	// Taken 3 s ago: 10 s were left then, the ping 1 s before that.
	taken := time.Now().Add(-3 * time.Second)
	if _, err := r.Resync(ctx, []Grant{
		{UID: "waited", Segment: DefaultSegment, Left: 10 * time.Second, Ago: time.Second, Taken: taken},
		{UID: "ranout", Segment: DefaultSegment, Left: 2 * time.Second, Ago: time.Second, Taken: taken},
	}); err != nil {
		t.Fatal(err)
	}
	// Redis's clock and this process's are the same host's.
	near := func(got, want time.Time) bool { return got.Sub(want).Abs() <= 20*time.Millisecond }
	v, err := s.rdb.ZScore(ctx, s.ks.IndexKey(Bucket("waited")), "waited").Result()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := time.UnixMilli(int64(v)), taken.Add(10*time.Second); !near(got, want) {
		t.Errorf("waited: deadline %v past the grant's own (%v): the resync's wait was added to it", got.Sub(want), want)
	}
	if got, err := s.LastRenewed(ctx, "waited"); err != nil || !near(got, taken.Add(-time.Second)) {
		t.Errorf("waited: renewal recorded at %v (%v), want its ping's time %v", got, err, taken.Add(-time.Second))
	}
	// Ran out 1 s ago, while the resync waited: restored as lapsed, at its
	// own deadline (the one its guide names), not 2 s after the resync.
	v, err = s.rdb.ZScore(ctx, s.ks.IndexKey(Bucket("ranout")), "ranout").Result()
	if err != nil {
		t.Fatalf("ranout: no index entry (%v): a grant that ran out while its resync waited is restored as lapsed", err)
	}
	if got, want := time.UnixMilli(int64(v)), taken.Add(2*time.Second); !near(got, want) {
		t.Errorf("ranout: due %v past its own deadline %v, want at it (lapsed)", got.Sub(want), want)
	}
}
