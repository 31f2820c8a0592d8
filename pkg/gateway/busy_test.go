package gateway

import (
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
)

// A busy Redis is not an unreachable one. Under load its round trips take
// seconds, yet each is answered: the gateway records the renewals it held
// up (the listener holds their users), but it neither closes every
// connection nor writes every session again, which would only add to the
// load that made it slow.

// TestCutOff: since when Redis is out of reach, by what answered, and
// when a gateway sheds for it.
func TestCutOff(t *testing.T) {
	now := time.Now()
	ago := func(d time.Duration) time.Time { return now.Add(-d) }
	var never time.Time
	const shedAfter = 15 * time.Second
	for _, tc := range []struct {
		name                          string
		flushFail, answered, beatFail time.Time
		want                          time.Time
		shed                          bool
	}{
		{"all well", never, ago(time.Second), never, never, false},
		{"renewals fail, none answered since", ago(20 * time.Second), ago(21 * time.Second), never, ago(20 * time.Second), true},
		{"renewals fail, never answered", ago(20 * time.Second), never, never, ago(20 * time.Second), true},
		{"renewals fail, not for shed-after yet", ago(5 * time.Second), ago(6 * time.Second), never, ago(5 * time.Second), false},
		// A round trip in flight holds renewals queued 20s ago behind a
		// busy Redis, which answered the one before it just now.
		{"renewals held up in the queue, Redis answering", ago(20 * time.Second), ago(300 * time.Millisecond), never, ago(300 * time.Millisecond), false},
		{"heartbeats fail", never, ago(time.Second), ago(16 * time.Second), ago(16 * time.Second), true},
		{"heartbeats fail, renewals held up but answered", ago(30 * time.Second), ago(time.Second), ago(16 * time.Second), ago(16 * time.Second), true},
		{"both fail, renewals first", ago(18 * time.Second), ago(19 * time.Second), ago(16 * time.Second), ago(18 * time.Second), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := cutOff(tc.flushFail, tc.answered, tc.beatFail)
			if !got.Equal(tc.want) {
				t.Errorf("cutOff = %v, want %v", got, tc.want)
			}
			if shed := shedDue(got, now, shedAfter); shed != tc.shed {
				t.Errorf("shedDue after %v = %v, want %v", now.Sub(got), shed, tc.shed)
			}
		})
	}
	if shedDue(ago(time.Hour), now, 0) {
		t.Error("shed with shed-after 0 (never)")
	}
}

// TestLateRoundTripsAreNoCutOff: renewals queued long ago wait in a round
// trip in flight behind a busy Redis, which answered the round trip
// before. They are held up, for the listener and readyz, but Redis is not
// out of reach; and once their round trip is answered, late, an outage is
// owed a record, not a resync.
func TestLateRoundTripsAreNoCutOff(t *testing.T) {
	queued := time.Now().Add(-20 * time.Second)
	inFlight := queued
	r := newReach(2*time.Millisecond, slowFlush, func() time.Time { return inFlight })
	r.flushed(2*time.Second, nil) // the round trip before: late, answered
	if !r.watch() {
		t.Fatal("renewals held 20s by a round trip in flight: not seen")
	}
	if r.err() == nil {
		t.Error("renewals held 20s, and readyz reports them fine")
	}
	if since := r.cutOffSince(); shedDue(since, time.Now(), 15*time.Second) {
		t.Errorf("Redis answered a round trip just now, and is counted out of reach since %v (%v ago): the gateway would shed",
			since, time.Since(since).Round(time.Millisecond))
	}
	inFlight = time.Time{}
	r.flushed(3*time.Second, nil)
	if n := r.failureCount(); n != 0 {
		t.Errorf("late round trips counted as %d failures: each is a resync of every connection", n)
	}
	if r.unrecorded().IsZero() {
		t.Error("renewals held up for 20s, and no record of it is owed")
	}
}

// TestBusyRedisNeitherShedsNorResyncs: Redis stops for a little over a
// second, again and again (as one starved of CPU by a burst does), while
// clients ping. Every round trip is answered, late; heartbeats land within
// their lease. For several times shed-after the gateway keeps every
// client, records the held-up renewals as an outage, and resyncs nobody.
func TestBusyRedisNeitherShedsNorResyncs(t *testing.T) {
	if testing.Short() {
		t.Skip("some 10s of a stalling Redis")
	}
	srv := redistest.Start(t)
	var logs lockedBuffer
	const shedAfter = 3 * time.Second
	tg := startGatewayLogged(t, []string{srv.Addr}, redistest.Prefix(t), slog.New(slog.NewTextHandler(&logs, nil)),
		func(c *Config) {
			c.ShedAfter = shedAfter
			// The default's: a lease of 3s, and round trips over 1s
			// count as an outage (see stallAfter).
			c.HeartbeatInterval = DefaultConfig().HeartbeatInterval
			// The default's too: the pongs a stall held up are queued at
			// once when it ends, and a starved machine writes them late;
			// the test's 8 cut off clients that ping this often.
			c.SendQueue = DefaultConfig().SendQueue
		})
	direct := redistest.Client(t, srv)

	const clients = 20
	conns := make([]*websocket.Conn, clients)
	for i := range conns {
		conns[i] = tg.dial(t, fmt.Sprintf("busy-%d", i))
		pingPong(t, conns[i])
	}
	// Each connection's end, as its reader sees it.
	ended := make(chan string, clients)
	var wg sync.WaitGroup
	for i, ws := range conns {
		wg.Go(func() {
			for {
				ws.SetReadDeadline(time.Now().Add(time.Minute))
				if _, _, err := ws.ReadMessage(); err != nil {
					ended <- fmt.Sprintf("busy-%d: %v", i, err)
					return
				}
			}
		})
	}
	stop := make(chan struct{})
	wg.Go(func() {
		tk := time.NewTicker(300 * time.Millisecond) // far more often than any client, still
		defer tk.Stop()
		for {
			for _, ws := range conns {
				ws.SetWriteDeadline(time.Now().Add(time.Second))
				ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"ping"}`))
			}
			select {
			case <-stop:
				return
			case <-tk.C:
			}
		}
	})
	defer func() {
		close(stop)
		for _, ws := range conns {
			ws.Close()
		}
		wg.Wait()
	}()

	failures := tg.reach.failureCount()
	resyncs := strings.Count(logs.String(), `msg="resynced sessions"`)
	// Real time must pass: the stalls are what a busy Redis does, each
	// longer than a round trip may take before it counts as an outage
	// (slowFlush) and well inside a heartbeat's lease, and the whole lasts
	// several times shed-after.
	start := time.Now()
	for time.Since(start) < 3*shedAfter {
		srv.Pause()
		time.Sleep(slowFlush + 200*time.Millisecond)
		srv.Resume()
		time.Sleep(300 * time.Millisecond)
	}
	waitUntil(t, "Redis to answer again", func() bool { return direct.Ping(t.Context()).Err() == nil })
	waitUntil(t, "the held-up renewals recorded", func() bool { return len(renewalGaps(t, direct, tg)) > 0 })

	if strings.Contains(logs.String(), `msg="heartbeat failing"`) {
		t.Skipf("a heartbeat failed (this machine is slower than a 1.2s stall allows): the test says nothing; logs:\n%s", logs.String())
	}
	select {
	case e := <-ended:
		t.Errorf("Redis answered every round trip, late, and the gateway ended a connection (%s)", e)
	default:
	}
	if n := tg.reach.failureCount() - failures; n != 0 {
		t.Errorf("late round trips counted as %d failures", n)
	}
	if n := strings.Count(logs.String(), `msg="resynced sessions"`) - resyncs; n != 0 {
		t.Errorf("%d resyncs of every connection while Redis answered every round trip: each adds the load of every session to a busy Redis", n)
	}
	if t.Failed() {
		t.Logf("logs:\n%s", logs.String())
	}
}
