package expiry

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/gateway"
	"github.com/stillthere/stillthere/pkg/push"
)

// TestAttackR5LapsedRestoreOfDroppedTooOld: a user's connection drops
// while their gateway is cut off from Redis, and Redis restarts empty
// meanwhile. Their grant ran out in the outage: the gateway keeps it (a
// dropped grant) and its resync restores it, lapsed, at its own deadline,
// which is by then older than the outage. The listener holds it for the
// grace and produces it; the consumer judges its age from when it was
// detected ("so that a long outage does not age out the guides it only
// delayed", guide.needless) and pushes it. The user has no connection, so
// the gateway keeps it in their inbox, for GUIDE_MAX_AGE from deadline_ms
// (stage 1): a deadline older than that is answered too_old and kept
// nowhere. Restored just past now, as before the fix, its deadline_ms was
// the resync's and it was kept. The silence's one guide is lost.
//
// The guide max age here is 4 s (the grace 3 s, the TTL 2 s); the
// outage lasts 2 s past the deadline. In production (5 min, grace 75 s)
// the same holds for an outage of about four minutes past the deadline.
func TestAttackR5LapsedRestoreOfDroppedTooOld(t *testing.T) {
	h := newHarness(t)
	const (
		ttl    = 2 * time.Second
		maxAge = 4 * time.Second // the gateway's and the consumer's STILLTHERE_GUIDE_MAX_AGE
	)
	pa := h.redisProxy()
	gw := h.startAttackGateway(pa.Addr(), ttl, func(c *gateway.Config) { c.GuideMaxAge = maxAge })
	stop := h.start(h.config(ModeSweep))
	defer stop()

	const uid = "dropped-in-outage"
	dev := startPinger(t, gw, uid, 0)
	waitPongs(t, 1, dev)
	d0 := h.redisNow().Add(ttl) // its deadline, a moment late

	pa.Cut()
	// The device's connection drops (no close frame): the gateway keeps
	// its grant for a resync.
	dev.ws.UnderlyingConn().Close()
	<-dev.read
	// Redis restarts empty while the gateway is cut off, after the
	// deadline; the listener records the data loss.
	h.untilRedis(d0.Add(200 * time.Millisecond))
	ctx := context.Background()
	if err := h.rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	blind := h.store.Keyspace().BlindKey()
	waitFor(t, waitLong, "the listener to record the data loss", func() bool {
		n, err := h.rdb.ZCard(ctx, blind).Result()
		return err == nil && n > 0
	})
	// The outage lasts 2 s past the deadline.
	h.untilRedis(d0.Add(2 * time.Second))
	pa.Restore()

	waitFor(t, waitLong, "the guide of the lapsed grant", func() bool { return len(byUID(h.events())[uid]) > 0 })
	ev := byUID(h.events())[uid][0]
	if dl := time.UnixMilli(ev.DeadlineMS); dl.Sub(d0).Abs() > 500*time.Millisecond {
		t.Fatalf("guide names deadline %v, want the grant's own, about %v: not the lapsed restore this test is about", dl, d0)
	}

	// The consumer: the event is not needless (guide.needless).
	checks, errs := h.store.CheckMany(ctx, []string{uid})
	if errs[0] != nil {
		t.Fatal(errs[0])
	}
	c := checks[0]
	confirmed := time.UnixMilli(max(ev.DeadlineMS, ev.DetectedMS, ev.DueMS))
	if c.Now.Sub(confirmed) > maxAge || c.Live || c.Renewed.After(ev.Deadline()) {
		t.Fatalf("the consumer would not push it (confirmed %v before, live %v, renewed %v): the case tells nothing",
			c.Now.Sub(confirmed), c.Live, c.Renewed)
	}
	// As the consumer builds it (guide.Consumer, with detected_ms).
	req := push.Request{ID: ev.ID, UID: ev.UID, Segment: ev.Segment, Text: "Are you still there?", DeadlineMS: ev.DeadlineMS,
		DueMS: ev.DueMS, DetectedMS: ev.DetectedMS, Stage: ev.Stage, Action: ev.Action, Final: ev.Final, Reason: ev.Reason}
	client := push.NewClient("http://"+gw.PushAddr().String()+push.Path, attackPushSecret, &http.Client{Timeout: 10 * time.Second})
	var res push.Response
	waitFor(t, waitLong, "the gateway to settle the push", func() bool {
		var err error
		res, err = client.Push(ctx, req)
		return err == nil
	})
	if res.Status != push.Queued {
		t.Errorf("push of the lapsed grant's guide (deadline %v before Redis's now, detected %v before): %q, want %q: the user's one guide for a silence that fell in the outage is kept nowhere",
			c.Now.Sub(ev.Deadline()).Round(time.Millisecond), c.Now.Sub(time.UnixMilli(ev.DetectedMS)).Round(time.Millisecond), res.Status, push.Queued)
	}
}
