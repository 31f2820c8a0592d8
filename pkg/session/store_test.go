package session

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
)

func newStore(t *testing.T) (*Store, context.Context) { return newStoreTB(t) }

// newStoreTB is newStore for a test or a benchmark.
func newStoreTB(t testing.TB) (*Store, context.Context) {
	srv := redistest.Start(t)
	rdb := redistest.Client(t, srv)
	ks, err := NewKeyspace(redistest.Prefix(t))
	if err != nil {
		t.Fatal(err)
	}
	return NewStore(rdb, ks), context.Background()
}

// newClusterStore is newStore on a 3-master Redis Cluster.
func newClusterStore(t *testing.T) (*Store, context.Context) {
	c := redistest.StartCluster(t)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	t.Cleanup(func() { rdb.Close() })
	ks, err := NewKeyspace(redistest.Prefix(t))
	if err != nil {
		t.Fatal(err)
	}
	return NewStore(rdb, ks), context.Background()
}

func TestRenewWritesKeyAndIndex(t *testing.T) {
	s, ctx := newStore(t)
	before := time.Now()
	deadline, err := s.Renew(ctx, "alice", "vip", 2*time.Second, ClockPresence)
	if err != nil {
		t.Fatal(err)
	}
	if d := deadline.Sub(before); d < 1500*time.Millisecond || d > 3*time.Second {
		t.Fatalf("deadline %v from now, want about 2s", d)
	}
	pttl, err := s.rdb.PTTL(ctx, s.ks.SessionKey("alice")).Result()
	if err != nil || pttl <= 1500*time.Millisecond || pttl > 2*time.Second {
		t.Fatalf("PTTL = %v, %v; want (1.5s, 2s]", pttl, err)
	}
	b := Bucket("alice")
	score, err := s.rdb.ZScore(ctx, s.ks.IndexKey(b), "alice").Result()
	if err != nil || int64(score) != deadline.UnixMilli() {
		t.Fatalf("index score = %v, %v; want %d", score, err, deadline.UnixMilli())
	}
	if seg, _ := s.rdb.HGet(ctx, s.ks.SegmentsKey(b), "alice").Result(); seg != "vip" {
		t.Fatalf("segment = %q, want vip", seg)
	}
	if live, err := s.Live(ctx, "alice"); err != nil || !live {
		t.Fatalf("Live = %v, %v", live, err)
	}
}

func TestDueListsOnlyExpired(t *testing.T) {
	s, ctx := newStore(t)
	for _, uid := range []string{"gone1", "gone2", "gone3"} {
		if _, err := s.Renew(ctx, uid, "default", 50*time.Millisecond, ClockPresence); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Renew(ctx, "live", "default", time.Minute, ClockPresence); err != nil {
		t.Fatal(err)
	}
	last, err := s.Renew(ctx, "ended", "default", 50*time.Millisecond, ClockPresence)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.End(ctx, "ended"); err != nil {
		t.Fatal(err)
	}
	// Past every short deadline, the ended session's the last of them:
	// it would be due now had the end left it in the index.
	redisPast(t, s.rdb, last)

	due, now, err := s.Due(ctx, 100)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]Expired{}
	for _, e := range due {
		got[e.UID] = e
	}
	if len(got) != 3 || got["gone1"].UID == "" || got["gone2"].UID == "" || got["gone3"].UID == "" {
		t.Fatalf("Due = %+v, want gone1..3", due)
	}
	for _, e := range due {
		if e.Detected.Before(e.Deadline) || e.Detected.After(now) || e.Segment != "default" {
			t.Errorf("entry %+v: detected before deadline or wrong segment", e)
		}
	}
	// The sweep's EXISTS made Redis expire the keys on the spot.
	if n, _ := s.rdb.Exists(ctx, s.ks.SessionKey("gone1")).Result(); n != 0 {
		t.Fatal("expired key still present")
	}
}

func TestSettleKeepsRenewedEntries(t *testing.T) {
	s, ctx := newStore(t)
	var last time.Time
	for _, uid := range []string{"a", "b"} {
		d, err := s.Renew(ctx, uid, "default", 20*time.Millisecond, ClockPresence)
		if err != nil {
			t.Fatal(err)
		}
		last = d
	}
	redisPast(t, s.rdb, last)
	due, _, err := s.Due(ctx, 10)
	if err != nil || len(due) != 2 {
		t.Fatalf("Due = %v, %v", due, err)
	}
	// b comes back after the sweep saw it and before the settle.
	if _, err := s.Renew(ctx, "b", "default", time.Minute, ClockPresence); err != nil {
		t.Fatal(err)
	}
	if err := s.Settle(ctx, due); err != nil {
		t.Fatal(err)
	}
	if _, err := s.rdb.ZScore(ctx, s.ks.IndexKey(Bucket("a")), "a").Result(); err == nil {
		t.Error("a's index entry survived the settle")
	}
	if _, err := s.rdb.ZScore(ctx, s.ks.IndexKey(Bucket("b")), "b").Result(); err != nil {
		t.Error("b's renewed index entry was removed:", err)
	}
	if due, _, _ := s.Due(ctx, 10); len(due) != 0 {
		t.Fatalf("Due after settle = %v", due)
	}
}

func TestLookup(t *testing.T) {
	s, ctx := newStore(t)
	deadline, err := s.Renew(ctx, "x", "new", 20*time.Millisecond, ClockPresence)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, err := s.Lookup(ctx, "x"); err != nil || ok {
		t.Fatalf("Lookup of a live session = %v, %v; want not ok", ok, err)
	}
	redisPast(t, s.rdb, deadline)
	e, ok, err := s.Lookup(ctx, "x")
	if err != nil || !ok || e.UID != "x" || e.Segment != "new" {
		t.Fatalf("Lookup = %+v, %v, %v", e, ok, err)
	}
	if err := s.Settle(ctx, []Expired{e}); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := s.Lookup(ctx, "x"); err != nil || ok {
		t.Fatalf("Lookup after settle = %v, %v; want not ok", ok, err)
	}
}

func TestDueLimitPerBucket(t *testing.T) {
	s, ctx := newStore(t)
	// Find 5 uids in one bucket.
	var uids []string
	for i := 0; len(uids) < 5; i++ {
		uid := "u" + itoa(i)
		if Bucket(uid) == 0 {
			uids = append(uids, uid)
		}
	}
	var last time.Time
	for _, uid := range uids {
		d, err := s.Renew(ctx, uid, "default", 10*time.Millisecond, ClockPresence)
		if err != nil {
			t.Fatal(err)
		}
		last = d
	}
	redisPast(t, s.rdb, last)
	due, _, err := s.Due(ctx, 2)
	if err != nil || len(due) != 2 {
		t.Fatalf("Due(limit 2) = %d entries, %v", len(due), err)
	}
}

// BenchmarkRenew measures one renewal round trip against a real Redis.
func BenchmarkRenew(b *testing.B) {
	srv := redistest.Start(b)
	rdb := redistest.Client(b, srv)
	ks, _ := NewKeyspace(redistest.Prefix(b))
	s := NewStore(rdb, ks)
	ctx := context.Background()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		if _, err := s.Renew(ctx, "u"+itoa(i%10000), "default", time.Minute, ClockPresence); err != nil {
			b.Fatal(err)
		}
	}
}

// TestRenewNeverMovesDeadlineEarlier: one user's devices in two segments.
// A ping from the short-TTL device keeps the deadline the long-TTL device
// was granted, with that grant's segment and instance (and names its own
// instance as the last to renew), and still records the user as there; a ping that grants later moves the deadline, and
// the segment and instance with it. A normal end still ends it all.
func TestRenewNeverMovesDeadlineEarlier(t *testing.T) {
	s, ctx := newStore(t)
	b := Bucket("multi")
	renew := func(segment, instance string, ttl time.Duration) time.Time {
		t.Helper()
		ms, err := renewScript.Run(ctx, s.rdb, s.ks.grantKeys("multi"), HoldNotes{}.args([]any{"multi", ttl.Milliseconds(), segment,
			instance, modeRenew, RenewedKeep.Milliseconds(), 0, "", MaxTurnHold.Milliseconds()})...).Int64Slice()
		if err != nil {
			t.Fatal(err)
		}
		// The grant's own deadline: now+ttl, never past the session's.
		if own := time.UnixMilli(ms[1]); own.After(time.UnixMilli(ms[0])) || time.Until(own) > ttl+time.Second {
			t.Fatalf("a %v grant answered its own deadline %v, session's %v", ttl, own, time.UnixMilli(ms[0]))
		}
		return time.UnixMilli(ms[0])
	}
	state := func() (score time.Time, seg, via string, pttl time.Duration) {
		t.Helper()
		v, err := s.rdb.ZScore(ctx, s.ks.IndexKey(b), "multi").Result()
		if err != nil {
			t.Fatal(err)
		}
		seg = s.rdb.HGet(ctx, s.ks.SegmentsKey(b), "multi").Val()
		via = s.rdb.HGet(ctx, s.ks.ViaKey(b), "multi").Val()
		return time.UnixMilli(int64(v)), seg, via, s.rdb.PTTL(ctx, s.ks.SessionKey("multi")).Val()
	}

	phone := renew("mobile", "gw-a", 30*time.Second)
	// Real time passes between the two pings, so the second one's
	// renewal is told apart from the first's.
	redisPast(t, s.rdb, phone.Add(-30*time.Second))
	web := renew("default", "gw-b", 2*time.Second)
	if !web.Equal(phone) {
		t.Fatalf("the web tab's ping returned deadline %v, want the phone's %v kept", web, phone)
	}
	score, seg, via, pttl := state()
	if !score.Equal(phone) || seg != "mobile" || via != "gw-a,gw-b" || pttl < 20*time.Second {
		t.Fatalf("after the web tab's ping: deadline %v, segment %q, via %q, session TTL %v; "+
			"want the phone's grant (%v, mobile, gw-a, about 30s), and gw-b as the last to renew", score, seg, via, pttl, phone)
	}
	// Another device's short ping elsewhere: it is now the last to renew.
	renew("default", "gw-c", 2*time.Second)
	if _, _, via, _ = state(); via != "gw-a,gw-c" {
		t.Fatalf("after a short ping on gw-c: via %q, want gw-a,gw-c", via)
	}
	if at, err := s.LastRenewed(ctx, "multi"); err != nil || !at.After(phone.Add(-30*time.Second)) {
		t.Fatalf("LastRenewed = %v, %v; want the web tab's ping", at, err)
	}
	if kept := s.rdb.PTTL(ctx, s.ks.RenewedKey("multi")).Val(); kept < RenewedKeep+20*time.Second {
		t.Errorf("renewal kept %v, want past the phone's deadline by RenewedKeep", kept)
	}

	later := renew("default", "gw-b", time.Minute)
	if !later.After(phone) {
		t.Fatalf("a longer grant returned %v, want later than %v", later, phone)
	}
	if score, seg, via, _ = state(); !score.Equal(later) || seg != "default" || via != "gw-b" {
		t.Fatalf("after a longer grant: deadline %v, segment %q, via %q; want %v, default, gw-b", score, seg, via, later)
	}

	if err := s.End(ctx, "multi"); err != nil {
		t.Fatal(err)
	}
	if live, _ := s.Live(ctx, "multi"); live || s.rdb.ZScore(ctx, s.ks.IndexKey(b), "multi").Err() == nil {
		t.Fatalf("after the end: session live %v, or still in the index", live)
	}
	if short := renew("default", "gw-b", 2*time.Second); short.After(later) || !short.After(phone.Add(-30*time.Second)) {
		t.Fatalf("first ping after the end: deadline %v, want a fresh 2s grant", short)
	}
}

// runRenewer starts a renewer of s for instance gw-1, stopped when the
// test ends.
func runRenewer(t *testing.T, s *Store) *Renewer {
	t.Helper()
	r := NewRenewer(s, RenewerConfig{Instance: "gw-1"})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return r
}
