package session

import (
	"slices"
	"testing"
	"time"
)

// TestAttack27LookupListsDroppedRoute: "a user is present while any of
// their devices pings". A route entry dropped for a dead gateway is
// remembered so that the listener's gateway-dead rule still counts that
// gateway among the user's instances; the sweep's due.lua lists it. The
// listener's other way in, an expired keyspace event (events mode, and
// the default hybrid mode, where it races the read-ahead's timer), goes
// through lookup.lua, which lists the route's entries alone: the cut-off
// gateway is not among the user's instances there, and a user whose
// deadline is an idle laptop's grant is guided while their phone pings
// the cut-off gateway.
func TestAttack27LookupListsDroppedRoute(t *testing.T) {
	s, ctx := newStore(t)
	const ttl = time.Hour
	write := func(inst string, dead ...DeadInstance) {
		t.Helper()
		if res := s.WriteRoutes(ctx, inst, []RouteCount{{UID: "phone-and-laptop", Count: 1}}, ttl, dead)[0]; res.Err != nil {
			t.Fatal(res.Err)
		}
	}
	write("gw-a")
	write("gw-b")
	write("gw-b", DeadInstance{Name: "gw-a", Cut: redisNow(t, s.rdb)})
	deadline, err := s.Renew(ctx, "phone-and-laptop", DefaultSegment, 50*time.Millisecond, ClockPresence)
	if err != nil {
		t.Fatal(err)
	}
	redisPast(t, s.rdb, deadline)

	e, ok, err := s.Lookup(ctx, "phone-and-laptop")
	if err != nil || !ok {
		t.Fatalf("lookup of the lapsed session: %v, %v", ok, err)
	}
	got := slices.Sorted(slices.Values(e.Routes))
	swept := dueOne(t, s, "phone-and-laptop", 2*time.Second, sweepAll(s))
	want := slices.Sorted(slices.Values(swept.Routes))
	if !slices.Equal(want, []string{"gw-a", "gw-b"}) {
		t.Fatalf("the sweep lists routes %v, want gw-a (dropped as dead) and gw-b", want)
	}
	if !slices.Equal(got, want) {
		t.Errorf("an expired event's lookup lists routes %v, the sweep %v: the gateway the phone pings, cut from Redis, is not counted by the hold rules", got, want)
	}
}

// TestAttack27DroppedMemoryExpires: a dropped entry is remembered "for
// twice the route TTL", forgotten by a later write to the user's route.
// But the memory is written into the stamps hash without a TTL of its
// own: when the dead instance's entry was the last of the route (a
// delivery's drop), or the writer's own entry goes with it (the last
// close on the live instance), HDEL empties the stamps key, which Redis
// deletes, and the HSET of "!<inst>" makes a new key without an expiry.
// Nobody writes that user's route again if they never come back: the key
// lives for ever, one per user of every gateway that dies.
func TestAttack27DroppedMemoryExpires(t *testing.T) {
	s, ctx := newStore(t)
	const ttl = time.Hour
	write := func(inst, uid string, n int, dead ...DeadInstance) {
		t.Helper()
		if res := s.WriteRoutes(ctx, inst, []RouteCount{{UID: uid, Count: n}}, ttl, dead)[0]; res.Err != nil {
			t.Fatal(res.Err)
		}
	}
	expires := func(uid string) {
		t.Helper()
		key := s.ks.RouteStampKey(uid)
		left, err := s.rdb.PTTL(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		fields, err := s.rdb.HGetAll(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		// -2: no key; else a TTL of at most twice the route's.
		if left != -2*time.Nanosecond && (left < 0 || left > 2*ttl) {
			t.Errorf("%s: the route stamps key %v never expires (TTL %v); the route key exists: %v",
				uid, fields, left, s.rdb.Exists(ctx, s.ks.RouteKey(uid)).Val() == 1)
		}
	}

	t.Run("a delivery drops the last entry", func(t *testing.T) {
		write("gw-a", "delivered", 1)
		if _, _, err := s.DropDeadRoutes(ctx, "delivered", []DeadInstance{{Name: "gw-a", Cut: redisNow(t, s.rdb)}}); err != nil {
			t.Fatal(err)
		}
		expires("delivered")
	})
	t.Run("the last close on the live instance drops the dead one", func(t *testing.T) {
		write("gw-a", "closed", 1)
		write("gw-b", "closed", 1)
		write("gw-b", "closed", 0, DeadInstance{Name: "gw-a", Cut: redisNow(t, s.rdb)})
		expires("closed")
	})
	t.Run("control: a write that keeps an entry", func(t *testing.T) {
		write("gw-a", "kept", 1)
		write("gw-b", "kept", 1)
		write("gw-b", "kept", 1, DeadInstance{Name: "gw-a", Cut: redisNow(t, s.rdb)})
		expires("kept")
	})
}

// TestAttack27RememberedDropLetsTheLastCloseEnd: the memory of a dropped
// entry lives in the stamps, not in the route's counts, so it neither
// delivers to the dead instance nor keeps the session alive: the last
// normal close on the live instance still ends the session, and the
// dead instance's own return (a write of count 0) forgets the memory.
func TestAttack27RememberedDropLetsTheLastCloseEnd(t *testing.T) {
	s, ctx := newStore(t)
	const ttl = time.Hour
	const uid = "closes"
	write := func(inst string, c RouteCount, dead ...DeadInstance) RouteResult {
		t.Helper()
		c.UID = uid
		res := s.WriteRoutes(ctx, inst, []RouteCount{c}, ttl, dead)[0]
		if res.Err != nil {
			t.Fatal(res.Err)
		}
		return res
	}
	if _, err := s.Renew(ctx, uid, DefaultSegment, time.Minute, ClockPresence); err != nil {
		t.Fatal(err)
	}
	write("gw-a", RouteCount{Count: 1})
	write("gw-b", RouteCount{Count: 1})
	if res := write("gw-b", RouteCount{Count: 1}, DeadInstance{Name: "gw-a", Cut: redisNow(t, s.rdb)}); res.Left != 1 {
		t.Fatalf("after dropping dead gw-a: %d connections left, want gw-b's 1", res.Left)
	}
	redisPast(t, s.rdb, redisNow(t, s.rdb).Add(5*time.Millisecond)) // the close comes after the renewal
	res := write("gw-b", RouteCount{Count: 0, End: true})
	if res.Left != 0 || !res.Ended {
		t.Errorf("gw-b's last normal close: left %d, ended %v; want 0, ended (the remembered drop is no connection)", res.Left, res.Ended)
	}
	if live, err := s.Live(ctx, uid); err != nil || live {
		t.Errorf("session live %v after the last close, %v", live, err)
	}
	write("gw-a", RouteCount{Count: 0})
	if kept, err := s.rdb.HExists(ctx, s.ks.RouteStampKey(uid), "!gw-a").Result(); err != nil || kept {
		t.Errorf("gw-a wrote again: its drop still remembered %v, %v", kept, err)
	}
}
