package session

import (
	"context"
	"testing"
	"time"
)

// TestEndRecordedAtTheClose: a normal close's end that lands late (held
// through an outage in its instance's route writer) is recorded at the
// close, not when it lands, and a renewal since then, whichever lands
// first, keeps the session: a ping on another device after the close
// restored before the end refuses it; one restored after the end restores
// the session; one from before the close restores nothing.
func TestEndRecordedAtTheClose(t *testing.T) {
	s, ctx := newStore(t)
	r := NewRenewer(s, RenewerConfig{Instance: "gw-phone"})
	rctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(rctx) }()
	defer func() { cancel(); <-done }()

	live := func(uid string) bool {
		t.Helper()
		ok, err := s.Live(ctx, uid)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	resync := func(uid string, ago time.Duration) {
		t.Helper()
		if _, err := r.Resync(ctx, []Grant{{UID: uid, Segment: DefaultSegment, Left: time.Minute, Ago: ago}}); err != nil {
			t.Fatal(err)
		}
	}
	end := func(uid string, ago time.Duration) RouteResult {
		t.Helper()
		res := s.WriteRoutes(ctx, "gw-laptop", []RouteCount{{UID: uid, Count: 0, End: true, EndAgo: ago}}, time.Hour, nil)[0]
		if res.Err != nil {
			t.Fatal(res.Err)
		}
		return res
	}
	redisNow := func() time.Time {
		t.Helper()
		now, err := s.rdb.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		return now
	}

	t.Run("a renewal since the close refuses the end", func(t *testing.T) {
		// The laptop closed 10s ago; the phone pinged 4s ago, and its
		// resync landed first.
		resync("ray", 4*time.Second)
		if res := end("ray", 10*time.Second); res.Ended {
			t.Fatal("the close ended a session renewed after it")
		}
		if !live("ray") {
			t.Fatal("the session is gone")
		}
		if s.rdb.HExists(ctx, s.ks.RouteKey("ray"), "gw-laptop").Val() {
			t.Error("the closing instance's route entry stayed")
		}
		// A close after the last renewal still ends it.
		if res := end("ray", 0); !res.Ended || live("ray") {
			t.Fatalf("a close after the last renewal: %+v, live %v; want ended", res, live("ray"))
		}
	})

	t.Run("the end lands first", func(t *testing.T) {
		resync("sam", 20*time.Second) // the laptop's last ping, before the close
		before := redisNow()
		if res := end("sam", 10*time.Second); !res.Ended || live("sam") {
			t.Fatalf("end = %+v, live %v; want ended", res, live("sam"))
		}
		at, err := s.LastRenewed(ctx, "sam")
		if err != nil {
			t.Fatal(err)
		}
		if want := before.Add(-10 * time.Second); at.Before(want.Add(-time.Second)) || at.After(want.Add(time.Second)) {
			t.Errorf("end recorded %v before now, want at the close, 10s before", before.Sub(at))
		}
		// A ping from before the close, resynced late, restores nothing.
		resync("sam", 12*time.Second)
		if live("sam") {
			t.Fatal("a ping from before the close brought the session back")
		}
		// The phone's ping after the close, resynced now, does.
		resync("sam", 4*time.Second)
		if !live("sam") {
			t.Fatal("the session of a ping after the close was not restored")
		}
	})
}
