package devstack

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/chatsim"
	"github.com/stillthere/stillthere/pkg/guide"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// guideSlack is how long past its deadline (or past the end of what held
// it up) a guide may take through the pipeline on a loaded machine: a
// sweep, a produce, a fetch, a session check and a send, and a hold for
// the grace should a heartbeat come late under load.
const guideSlack = faultGrace + 2*time.Second

// TestTwoDevicesOneGuide: a user holds two connections (a laptop and a
// phone), on two gateway instances or one. The laptop closes with 1000
// and the phone goes silent: the normal close must not end the phone's
// session, and the phone gets exactly one guide, once. A phone that keeps
// pinging gets none, and neither does a user who closes both.
func TestTwoDevicesOneGuide(t *testing.T) {
	if testing.Short() {
		t.Skip("whole pipeline, Redis Cluster")
	}
	t.Parallel()
	for _, cluster := range []bool{false, true} {
		name := "single-redis"
		if cluster {
			name = "cluster"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testTwoDevices(t, cluster)
		})
	}
}

func testTwoDevices(t *testing.T, cluster bool) {
	// Guides are pushed to gateway 0, which publishes those of users on
	// gateway 1 to it.
	p := newPipelineRig(t, pipelineOptions{Cluster: cluster, Gateways: 2, Sender: guide.SenderGateway})
	type user struct {
		uid               string
		laptopGW, phoneGW int
		phonePings        bool // the phone keeps pinging
		phoneCloses       bool // the phone closes with 1000 too
		laptop, phone     *chatsim.Conn
		low, high         time.Time // the session's deadline: the phone's, or the laptop's grant if later
	}
	users := []*user{
		{uid: "split", laptopGW: 0, phoneGW: 1},
		{uid: "split-reverse", laptopGW: 1, phoneGW: 0},
		{uid: "same-instance", laptopGW: 1, phoneGW: 1},
		{uid: "phone-pings", laptopGW: 0, phoneGW: 1, phonePings: true},
		{uid: "both-close", laptopGW: 0, phoneGW: 1, phoneCloses: true},
	}
	for _, u := range users {
		u.laptop = p.dialUser(u.uid, u.laptopGW)
		u.phone = p.dialUser(u.uid, u.phoneGW)
	}
	// Routes are written asynchronously after a connect: the laptop
	// closes once both devices' routes are in Redis, as a real laptop is
	// not closed the instant the phone connects.
	rdb, ks := p.client(), p.keyspace()
	waitCond(t, 10*time.Second, "both devices' routes", func() bool {
		for _, u := range users {
			counts, err := rdb.HGetAll(context.Background(), ks.RouteKey(u.uid)).Result()
			if err != nil {
				return false
			}
			n := 0
			for _, c := range counts {
				k, _ := strconv.Atoi(c)
				n += k
			}
			if n < 2 {
				return false
			}
		}
		return true
	})
	for _, u := range users {
		_, laptopHigh := pingConn(t, u.laptop)
		u.low, u.high = pingConn(t, u.phone)
		// A renewal never moves a deadline earlier: the session runs to
		// the later of the two grants, the laptop's when its jitter was
		// the larger, though the laptop then closes.
		u.high = later(u.high, laptopHigh)
		leave(t, u.laptop)
		if u.phoneCloses {
			leave(t, u.phone)
		}
	}

	// The phone that pings keeps at it through the other phones' wait.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, u := range users {
		if !u.phonePings {
			continue
		}
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(time.Second):
				}
				if _, _, err := tryPing(u.phone); err != nil {
					t.Errorf("%s: %v", u.uid, err)
					return
				}
			}
		})
	}
	// Until the pipeline is done with every deadline up to a TTL past
	// the last: a guide, or a second one should the silence be seen
	// twice, would be here by then.
	var last time.Time
	for _, u := range users {
		last = later(last, u.high)
	}
	p.waitDrained(last.Add(faultTTL + faultJitter))
	close(stop)
	wg.Wait()

	events := p.events()
	for _, u := range users {
		if gs := u.laptop.Guides(); len(gs) != 0 {
			t.Errorf("%s: the laptop, closed with 1000 before the deadline, got %d guides", u.uid, len(gs))
		}
		gs := u.phone.Guides()
		if u.phonePings || u.phoneCloses {
			if len(gs) != 0 || len(events[u.uid]) != 0 {
				t.Errorf("%s: %d guides, %d timeout events; want none", u.uid, len(gs), len(events[u.uid]))
			}
			continue
		}
		if len(gs) != 1 {
			t.Errorf("%s: the silent phone got %d guides, want 1; timeout events %+v", u.uid, len(gs), events[u.uid])
			continue
		}
		g := gs[0]
		d := time.UnixMilli(g.DeadlineMS)
		if d.Before(u.low.Add(-5*time.Millisecond)) || d.After(u.high.Add(5*time.Millisecond)) {
			t.Errorf("%s: guide for deadline %s, want one in [%s, %s]", u.uid,
				d.Format(time.StampMilli), u.low.Format(time.StampMilli), u.high.Format(time.StampMilli))
		}
		if want := timeoutevent.ID(u.uid, g.DeadlineMS); g.ID != want {
			t.Errorf("%s: guide id %s, want %s (uid and deadline)", u.uid, g.ID, want)
		}
		if late := g.At.Sub(u.high); late > guideSlack || g.At.Before(u.low) {
			t.Errorf("%s: guided %v past its deadline, want within [0, %v]", u.uid, late, guideSlack)
		}
		if len(events[u.uid]) != 1 {
			t.Errorf("%s: %d timeout events, want 1", u.uid, len(events[u.uid]))
		}
		t.Logf("%s: one guide on gateway %d, %v past the deadline", u.uid, u.phoneGW, g.At.Sub(u.low).Round(time.Millisecond))
	}
}

// TestLaggingConsumerGuides: the downstream fails for 10s, so the
// consumer holds every guide, and meanwhile users who went silent come
// back. Three kinds of user:
//
//   - come back (ping after their deadline), then leave with 1000: no
//     guide, not now and not from the inbox on the next connect;
//   - come back, then go silent again: exactly one guide, for the second
//     silence (possibly at the end of its minute: the first silence's
//     guide may have gone out, as far as the listener knows);
//   - stay silent: exactly one guide, once the downstream is back.
//
// Once with the webhook (503s), where the consumer's session check is
// all that stands between a stale guide and the user, and once with the
// gateway's push endpoint (its path cut), where guides reach connections
// and inboxes.
func TestLaggingConsumerGuides(t *testing.T) {
	if testing.Short() {
		t.Skip("whole pipeline, a 10s downstream outage and up to a minute window")
	}
	t.Parallel()
	for _, sender := range []string{guide.SenderWebhook, guide.SenderGateway} {
		t.Run(sender, func(t *testing.T) {
			t.Parallel()
			testLaggingConsumer(t, sender)
		})
	}
}

// Kinds of user in the lagging-consumer test.
const (
	lagLeaves = "back-then-leave"
	lagAgain  = "back-then-silent"
	lagSilent = "silent"
)

const lagOutage = 10 * time.Second

// shown is a guide a user saw.
type shown struct {
	id           string
	deadline, at time.Time
}

func (g shown) String() string {
	return fmt.Sprintf("guide %s for deadline %s at %s", g.id, g.deadline.Format(time.StampMilli), g.at.Format(time.StampMilli))
}

func testLaggingConsumer(t *testing.T, sender string) {
	p := newPipelineRig(t, pipelineOptions{Gateways: 1, Sender: sender})
	type user struct {
		uid, kind string
		conn      *chatsim.Conn
		low, high time.Time // the first silence's deadline
		// back is when the comeback's pong arrived; low2, high2 bound
		// the second silence's deadline.
		back, low2, high2 time.Time
	}
	var users []*user
	for _, kind := range []string{lagLeaves, lagAgain, lagSilent} {
		for i := range 4 {
			u := &user{uid: fmt.Sprintf("%s-%d", kind, i), kind: kind}
			u.conn = p.dialUser(u.uid, 0)
			users = append(users, u)
		}
	}
	// Both silences of a user fall in one minute (the second comes some
	// 5s after the first): the case where the first one's dedup key
	// meets the second.
	if s := time.Since(time.Now().Truncate(time.Minute)); s > 45*time.Second {
		p.waitRedisPast(time.Now().Truncate(time.Minute).Add(time.Minute))
	}
	heal := p.failDownstream()
	failedAt := time.Now()
	healed := false
	defer func() {
		if !healed {
			heal()
		}
	}()
	for _, u := range users {
		u.low, u.high = pingConn(t, u.conn)
	}

	// Every first silence reaches the topic before anyone comes back:
	// the listener did its part, and the guides wait on the consumer.
	missing := 0
	if !waitFor(lagOutage/2, func() bool {
		evs := p.events()
		missing = 0
		for _, u := range users {
			if len(evs[u.uid]) == 0 {
				missing++
			}
		}
		return missing == 0
	}) {
		t.Fatalf("%d users' timeouts not on the topic %v after their pings", missing, time.Since(failedAt))
	}
	if p.front != nil {
		// Whether the consumer tried them (answered 503) or its open
		// breaker holds them unsent, the guides wait on the consumer.
		tried := 0
		for _, u := range users {
			if p.front.refusals(u.uid) > 0 {
				tried++
			}
		}
		t.Logf("%d of %d users' guides refused by the failing webhook before anyone came back; the open breaker holds the rest", tried, len(users))
	}
	for _, u := range users {
		if u.kind == lagSilent {
			continue
		}
		if time.Now().Before(u.high) {
			t.Fatalf("%s: its timeout is on the topic before its deadline", u.uid)
		}
		u.low2, u.high2 = pingConn(t, u.conn)
		u.back = time.Now()
		if u.kind == lagLeaves {
			leave(t, u.conn)
		}
	}
	// The test needs them back while the outage lasts: on a starved host
	// bringing them back takes most of it, and it then lasts a second
	// past the last one.
	healAt := failedAt.Add(lagOutage)
	if back := time.Now().Add(time.Second); back.After(healAt) {
		t.Logf("users came back %v into the outage (a slow host): it lasts until a second after", time.Since(failedAt))
		healAt = back
	}
	time.Sleep(time.Until(healAt)) // real time: the outage lasts this long
	heal()
	healed = true
	healedAt := time.Now()

	// guides returns what u saw: at the webhook, or on its connection.
	guides := func(u *user) []shown {
		var out []shown
		if sender == guide.SenderWebhook {
			for _, g := range p.hook.Guides(u.uid) {
				out = append(out, shown{g.ID, g.Deadline, g.At})
			}
			return out
		}
		for _, g := range u.conn.Guides() {
			out = append(out, shown{g.ID, time.UnixMilli(g.DeadlineMS), g.At})
		}
		return out
	}
	// Wait for each expected guide: the second silence's may wait for
	// the end of its minute.
	waitUntil := healedAt.Add(guideSlack)
	lastDeadline := time.Time{}
	for _, u := range users {
		lastDeadline = later(lastDeadline, later(u.high, u.high2))
		if u.kind == lagAgain {
			waitUntil = later(waitUntil, later(u.high2, session.DedupWindowEnd(u.high)).Add(guideSlack))
		}
	}
	waitFor(time.Until(waitUntil), func() bool {
		for _, u := range users {
			if u.kind != lagLeaves && len(guides(u)) == 0 {
				return false
			}
		}
		return true
	})
	// Room for a guide too many: a stale one goes out as soon as the
	// downstream is back, a second one a pipeline's time after the
	// first. Once the pipeline is done with every deadline of the test
	// (the refused guides retried and settled), none is still to come.
	p.waitDrained(later(lastDeadline, healedAt))

	if sender == guide.SenderGateway {
		// Those who left find no guide kept for them on their next
		// connect: their silence was over before it could go out.
		for _, u := range users {
			if u.kind != lagLeaves {
				continue
			}
			c := p.dialUser(u.uid, 0)
			// A kept guide's first chunk is queued on the connection
			// before the server reads its first frame: it comes before
			// the pong.
			pingConn(t, c)
			if gs := c.Guides(); len(gs) != 0 {
				t.Errorf("%s: came back, left with 1000, and on its next connect got %d guides: %v", u.uid, len(gs), gs)
			}
			leave(t, c)
		}
	}

	deferred := 0
	for _, u := range users {
		gs := guides(u)
		switch u.kind {
		case lagLeaves:
			if len(gs) != 0 {
				t.Errorf("%s: came back at %s and left, got %d guides: %v", u.uid, u.back.Format(time.StampMilli), len(gs), gs)
			}
			continue
		}
		if len(gs) != 1 {
			t.Errorf("%s: got %d guides, want exactly 1: %v", u.uid, len(gs), gs)
			continue
		}
		g := gs[0]
		low, high := u.low, u.high
		if u.kind == lagAgain {
			low, high = u.low2, u.high2
		}
		if g.deadline.Before(low.Add(-5*time.Millisecond)) || g.deadline.After(high.Add(5*time.Millisecond)) {
			t.Errorf("%s: guide for deadline %s, want one in [%s, %s] (the %s silence)", u.uid,
				g.deadline.Format(time.StampMilli), low.Format(time.StampMilli), high.Format(time.StampMilli),
				map[bool]string{true: "second", false: "only"}[u.kind == lagAgain])
		}
		if want := timeoutevent.ID(u.uid, g.deadline.UnixMilli()); g.id != want {
			t.Errorf("%s: guide id %s, want %s", u.uid, g.id, want)
		}
		bound := later(healedAt, high).Add(guideSlack)
		if u.kind == lagAgain {
			if session.DedupWindow(high) != session.DedupWindow(u.high) {
				t.Errorf("%s: its silences fell in two minutes; the test means them to share one", u.uid)
			}
			bound = later(bound, session.DedupWindowEnd(high).Add(guideSlack))
			if !g.at.Before(session.DedupWindowEnd(high)) {
				deferred++
			}
		}
		if g.at.After(bound) {
			t.Errorf("%s: guided at %s, %v past its bound", u.uid, g.at.Format(time.StampMilli), g.at.Sub(bound))
		}
	}
	if p.front != nil {
		ids, extra := p.front.resent()
		t.Logf("webhook: %d ids sent more than once (%d extra sends, deduped by the receiver)", ids, extra)
	}
	t.Logf("downstream failed %v; %d second silences deferred to their minute's end", lagOutage, deferred)
}
