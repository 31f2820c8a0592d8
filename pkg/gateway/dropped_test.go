package gateway

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
	"github.com/stillthere/stillthere/pkg/session"
)

// TestResyncAfterQuietDataLoss: Redis loses its data so quickly that no
// renewal or heartbeat fails (a restart without persistence within a
// heartbeat). The next heartbeat finds the instance unknown to Redis, and
// the gateway writes every session back: that of a connected user who has
// gone quiet, and that of a user whose connection dropped while their
// grant runs. A user who closed normally is not restored.
func TestResyncAfterQuietDataLoss(t *testing.T) {
	srv := redistest.Start(t)
	var logs lockedBuffer
	tg := startGatewayLogged(t, []string{srv.Addr}, redistest.Prefix(t), slog.New(slog.NewTextHandler(&logs, nil)),
		func(c *Config) { c.HeartbeatInterval = 200 * time.Millisecond })
	ctx := context.Background()
	ks := tg.store.Keyspace()
	direct := redistest.Client(t, srv)

	quiet := tg.dial(t, "quiet")
	pingPong(t, quiet)
	dropping := tg.dial(t, "dropping")
	pingPong(t, dropping)
	dropping.UnderlyingConn().Close() // no close frame: an abnormal end
	leaving := tg.dial(t, "leaving")
	pingPong(t, leaving)
	leaving.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
	leaving.ReadMessage() // the gateway's close frame, then EOF
	waitUntil(t, "the normal close to end the session", func() bool {
		_, err := direct.ZScore(ctx, ks.IndexKey(session.Bucket("leaving")), "leaving").Result()
		return err != nil
	})
	deadline := func(uid string) (float64, error) {
		return direct.ZScore(ctx, ks.IndexKey(session.Bucket(uid)), uid).Result()
	}
	before := map[string]float64{}
	for _, uid := range []string{"quiet", "dropping"} {
		d, err := deadline(uid)
		if err != nil {
			t.Fatalf("%s has no deadline before the loss: %v", uid, err)
		}
		before[uid] = d
	}
	waitUntil(t, "the dropped connection to be released", func() bool { return len(tg.hub.lookup("dropping")) == 0 })
	// A resync before the loss (a slow first heartbeat's) must not pass
	// for the one after it.
	resyncs := strings.Count(logs.String(), `msg="resynced sessions"`)
	if err := direct.FlushAll(ctx).Err(); err != nil { // Redis restarted empty
		t.Fatal(err)
	}
	waitUntil(t, "a resync after the loss", func() bool {
		return strings.Count(logs.String(), `msg="resynced sessions"`) > resyncs
	})
	for uid, was := range before {
		after, err := deadline(uid)
		if err != nil {
			t.Errorf("%s's deadline not restored: %v", uid, err)
			continue
		}
		// The gateway times a grant from the ping's arrival, Redis from
		// the renewal's landing, later by its queueing and round trip: up
		// to slowFlush, past which it counts as an outage. A busy machine
		// makes that more than a few ms.
		if d := after - was; d < -float64(slowFlush.Milliseconds()) || d > 50 {
			t.Errorf("%s's deadline restored as %v, was %v", uid, after, was)
		}
	}
	if d, err := deadline("leaving"); err == nil {
		t.Errorf("the user who closed normally got a deadline back: %v", d)
	}
}

// TestDroppedGrants: the dropped grants keep each user's latest, give a
// resync what is left of them, forget each once it runs out, and hold at
// most max, losing first the one that runs out first.
func TestDroppedGrants(t *testing.T) {
	s := time.Second
	drop := func(d *dropped, uid string, at, ttl time.Duration) {
		c := &conn{uid: uid, segment: "default"}
		c.grant.Store(int64(ttl))
		c.pingAt.Store(int64(at))
		d.add(c)
	}
	uids := func(gs []session.Grant) map[string]time.Duration {
		out := map[string]time.Duration{}
		for _, g := range gs {
			out[g.UID] = g.Left
		}
		return out
	}
	d := newDropped(time.Now(), 3, 0)
	drop(d, "ann", 0, 10*s)  // ends at 10s
	drop(d, "bob", 0, 5*s)   // ends at 5s
	drop(d, "ann", 1*s, 5*s) // ends at 6s: earlier, the later stays
	drop(d, "bob", 2*s, 6*s) // ends at 8s: later, replaces
	if got := uids(d.left(4*s, 4*s)); len(got) != 2 || got["ann"] != 6*s || got["bob"] != 4*s {
		t.Fatalf("left at 4s: %v, want ann 6s and bob 4s", got)
	}
	d.mu.Lock()
	d.forget(9 * s) // bob's ended at 8s
	n := len(d.grants)
	d.mu.Unlock()
	if n != 1 {
		t.Fatalf("%d grants held at 8s, want ann's alone", n)
	}
	drop(d, "cid", 8*s, 10*s)  // ends at 18s
	drop(d, "dee", 8*s, 4*s)   // ends at 12s
	drop(d, "eve", 8*s, 20*s)  // ends at 28s: full, ann's (10s) goes
	drop(d, "fay", 8*s, 1*s)   // ends at 9s: runs out first itself, not kept
	drop(d, "gus", 8*s, -30*s) // a failed renewal's grant counts as granted: ends at 38s, dee's goes
	if got := uids(d.left(9*s, 9*s)); len(got) != 3 || got["cid"] != 9*s || got["eve"] != 19*s || got["gus"] != 29*s {
		t.Fatalf("left at 9s, full: %v, want cid, eve and gus", got)
	}
	if got := d.left(40*s, 40*s); len(got) != 0 || len(d.byEnd) != 0 {
		t.Fatalf("left at 40s: %v, heap %d: every grant ran out", got, len(d.byEnd))
	}

	// After an outage that began at 4s, those that ran out since are kept,
	// with nothing left.
	d = newDropped(time.Now(), 3, 0)
	drop(d, "hal", 0, 3*s) // ends at 3s, before the outage
	drop(d, "ivy", 0, 5*s) // ends at 5s, in it
	drop(d, "jon", 8*s, 4*s)
	if got := uids(d.left(10*s, 4*s)); len(got) != 2 || got["ivy"] != -5*s || got["jon"] != 2*s {
		t.Fatalf("left at 10s after an outage from 4s: %v, want ivy lapsed 5s ago and jon 2s", got)
	}
	if got := uids(d.left(10*s, 6*s)); len(got) != 1 || got["jon"] != 2*s {
		t.Fatalf("left at 10s after an outage from 6s: %v, want jon alone", got)
	}
}
