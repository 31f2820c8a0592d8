package expiry

import (
	"context"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/stillthere/stillthere/pkg/policy"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/tcpproxy"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// TestAttackPingInOutageBetweenStages: "a ping cancels the remaining
// stages", "never sent to a user who came back in between". A user gets
// the reminder, then pings while their gateway cannot reach Redis (a
// short cut, as a network blip or a cluster slot moving for longer than
// renewals are retried). Once Redis is back the gateway resyncs the
// grant of that ping, and the user is quiet again for a little while.
// Their ping started a new silence: its deadline is the ping's, and no
// close of the old silence may follow. The resync takes the index
// entry's score (the close stage's due time) for a deadline already
// written and writes nothing, so the close of the old silence is
// produced at its time, seconds after the user pinged.
func TestAttackPingInOutageBetweenStages(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	const (
		ttl        = 3 * time.Second
		closeAfter = 4 * time.Second
	)
	p := policy.Policy{
		DefaultTTL: ttl,
		SegmentStages: map[string][]policy.Stage{
			"default": {
				{Action: timeoutevent.ActionRemind},
				{After: closeAfter, Action: timeoutevent.ActionClose, Text: "We closed this chat."},
			},
		},
	}
	h.savePolicy(p)
	cfg := h.config(ModeSweep)
	cfg.OutageGrace = time.Second
	proxy, err := tcpproxy.Start(h.srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	gw := h.startAttackGateway(proxy.Addr(), ttl, nil)
	stop := h.start(cfg)
	defer stop()

	user := startPinger(t, gw, "rosa", 0) // one ping, then quiet
	// The listener moves the index entry on to the close stage when it
	// detects the reminder. Redis shows that in a millisecond; the topic,
	// read by a new client each look, can take seconds on a busy host,
	// and the ping must come before the close is due, 4 s after.
	ctx := context.Background()
	ks := h.store.Keyspace()
	waitFor(t, waitLong, "the reminder's stage move", func() bool {
		return h.rdb.HExists(ctx, ks.StageKey(session.Bucket("rosa")), "rosa").Val()
	})

	// The gateway's path to Redis breaks; the user answers the reminder
	// with a ping, which the gateway cannot write now.
	// The cut closes the gateway's connections at once, and every new one.
	proxy.Cut()
	user.ws.SetWriteDeadline(time.Now().Add(time.Second))
	if err := user.ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"ping"}`)); err != nil {
		t.Fatal(err)
	}
	pinged := h.redisNow()
	// Real time must pass: the cut lasts a while after the ping.
	time.Sleep(1800 * time.Millisecond)
	proxy.Restore() // the gateway resyncs the ping's grant
	waitFor(t, waitLong, "the reminder", func() bool { return len(byUID(h.events())["rosa"]) >= 1 })
	reminder := byUID(h.events())["rosa"][0]
	if reminder.Stage != 1 || pinged.Sub(time.UnixMilli(reminder.DetectedMS)) >= closeAfter {
		t.Fatalf("first event %+v, pinged at %v: the test's ping must follow the reminder and come before the close is due", reminder, pinged)
	}

	// Past the old silence's close, held or not, and a sweep after it.
	closeDue := time.UnixMilli(reminder.DetectedMS).Add(closeAfter)
	h.sweptPast(closeDue.Add(cfg.OutageGrace + time.Second))
	// The silence the ping began is owed its own reminder: by its time
	// if the resync came before its grant ran out, or after the grace
	// if the grant ran out in the outage (a host so busy the resync came
	// late: its ping is newer than the old silence, so the resync
	// restores the new one all the same); in the same minute window as
	// the old silence's reminder, deferred to the window's end.
	newReminders := func() map[string]bool {
		ids := map[string]bool{}
		for _, ev := range byUID(h.events())["rosa"] {
			if ev.DeadlineMS != reminder.DeadlineMS && ev.Stage == 1 {
				ids[ev.ID] = true
			}
		}
		return ids
	}
	waitFor(t, time.Until(session.DedupWindowEnd(time.Now()))+waitLong, "the reminder of the silence the ping began", func() bool { return len(newReminders()) > 0 })
	stop()
	for _, ev := range byUID(h.events())["rosa"] {
		if ev.DeadlineMS == reminder.DeadlineMS && ev.Stage > 1 {
			t.Errorf("the user pinged %v after the reminder (their gateway resynced the ping once Redis was back), yet the old silence's stage %d (%s, final %v) was produced %v after that ping",
				pinged.Sub(time.UnixMilli(reminder.DetectedMS)).Round(time.Millisecond), ev.Stage, ev.Action, ev.Final,
				time.UnixMilli(ev.DetectedMS).Sub(pinged).Round(time.Millisecond))
		}
	}
	if n := len(newReminders()); n != 1 {
		t.Errorf("%d reminders of the silence the ping began, want 1", n)
	}
}
