package session

import (
	"slices"
	"testing"
	"time"
)

// TestDroppedRouteStillHolds: "a user is present while any of their
// devices pings". A gateway judged dead (its heartbeat lapsed: a cut from
// Redis, while its clients still ping it) has its route entries dropped by
// the others' writes, or by a delivery. The hold rules must still count it
// among the user's instances, or a user whose deadline is another
// instance's grant (an idle laptop) is guided while their phone pings the
// cut-off one. The dropped entry is listed with the routes until the
// instance writes again, or for twice the route TTL.
func TestDroppedRouteStillHolds(t *testing.T) {
	s, ctx := newStore(t)
	const ttl = time.Hour
	write := func(inst, uid string, n int, dead ...DeadInstance) {
		t.Helper()
		if res := s.WriteRoutes(ctx, inst, []RouteCount{{UID: uid, Count: n}}, ttl, dead)[0]; res.Err != nil {
			t.Fatal(res.Err)
		}
	}
	routes := func(uid string) []string {
		t.Helper()
		e := dueOne(t, s, uid, 2*time.Second, sweepAll(s))
		slices.Sort(e.Routes)
		return e.Routes
	}
	lapse := func(uid string) {
		t.Helper()
		deadline, err := s.Renew(ctx, uid, DefaultSegment, 50*time.Millisecond, ClockPresence)
		if err != nil {
			t.Fatal(err)
		}
		redisPast(t, s.rdb, deadline)
	}

	// By another instance's route write.
	write("gw-a", "phone-and-laptop", 1)
	write("gw-b", "phone-and-laptop", 1)
	cut := redisNow(t, s.rdb)
	write("gw-b", "phone-and-laptop", 1, DeadInstance{Name: "gw-a", Cut: cut})
	lapse("phone-and-laptop")
	if got, want := routes("phone-and-laptop"), []string{"gw-a", "gw-b"}; !slices.Equal(got, want) {
		t.Errorf("after gw-b dropped dead gw-a's entry: routes %v, want %v", got, want)
	}
	if n, err := s.rdb.HLen(ctx, s.ks.RouteKey("phone-and-laptop")).Result(); err != nil || n != 1 {
		t.Errorf("route entries after the drop: %d, %v; want gw-b's alone (deliveries go to live instances)", n, err)
	}
	// gw-a is back and writes its entry: one entry of it, not two.
	write("gw-a", "phone-and-laptop", 1)
	if got, want := routes("phone-and-laptop"), []string{"gw-a", "gw-b"}; !slices.Equal(got, want) {
		t.Errorf("after gw-a wrote again: routes %v, want %v", got, want)
	}
	// gw-a's last connection of the user closes: it is no route of theirs.
	write("gw-a", "phone-and-laptop", 0)
	if got, want := routes("phone-and-laptop"), []string{"gw-b"}; !slices.Equal(got, want) {
		t.Errorf("after gw-a's last connection closed: routes %v, want %v", got, want)
	}

	// By a delivery's drop.
	write("gw-a", "delivered", 1)
	if _, _, err := s.DropDeadRoutes(ctx, "delivered", []DeadInstance{{Name: "gw-a", Cut: redisNow(t, s.rdb)}}); err != nil {
		t.Fatal(err)
	}
	lapse("delivered")
	if got, want := routes("delivered"), []string{"gw-a"}; !slices.Equal(got, want) {
		t.Errorf("after a delivery dropped dead gw-a's entry: routes %v, want %v", got, want)
	}

	// Forgotten by a write once older than twice the route TTL.
	write("gw-a", "old", 1)
	write("gw-b", "old", 1, DeadInstance{Name: "gw-a", Cut: redisNow(t, s.rdb)})
	shortTTL := 20 * time.Millisecond
	redisPast(t, s.rdb, redisNow(t, s.rdb).Add(3*shortTTL))
	if res := s.WriteRoutes(ctx, "gw-b", []RouteCount{{UID: "old", Count: 1}}, shortTTL, nil)[0]; res.Err != nil {
		t.Fatal(res.Err)
	}
	if kept, err := s.rdb.HExists(ctx, s.ks.RouteStampKey("old"), "!gw-a").Result(); err != nil || kept {
		t.Errorf("a drop older than twice the route TTL: still remembered %v, %v", kept, err)
	}
}
