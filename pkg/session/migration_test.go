package session

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stillthere/stillthere/pkg/redisserver"
	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
)

// Sessions whose cluster slot migrates: their keys are split between two
// masters for a while.

// migrationRig is a store on a 3-master cluster, and the slot of one
// bucket ready to move.
type migrationRig struct {
	c        *redisserver.Cluster
	s        *Store
	bucket   int
	slot, to int
	masters  []*redis.Client // one client per master, for its stats
}

func newMigrationRig(t *testing.T, uid string) *migrationRig {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	c := redistest.StartCluster(t)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	t.Cleanup(func() { rdb.Close() })
	ks, err := NewKeyspace(redistest.Prefix(t))
	if err != nil {
		t.Fatal(err)
	}
	r := &migrationRig{c: c, s: NewStore(rdb, ks), bucket: Bucket(uid)}
	ctx := context.Background()
	if r.slot, err = c.SlotOf(ctx, ks.IndexKey(r.bucket)); err != nil {
		t.Fatal(err)
	}
	from, err := c.SlotOwner(ctx, r.slot)
	if err != nil {
		t.Fatal(err)
	}
	r.to = (from + 1) % len(c.Masters)
	for _, m := range c.Masters {
		r.masters = append(r.masters, redistest.Client(t, m))
	}
	return r
}

// refusals counts the TRYAGAIN replies the masters sent, so far: a test
// that finishes a migration under a call waits for one first, to know the
// call was refused while the keys were split and not sent after the move.
func (r *migrationRig) refusals(t *testing.T) int {
	t.Helper()
	n := 0
	for _, m := range r.masters {
		info, err := m.Info(context.Background(), "errorstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "errorstat_TRYAGAIN:count="); ok {
				c, err := strconv.Atoi(v)
				if err != nil {
					t.Fatalf("errorstats line %q: %v", line, err)
				}
				n += c
			}
		}
	}
	return n
}

func (r *migrationRig) begin(t *testing.T) *redisserver.Migration {
	t.Helper()
	m, err := r.c.BeginMigration(context.Background(), r.slot, r.to)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestRenewerRetriesThroughSlotMigration: a renewal whose keys are split
// between two masters is refused (TRYAGAIN) until the slot has moved; the
// renewer sends it again until it lands, within its SlotRetry, and one
// held up longer fails once SlotRetry has passed, not later. After the
// move, the new owner that never ran the script (NOSCRIPT) is given its
// source.
func TestRenewerRetriesThroughSlotMigration(t *testing.T) {
	const uid = "mig-renew"
	r := newMigrationRig(t, uid)
	s, ctx := r.s, context.Background()
	if _, err := s.Renew(ctx, uid, "default", time.Minute, ClockPresence); err != nil {
		t.Fatal(err)
	}
	type flush struct {
		took time.Duration
		err  error
	}
	var mu sync.Mutex
	var flushes []flush
	const slotRetry = 400 * time.Millisecond
	rn := NewRenewer(s, RenewerConfig{SlotRetry: slotRetry, OnFlush: func(_ int, took time.Duration, err error) {
		mu.Lock()
		flushes = append(flushes, flush{took, err})
		mu.Unlock()
	}})
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); rn.Run(rctx) }()
	defer func() { cancel(); <-done }()
	flushCount := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(flushes)
	}
	// flushAfter is the last flush once more than n were seen, waiting
	// for it: the renewer answers its callers before it reports the
	// flush.
	flushAfter := func(t *testing.T, n int) flush {
		t.Helper()
		eventually(t, 5*time.Second, "the renewer to report its flush", func() bool { return flushCount() > n })
		mu.Lock()
		defer mu.Unlock()
		return flushes[len(flushes)-1]
	}

	m := r.begin(t)
	// The session key on the target, the rest on the source: split.
	if err := m.Move(ctx, s.ks.SessionKey(uid)); err != nil {
		t.Fatal(err)
	}

	t.Run("held up longer than SlotRetry", func(t *testing.T) {
		n := flushCount()
		start := time.Now()
		_, err := rn.Renew(ctx, uid, "default", time.Minute, ClockPresence)
		took := time.Since(start)
		if !redis.IsTryAgainError(err) {
			t.Fatalf("Renew while the keys stay split = %v, want TRYAGAIN", err)
		}
		if took < slotRetry/2 || took > slotRetry+time.Second {
			t.Errorf("Renew failed after %v, want it retried for about SlotRetry (%v)", took, slotRetry)
		}
		if f := flushAfter(t, n); f.err == nil || f.took > slotRetry+time.Second {
			t.Errorf("OnFlush saw %+v, want the failure, within SlotRetry and a round trip", f)
		}
	})

	t.Run("lands once the slot has moved", func(t *testing.T) {
		type result struct {
			deadline time.Time
			err      error
		}
		res := make(chan result, 1)
		n, refused := flushCount(), r.refusals(t)
		start := time.Now()
		go func() {
			d, err := rn.Renew(ctx, uid, "default", time.Minute, ClockPresence)
			res <- result{d, err}
		}()
		eventually(t, slotRetry, "the renewal refused while the keys are split", func() bool { return r.refusals(t) > refused })
		if err := m.Finish(ctx); err != nil {
			t.Fatal(err)
		}
		got := <-res
		if got.err != nil {
			t.Fatalf("Renew through the migration: %v", got.err)
		}
		if d := time.Until(got.deadline); d < 50*time.Second {
			t.Errorf("deadline %v from now, want about a minute", d)
		}
		if took := time.Since(start); took > slotRetry+time.Second {
			t.Errorf("Renew took %v", took)
		}
		if f := flushAfter(t, n); f.err != nil {
			t.Errorf("OnFlush saw %+v, want success", f)
		}
	})

	t.Run("NOSCRIPT on the new owner", func(t *testing.T) {
		dst := redis.NewClient(&redis.Options{Addr: r.c.Masters[r.to].Addr})
		defer dst.Close()
		if err := dst.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		if _, err := rn.Renew(ctx, uid, "default", time.Minute, ClockPresence); err != nil {
			t.Fatalf("Renew on a new owner without the script: %v", err)
		}
		if err := rn.End(ctx, uid); err != nil {
			t.Fatalf("End on a new owner without the script: %v", err)
		}
		if live, err := s.Live(ctx, uid); err != nil || live {
			t.Errorf("Live after End = %v, %v", live, err)
		}
	})
}

// TestSweepDuringSlotMigration: while a bucket's keys are split between
// two masters, a sweep either fails (the next one retries) or reports
// what is true; it never reads a key on a node that no longer holds it.
// Here the bucket's index, hashes and holds have moved, and the route key
// of the user who went silent has not: a script that reads that key
// without declaring it runs on the target and finds no route.
func TestSweepDuringSlotMigration(t *testing.T) {
	const silent = "mig-silent"
	r := newMigrationRig(t, silent)
	s, ctx := r.s, context.Background()
	// Another user of the bucket, whose timeout is held: the bucket has
	// hold keys, as it does whenever timeouts wait for a recheck.
	var other string
	for i := 0; other == ""; i++ {
		if u := "mig-other-" + itoa(i); Bucket(u) == r.bucket {
			other = u
		}
	}
	renewVia(t, s, "gw-a", silent, 100*time.Millisecond)
	last := renewVia(t, s, "gw-a", other, 100*time.Millisecond)
	if res := s.WriteRoutes(ctx, "gw-b", []RouteCount{{UID: silent, Count: 1}}, time.Hour, nil); res[0].Err != nil {
		t.Fatal(res[0].Err)
	}
	redisPast(t, s.rdb, last)
	due, now, err := s.Due(ctx, 100)
	if err != nil || len(due) != 2 {
		t.Fatalf("Due = %+v, %v; want both users", due, err)
	}
	var held Expired
	for _, e := range due {
		if e.UID == other {
			held = e
		}
	}
	if n, err := s.Hold(ctx, []Expired{held}, now.Add(time.Hour)); err != nil || n != 1 {
		t.Fatalf("Hold = %d, %v", n, err)
	}

	m := r.begin(t)
	ks := s.ks
	if err := m.Move(ctx, ks.IndexKey(r.bucket), ks.SegmentsKey(r.bucket), ks.ViaKey(r.bucket),
		ks.HoldKey(r.bucket), ks.HeldKey(r.bucket)); err != nil {
		t.Fatal(err)
	}
	check := func(when string, got []Expired) {
		t.Helper()
		if len(got) != 1 || got[0].UID != silent {
			t.Errorf("%s: Due = %+v, want %s alone", when, got, silent)
			return
		}
		if e := got[0]; e.Via != "gw-a" || !slices.Equal(e.Routes, []string{"gw-b"}) {
			t.Errorf("%s: %s via %q, routes %q; want via gw-a, routes [gw-b]", when, e.UID, e.Via, e.Routes)
		}
	}
	if got, _, err := s.Due(ctx, 100); err != nil {
		t.Logf("Due while the bucket's keys are split: %v", err)
	} else {
		check("while the keys are split", got)
	}
	if e, ok, err := s.Lookup(ctx, silent); err == nil && ok {
		check("Lookup while the keys are split", []Expired{e})
	}
	if err := m.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	got, _, err := s.Due(ctx, 100)
	if err != nil {
		t.Fatalf("Due after the move: %v", err)
	}
	check("after the move", got)
	e, ok, err := s.Lookup(ctx, silent)
	if err != nil || !ok {
		t.Fatalf("Lookup after the move = %v, %v", ok, err)
	}
	check("Lookup after the move", []Expired{e})
	if err := s.Settle(ctx, got); err != nil {
		t.Fatalf("Settle after the move: %v", err)
	}
	if again, _, err := s.Due(ctx, 100); err != nil || len(again) != 0 {
		t.Errorf("Due after settling = %+v, %v; want none", again, err)
	}
}

// TestWriteRoutesRetriesThroughSlotMigration: a route write whose keys
// are split between two masters lands once the slot has moved, and a
// normal close that ends the session then ends it.
func TestWriteRoutesRetriesThroughSlotMigration(t *testing.T) {
	const uid = "mig-route"
	r := newMigrationRig(t, uid)
	s, ctx := r.s, context.Background()
	renewVia(t, s, "gw-a", uid, time.Minute)
	if res := s.WriteRoutes(ctx, "gw-a", []RouteCount{{UID: uid, Count: 1}}, time.Hour, nil); res[0].Err != nil {
		t.Fatal(res[0].Err)
	}
	m := r.begin(t)
	if err := m.Move(ctx, s.ks.RouteKey(uid)); err != nil {
		t.Fatal(err)
	}
	res := make(chan RouteResult, 1)
	refused := r.refusals(t)
	go func() {
		res <- s.WriteRoutes(ctx, "gw-a", []RouteCount{{UID: uid, Count: 0, End: true}}, time.Hour, nil)[0]
	}()
	eventually(t, DefaultSlotRetry, "the route write refused while the keys are split", func() bool { return r.refusals(t) > refused })
	if err := m.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	got := <-res
	if got.Err != nil || !got.Ended || got.Left != 0 {
		t.Fatalf("WriteRoutes through the migration = %+v, want the session ended", got)
	}
	if live, err := s.Live(ctx, uid); err != nil || live {
		t.Errorf("Live after the last connection closed = %v, %v", live, err)
	}
}

// TestPipelineOfMixedRefusals: mid-migration one pipeline to the source
// holds a renewal refused with TRYAGAIN (its keys split) first, and one
// answered ASK (its keys all moved) after it. go-redis would resend the
// first's whole batch, the second with it, while it also follows the
// second's ASK: the second then runs on two connections at once, racing
// on its reply (the race detector fails this test then). runScripts
// resends the refused calls itself, each once per round.
func TestPipelineOfMixedRefusals(t *testing.T) {
	const split = "mig-split"
	r := newMigrationRig(t, split)
	s, ctx := r.s, context.Background()
	var moved string
	for i := 0; moved == ""; i++ {
		if u := "mig-moved-" + itoa(i); Bucket(u) == r.bucket {
			moved = u
		}
	}
	for _, uid := range []string{split, moved} {
		if _, err := s.Renew(ctx, uid, "default", time.Minute, ClockPresence); err != nil {
			t.Fatal(err)
		}
	}
	m := r.begin(t)
	ks := s.ks
	// The bucket's keys and every key of moved on the target; split's
	// session and renewal keys still on the source.
	if err := m.Move(ctx, ks.IndexKey(r.bucket), ks.SegmentsKey(r.bucket), ks.ViaKey(r.bucket),
		ks.SessionKey(moved), ks.RenewedKey(moved)); err != nil {
		t.Fatal(err)
	}
	call := func(i int) (*redis.Script, []string, []any) {
		uid := []string{split, moved}[i]
		return renewScript.call(ks.grantKeys(uid), HoldNotes{}.args([]any{uid, time.Minute.Milliseconds(), "default", "", modeRenew,
			RenewedKeep.Milliseconds(), 0, "", MaxTurnHold.Milliseconds()})...)
	}
	for i, cmd := range s.runScripts(ctx, 2, call, 50*time.Millisecond) {
		if err := cmd.Err(); !slotMoving(err) {
			t.Errorf("call %d while the keys stay split: %v, want a moving slot's refusal", i, err)
		}
	}
	if err := m.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	for i, cmd := range s.runScripts(ctx, 2, call, DefaultSlotRetry) {
		if err := cmd.Err(); err != nil {
			t.Errorf("call %d after the move: %v", i, err)
		}
	}
}
