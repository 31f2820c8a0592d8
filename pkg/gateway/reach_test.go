package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/redis/go-redis/v9"

	"github.com/stillthere/stillthere/pkg/policy"
	"github.com/stillthere/stillthere/pkg/redisserver"
	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/tcpproxy"
)

// The outage tests put the gateway behind a TCP proxy. A paused
// redis-server would not do: the commands the gateway gave up on wait in
// its socket and run when it resumes, renewing from then.

// TestResyncAfterRenewalOutage cuts the gateway off Redis while clients
// ping, then restores it: the outage is recorded as a blind interval of
// the instance, and every connection's last grant is written again, as far
// as it is left.
func TestResyncAfterRenewalOutage(t *testing.T) {
	for _, tc := range []struct {
		name   string
		ttl    time.Duration
		cutOff func(*tcpproxy.Proxy)
		slow   bool
	}{
		// Redis down: every round trip fails within a second (the
		// client's retries).
		{"redis down", 5 * time.Second, (*tcpproxy.Proxy).Cut, false},
		// A partition: every round trip hangs until its read timeout
		// (3s).
		{"partition", 10 * time.Second, (*tcpproxy.Proxy).Blackhole, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.slow && testing.Short() {
				t.Skip("some 20s of timeouts")
			}
			testResync(t, tc.ttl, tc.cutOff)
		})
	}
}

func testResync(t *testing.T, ttl time.Duration, cutOff func(*tcpproxy.Proxy)) {
	srv := redistest.Start(t)
	proxy, err := tcpproxy.Start(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	var logs lockedBuffer
	prefix := redistest.Prefix(t)
	tg := startGatewayLogged(t, []string{proxy.Addr()}, prefix, slog.New(slog.NewTextHandler(&logs, nil)), nil)
	ctx := context.Background()
	ks := tg.store.Keyspace()
	direct := redistest.Client(t, srv) // the test's own view of Redis, never cut off
	score := func(uid string) time.Time {
		t.Helper()
		ms, err := direct.ZScore(ctx, ks.IndexKey(session.Bucket(uid)), uid).Result()
		if err != nil {
			t.Fatalf("deadline of %s: %v", uid, err)
		}
		return time.UnixMilli(int64(ms))
	}

	// Exact grants: ttl for everyone, 1s for the "short" segment.
	err = policy.NewStore(direct, ks).Save(ctx, policy.Policy{DefaultTTL: ttl, Segments: map[string]time.Duration{"short": time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the policy is in force", func() bool { return tg.policy.Current().TTL("short") == time.Second })

	stale := tg.dialSegment(t, "stale", "short")
	pingPong(t, stale)
	staleDeadline := score("stale")
	alice := tg.dial(t, "alice")
	pingPong(t, alice)
	carol := tg.dial(t, "carol")
	var quiet []*websocket.Conn
	for _, uid := range []string{"q1", "q2", "q3", "q4", "q5"} {
		ws := tg.dial(t, uid)
		pingPong(t, ws)
		quiet = append(quiet, ws)
	}
	lapsing := tg.dialSegment(t, "lapsing", "short")
	// stale's grant runs out before the outage, while Redis is in reach.
	heartbeatSentPast(t, direct, tg, staleDeadline)

	cutOff(proxy)
	firstFailed := time.Now()
	// lapsing's one ping fails, and its grant runs out before Redis is
	// back.
	lapsingAt := time.Now()
	pingFails(t, lapsing)
	// carol's other device, on an instance that reaches Redis, renews
	// after her ping here, for longer.
	pingFails(t, carol)
	if _, err := session.NewStore(direct, ks).Renew(ctx, "carol", "default", time.Minute, session.ClockPresence); err != nil {
		t.Fatal(err)
	}
	carolDeadline := score("carol")
	// More failed renewals, all at once.
	var wg sync.WaitGroup
	for _, ws := range quiet {
		wg.Go(func() { pingFails(t, ws) })
	}
	wg.Wait()
	// alice keeps pinging: the last of her pings is the one that counts.
	pingFails(t, alice)
	// Real time must pass, here and below: pings are timed, and grants
	// run out, by the gateway's own clock while Redis is cut off.
	time.Sleep(200 * time.Millisecond)
	lastPing := time.Now()
	pingFails(t, alice)
	if code, body := get(t, tg, "/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "failing") {
		t.Errorf("readyz during the outage: %d %s, want 503 naming what fails", code, body)
	}
	// Real time must pass: lapsing's grant (and stale's, before it) runs out
	// while Redis is out of reach.
	time.Sleep(time.Until(lapsingAt.Add(1200 * time.Millisecond)))

	restored := time.Now()
	proxy.Restore()
	waitUntil(t, "a resync", func() bool { return strings.Contains(logs.String(), `msg="resynced sessions"`) })

	t.Run("the outage is a blind interval of the instance", func(t *testing.T) {
		members, err := direct.ZRange(ctx, ks.BlindKey(), 0, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		var found []session.BlindInterval
		for _, m := range members {
			b, err := session.ParseBlindInterval(m)
			if err != nil {
				t.Fatal(err)
			}
			if b.Scope == tg.instance && b.Reason == session.BlindRenewals {
				found = append(found, b)
			}
		}
		if len(found) == 0 {
			t.Fatalf("no %s interval of %s in %q", session.BlindRenewals, tg.instance, members)
		}
		b := found[0]
		if b.Start.After(firstFailed.Add(arrivalSlack)) || b.End.Before(restored.Add(-10*time.Millisecond)) {
			t.Errorf("blind interval %v..%v does not cover the failed pings from %v to the restore at %v",
				b.Start, b.End, firstFailed, restored)
		}
	})
	t.Run("the last ping's grant is restored, no longer", func(t *testing.T) {
		want := lastPing.Add(ttl)
		// The ping reached the gateway a moment after it was sent, and
		// its grant a moment after that: on a busy host a while after
		// (arrivalSlack). The ping before it is 200 ms earlier, the
		// restore more than a second later.
		if got := score("alice"); got.Before(want.Add(-5*time.Millisecond)) || got.After(want.Add(arrivalSlack)) {
			t.Errorf("alice's deadline %v, want her last ping's %v (%v later)", got, want, got.Sub(want))
			t.Log(logs.String())
		}
		if n, _ := direct.Exists(ctx, ks.SessionKey("alice")).Result(); n != 1 {
			t.Error("alice's session key not restored")
		}
	})
	t.Run("a grant that ran out in the outage is restored, due", func(t *testing.T) {
		// Redis never had it: restored at its own deadline (its ping's
		// arrival plus the TTL), due at once, for the listener to hold
		// until the grace is over and guide once.
		want := lapsingAt.Add(time.Second)
		if got := score("lapsing"); got.Before(want.Add(-5*time.Millisecond)) || got.After(want.Add(arrivalSlack)) || !got.Before(restored) {
			t.Errorf("lapsing's deadline %v, want its own, %v, before the resync at %v", got, want, restored)
		}
		renewed, err := tg.store.LastRenewed(ctx, "lapsing")
		if err != nil {
			t.Fatal(err)
		}
		if d := renewed.Sub(lapsingAt); d < -5*time.Millisecond || d > time.Second {
			t.Errorf("lapsing's last renewal %v, want its ping's, at %v", renewed, lapsingAt)
		}
	})
	t.Run("a grant that ran out before the outage is not restored", func(t *testing.T) {
		if got := score("stale"); !got.Equal(staleDeadline) {
			t.Errorf("stale's deadline %v, want its last one %v", got, staleDeadline)
		}
		if n, _ := direct.Exists(ctx, ks.SessionKey("stale")).Result(); n != 0 {
			t.Error("stale's session key came back")
		}
	})
	t.Run("a later deadline from another device stays", func(t *testing.T) {
		if got := score("carol"); !got.Equal(carolDeadline) {
			t.Errorf("carol's deadline %v, want the other device's %v", got, carolDeadline)
		}
	})
	t.Run("the outage is logged once, not per ping", func(t *testing.T) {
		pingPong(t, alice) // the first renewal after it ends the outage's log
		waitUntil(t, "the recovery line", func() bool { return strings.Contains(logs.String(), `msg="renew sessions recovered"`) })
		out := logs.String()
		if n := strings.Count(out, `msg="renew sessions failing"`); n != 1 {
			t.Errorf(`%d "renew sessions failing" lines, want 1`, n)
		}
		// Eight failed renewals, a heartbeat failing every 100ms: a line
		// per condition, not per failure.
		if n := strings.Count(out, "level=WARN"); n > 6 {
			t.Errorf("%d warnings for one outage:\n%s", n, out)
		}
		// Ready once the instance channel is subscribed again too: its
		// attempt under way when Redis came back may wait out its timeout.
		waitUntil(t, "readyz after the outage", func() bool {
			code, _ := get(t, tg, "/readyz")
			return code == http.StatusOK
		})
	})
}

// TestResyncAfterHeartbeatGap: a Redis that lost its data while every
// client was quiet gets their grants back once the heartbeat gets
// through again, though no renewal failed.
func TestResyncAfterHeartbeatGap(t *testing.T) {
	srv := redistest.Start(t)
	proxy, err := tcpproxy.Start(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	var logs lockedBuffer
	tg := startGatewayLogged(t, []string{proxy.Addr()}, redistest.Prefix(t), slog.New(slog.NewTextHandler(&logs, nil)), nil)
	ctx := context.Background()
	ks := tg.store.Keyspace()
	direct := redistest.Client(t, srv)

	ws := tg.dial(t, "idle")
	pinged := time.Now()
	pingPong(t, ws)
	rtt := time.Since(pinged)
	before, err := direct.ZScore(ctx, ks.IndexKey(session.Bucket("idle")), "idle").Result()
	if err != nil {
		t.Fatal(err)
	}
	proxy.Cut()
	waitUntil(t, "a failed heartbeat", func() bool { return strings.Contains(logs.String(), `msg="heartbeat failing"`) })
	if err := direct.FlushAll(ctx).Err(); err != nil { // Redis restarted empty
		t.Fatal(err)
	}
	proxy.Restore()
	waitUntil(t, "a resync", func() bool { return strings.Contains(logs.String(), `msg="resynced sessions"`) })
	after, err := direct.ZScore(ctx, ks.IndexKey(session.Bucket("idle")), "idle").Result()
	if err != nil {
		t.Fatalf("idle's deadline not restored: %v", err)
	}
	// The restored deadline is the one granted, counted from when the
	// gateway took the ping rather than when Redis ran the renewal: up to
	// the ping's round trip earlier (a busy host's milliseconds). It is
	// later by no more than the resync took: what is left of the grant is
	// counted when the resync reads it, and from Redis's now when its
	// script runs (a busy host queued it for 63 ms once).
	took := resyncTook(t, logs.String())
	if d := after - before; d < -float64(rtt.Milliseconds())-2 || d > float64(took.Milliseconds())+2 {
		t.Errorf("deadline restored as %v, was %v (the ping's round trip took %v, the resync %v)", after, before, rtt, took)
	}
	if blind, _ := direct.ZRange(ctx, ks.BlindKey(), 0, -1).Result(); strings.Contains(strings.Join(blind, " "), session.BlindRenewals) {
		t.Errorf("no renewal failed, yet a renewal outage was recorded: %q", blind)
	}
}

// resyncTook is how long the first resync in a gateway's text log took.
func resyncTook(t *testing.T, log string) time.Duration {
	t.Helper()
	m := regexp.MustCompile(`msg="resynced sessions" sessions=\d+ took=(\S+)`).FindStringSubmatch(log)
	if m == nil {
		t.Fatalf("no resync with its duration in the log:\n%s", log)
	}
	d, err := time.ParseDuration(m[1])
	if err != nil {
		t.Fatalf("resync took %q: %v", m[1], err)
	}
	return d
}

// TestHeartbeat: an instance is alive in Redis before it takes
// connections, stays alive while it serves, and is marked gone when it
// stops. Its renewals name it.
func TestHeartbeat(t *testing.T) {
	ctx := context.Background()
	t.Run("alive from Open, gone after shutdown", func(t *testing.T) {
		// No beat of Run's within the test: what is there, Open wrote.
		tg := startGateway(t, func(c *Config) { c.HeartbeatInterval = 10 * time.Second })
		alive := tg.store.Keyspace().AliveKey()
		if v, err := tg.rdb.HGet(ctx, alive, tg.instance).Result(); err != nil || !strings.HasSuffix(v, ":30000") {
			t.Fatalf("heartbeat of %s after Open: %q %v, want a lease of 3 intervals (30000 ms)", tg.instance, v, err)
		}
		ws := tg.dial(t, "alice")
		pingPong(t, ws)
		via, err := tg.rdb.HGet(ctx, tg.store.Keyspace().ViaKey(session.Bucket("alice")), "alice").Result()
		if err != nil || via != tg.instance {
			t.Fatalf("alice renewed via %q %v, want %s", via, err, tg.instance)
		}
		ws.Close()
		tg.stop(t)
		if v, _ := tg.rdb.HGet(ctx, alive, tg.instance).Result(); !strings.HasSuffix(v, ":0") {
			t.Fatalf("heartbeat after shutdown %q, want lease 0", v)
		}
	})
	t.Run("renewed while serving", func(t *testing.T) {
		tg := startGateway(t, nil)
		beat := func() string {
			t.Helper()
			v, err := tg.rdb.HGet(ctx, tg.store.Keyspace().AliveKey(), tg.instance).Result()
			if err != nil || !strings.HasSuffix(v, ":300") {
				t.Fatalf("heartbeat %q %v, want a lease of 300 ms", v, err)
			}
			return v
		}
		first := beat()
		waitUntil(t, "a later heartbeat", func() bool { return beat() != first })
	})
}

// TestDrainRecordedAsBlindInterval: a gateway that stops records its
// drain as a blind interval of the instance before the first client is
// told to go, and again until it leaves, so that the listener holds the
// timeouts of users who were told to reconnect elsewhere until the grace
// after the drain has passed.
func TestDrainRecordedAsBlindInterval(t *testing.T) {
	ctx := context.Background()
	tg := startGateway(t, func(c *Config) { c.ShutdownTimeout = time.Second })
	blindKey := tg.store.Keyspace().BlindKey()
	drains := func() []session.BlindInterval {
		t.Helper()
		ms, err := tg.rdb.ZRange(ctx, blindKey, 0, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		var out []session.BlindInterval
		for _, m := range ms {
			if b, err := session.ParseBlindInterval(m); err == nil && b.Reason == session.BlindDrain && b.Scope == tg.instance {
				out = append(out, b)
			}
		}
		return out
	}
	told := tg.dial(t, "told")
	pingPong(t, told)
	// A client that never reads does not answer the close, and keeps the
	// drain going until the shutdown timeout.
	deaf := tg.dial(t, "deaf")
	pingPong(t, deaf)
	type seen struct {
		at     time.Time
		drains []session.BlindInterval
		err    error
	}
	atClose := make(chan seen, 1)
	go func() {
		told.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, _, err := told.ReadMessage()
		now, _ := tg.rdb.Time(ctx).Result()
		atClose <- seen{at: now, drains: drains(), err: err}
	}()
	tg.stop(t)
	got := <-atClose
	if !websocket.IsCloseError(got.err, websocket.CloseGoingAway) {
		t.Fatalf("connection ended with %v, want 1001", got.err)
	}
	if len(got.drains) != 1 || got.drains[0].Start.After(got.at) {
		t.Fatalf("drain records when the client was told to go (%v, by Redis's clock): %+v; want one begun by then", got.at, got.drains)
	}
	final := drains()
	if len(final) != 1 || !final[0].Start.Equal(got.drains[0].Start) {
		t.Fatalf("drain records after the stop: %+v; want one, begun at %v", final, got.drains[0].Start)
	}
	v, err := tg.rdb.HGet(ctx, tg.store.Keyspace().AliveKey(), tg.instance).Result()
	if err != nil {
		t.Fatal(err)
	}
	left, _ := strconv.ParseInt(strings.TrimSuffix(v, ":0"), 10, 64)
	// Recorded again while it lasted: across the shutdown timeout the
	// deaf client held it open, and last before the instance left.
	if d := final[0].End.Sub(final[0].Start); d < time.Second {
		t.Errorf("drain recorded as lasting %v; it waited the shutdown timeout (1s) for the deaf client", d)
	}
	if time.UnixMilli(left).Before(final[0].End) {
		t.Errorf("drain recorded up to %v, after the instance left at %v", final[0].End, time.UnixMilli(left))
	}
}

// TestReachState covers what the Redis tests cannot time: renewals that
// failed and were never followed by one that succeeded.
func TestReachState(t *testing.T) {
	kicked := func(r *reach) bool {
		select {
		case <-r.kick:
			return true
		default:
			return false
		}
	}
	errDown := errors.New("down")

	r := newReach(2*time.Millisecond, slowFlush, nil)
	r.flushed(time.Second, errDown)
	if err := r.err(); err == nil || !strings.Contains(err.Error(), "renewals failing") {
		t.Fatalf("after a failed round trip: err() = %v", err)
	}
	select {
	case <-r.failed:
	default:
		t.Fatal("a failed round trip did not wake the recorder of outages that last")
	}
	if !r.partial() {
		t.Fatal("renewals fail, heartbeats do not: not a partial outage")
	}
	if since := r.unrecorded(); time.Since(since) < time.Second {
		t.Fatalf("unrecorded since %v: want the failed round trip's start, a second ago", since)
	}
	r.beaten(nil, true)
	if kicked(r) || r.err() == nil {
		t.Fatal("a heartbeat right after a failed round trip healed the renewals")
	}
	// No client pings again; the heartbeat gets through, long after.
	r.mu.Lock()
	r.lastFail = time.Now().Add(-flushFailFresh - time.Second)
	r.mu.Unlock()
	if !r.staleFlushFail() {
		t.Fatal("no renewal for longer than flushFailFresh: the failure is not stale")
	}
	// On its own connection: while the shared pool does not answer,
	// the renewals' failure stands.
	r.beaten(nil, false)
	if kicked(r) || r.err() == nil {
		t.Fatal("a heartbeat healed the renewals while the shared pool did not answer")
	}
	r.beaten(nil, true)
	if !kicked(r) || r.err() != nil {
		t.Fatalf("stale failed round trips: no kick or still failing (%v)", r.err())
	}
	if r.unrecorded().IsZero() {
		t.Fatal("the failure was forgotten before it was recorded")
	}
	r.recorded(time.Now())
	if !r.unrecorded().IsZero() {
		t.Fatal("recorded, yet still owed")
	}

	// A round trip that fails while a record is written leaves the rest owed.
	at := time.Now()
	r.flushed(0, errDown)
	r.recorded(at)
	if got := r.unrecorded(); !got.Equal(at) {
		t.Fatalf("owed since %v, want %v", got, at)
	}
	r.flushed(0, nil)
	if !kicked(r) {
		t.Fatal("no kick when round trips succeed again")
	}

	r.beaten(errDown, true)
	if err := r.err(); err == nil || !strings.Contains(err.Error(), "heartbeats failing") {
		t.Fatalf("after a failed heartbeat: err() = %v", err)
	}
	if r.flushed(0, errDown); r.partial() {
		t.Fatal("renewals and heartbeats fail: taken for a partial outage")
	}
	r.flushed(0, nil)
	<-r.kick
	r.beaten(nil, true)
	if !kicked(r) || r.err() != nil {
		t.Fatal("a healed heartbeat gap: no kick, or still failing")
	}
	if r.failureCount() != 4 {
		t.Fatalf("failures %d, want 4", r.failureCount())
	}
}

// TestRecordsPartialOutageWhileItLasts: renewals of one bucket fail while
// Redis answers everything else, as while a cluster slot migrates for
// longer than renewals are retried. The outage is recorded while it
// lasts, before any renewal of the bucket succeeds again (the moment the
// slot is back a listener may meet the deadlines it let lapse), as one
// record that later ones replace, the recovery's last.
func TestRecordsPartialOutageWhileItLasts(t *testing.T) {
	srv := redistest.Start(t)
	tg := startGatewayLogged(t, []string{srv.Addr}, redistest.Prefix(t), slog.New(slog.DiscardHandler), nil)
	direct := redistest.Client(t, srv)
	ctx := context.Background()
	ks := tg.store.Keyspace()
	gaps := func() []session.BlindInterval { return renewalGaps(t, direct, tg) }
	ws := tg.dial(t, "alice")
	pingPong(t, ws)
	// A wrong type where the renewal writes: it fails, and nothing else.
	index := ks.IndexKey(session.Bucket("alice"))
	if err := direct.Set(ctx, index, "not a sorted set", 0).Err(); err != nil {
		t.Fatal(err)
	}
	firstFailed := time.Now()
	pingFails(t, ws)
	// Well before a heartbeat would take the failure for stale
	// (flushFailFresh) and record it as over.
	if !waitFor(2*ongoingRecordEvery, func() bool { return len(gaps()) == 1 }) {
		t.Fatalf("renewals failing for %v, and no record of it: %q", time.Since(firstFailed), gaps())
	}
	first := gaps()[0]
	if first.Start.After(firstFailed.Add(50 * time.Millisecond)) {
		t.Errorf("recorded from %v, after the first failure at %v", first.Start, firstFailed)
	}

	// Real time must pass: a lasting outage is recorded again at most
	// every ongoingRecordEvery, by the gateway's own clock.
	time.Sleep(ongoingRecordEvery)
	pingFails(t, ws)
	waitUntil(t, "the record extended, still one", func() bool {
		g := gaps()
		return len(g) == 1 && g[0].End.After(first.End)
	})

	if err := direct.Del(ctx, index).Err(); err != nil {
		t.Fatal(err)
	}
	restored := time.Now()
	pingPong(t, ws)
	waitUntil(t, "the recovery's record, in place of the last", func() bool {
		g := gaps()
		return len(g) == 1 && !g[0].End.Before(restored.Add(-10*time.Millisecond))
	})
	if g := gaps()[0]; g.Start.Sub(first.Start).Abs() > 50*time.Millisecond {
		t.Errorf("the recovery's record starts at %v, the outage at %v", g.Start, first.Start)
	}
}

// pingFails pings and expects the gateway to answer that the session
// store is unavailable.
// arrivalSlack bounds how long after a test sends a ping the gateway
// reads it and grants from it: milliseconds on an idle host, 127 ms seen
// on a busy one. A grant from anything later (the ping's failure, the
// restore) is seconds off.
const arrivalSlack = 500 * time.Millisecond

func pingFails(t *testing.T, ws *websocket.Conn) {
	t.Helper()
	ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"ping"}`))
	// A round trip to a partitioned Redis takes its read timeout (3s)
	// to fail, and a ping queued behind others waits for theirs, up to
	// the write timeout, before its own: on a busy machine the
	// error comes after both.
	ws.SetReadDeadline(time.Now().Add(30 * time.Second))
	_, b, err := ws.ReadMessage()
	if err != nil {
		t.Errorf("read: %v", err)
		return
	}
	if !bytes.Contains(b, []byte(`"type":"error"`)) {
		t.Errorf("got %s, want an error frame", b)
	}
}

func get(t *testing.T, tg *testGateway, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + tg.PushAddr().String() + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// lockedBuffer is a log sink a test reads while the gateway writes.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestBusyPoolStillRenewsAndBeats: a burst of connection set-ups (here,
// blocking commands) holds every connection of the gateway's shared Redis
// pool. The heartbeat has a connection of its own, and renewals (go-redis
// pipelines) spill to a pool of their own: a ping is answered at once,
// and no heartbeat fails, so the gateway neither reports Redis out of
// reach nor sheds its clients while Redis answers.
func TestBusyPoolStillRenewsAndBeats(t *testing.T) {
	tg := startGateway(t, nil)
	ws := tg.dial(t, "alice")
	pingPong(t, ws)
	shared := tg.Gateway.rdb.(*redis.Client)
	size := shared.Options().PoolSize
	const busy = 3 * time.Second
	var wg sync.WaitGroup
	for i := range size {
		wg.Go(func() {
			shared.BLPop(context.Background(), busy, fmt.Sprintf("busy-%d", i))
		})
	}
	defer wg.Wait()
	waitUntil(t, "the shared pool to be taken", func() bool {
		s := shared.PoolStats()
		return int(s.TotalConns) == size && s.IdleConns == 0
	})
	start := time.Now()
	pingPong(t, ws)
	if took := time.Since(start); took > busy/3 {
		t.Errorf("a ping took %v to be answered while the shared pool was busy: renewals wait behind other work", took)
	}
	// Watched while the pool is held: real time must pass, as the burst
	// lasts.
	for time.Since(start) < busy-500*time.Millisecond {
		if since := tg.reach.cutOffSince(); !since.IsZero() {
			t.Fatalf("Redis counted out of reach since %v while it answered: the heartbeat waited behind other work", since)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestRecordsStalledRenewalsWhileTheyLast: a cluster master that stops
// (a VM pause, CPU starvation) holds the renewal round trip in flight, and
// with it every renewal of the instance, a user's on a master that answers
// too: renewals go one round trip at a time. Heartbeats and the control
// keys' master answer meanwhile, so nothing else tells the listener. The
// instance records the outage while the round trip hangs, within a
// heartbeat interval or so, before the deadlines it holds up lapse; not
// only once it returns.
func TestRecordsStalledRenewalsWhileTheyLast(t *testing.T) {
	c := redistest.StartCluster(t)
	tg := startGatewayOn(t, c.Addrs(), redistest.Prefix(t), nil)
	ctx := context.Background()
	ks := tg.store.Keyspace()
	direct := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	t.Cleanup(func() { direct.Close() })
	owner := func(key string) string {
		t.Helper()
		slot, err := direct.ClusterKeySlot(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		slots, err := redisserver.SlotMap(ctx, redis.NewClient(&redis.Options{Addr: c.Addrs()[0]}))
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range slots {
			if int64(s.Start) <= slot && slot <= int64(s.End) {
				return s.Master
			}
		}
		t.Fatalf("no master serves slot %d", slot)
		return ""
	}
	control := owner(ks.BlindKey())
	var stopped *redisserver.Server
	for _, m := range c.Masters {
		if m.Addr != control {
			stopped = m
			break
		}
	}
	// A user on the master that stops, and one on the control keys'.
	userOn := func(addr string) string {
		for i := range 1000 {
			uid := fmt.Sprintf("user-%d", i)
			if owner(ks.IndexKey(session.Bucket(uid))) == addr {
				return uid
			}
		}
		t.Fatalf("no uid on %s", addr)
		return ""
	}
	held, healthy := tg.dial(t, userOn(stopped.Addr)), tg.dial(t, userOn(control))
	pingPong(t, held)
	pingPong(t, healthy)
	gaps := func() []session.BlindInterval { return renewalGaps(t, direct, tg) }
	if g := gaps(); len(g) != 0 {
		t.Fatalf("renewals recorded as failing before the master stopped: %v", g)
	}

	stopped.Pause()
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			stopped.Resume()
		}
	}
	defer resume()
	pausedAt := time.Now()
	held.WriteMessage(websocket.TextMessage, []byte(`{"type":"ping"}`))
	healthy.WriteMessage(websocket.TextMessage, []byte(`{"type":"ping"}`))
	// The round trip hangs until the master runs again (well inside the
	// client's 3s read timeout): the record must come meanwhile.
	var first session.BlindInterval
	if !waitFor(time.Until(pausedAt.Add(2500*time.Millisecond)), func() bool {
		g := gaps()
		if len(g) > 0 {
			first = g[0]
		}
		return len(g) > 0
	}) {
		t.Fatalf("renewals held for %v by a round trip in flight, and no record of it", time.Since(pausedAt))
	}
	t.Logf("recorded %v after the master stopped: %v to %v", time.Since(pausedAt).Round(time.Millisecond),
		first.Start.Format("15:04:05.000"), first.End.Format("15:04:05.000"))
	if first.Start.After(pausedAt.Add(50 * time.Millisecond)) {
		t.Errorf("recorded from %v, after the held renewals were queued (%v)", first.Start, pausedAt)
	}
	if err := tg.reach.err(); err == nil {
		t.Error("renewals held up, and the instance reports them fine (readyz)")
	}

	resume()
	restored := time.Now()
	for _, ws := range []*websocket.Conn{held, healthy} {
		if m := readJSON(t, ws); m["type"] != "pong" {
			t.Fatalf("after the master runs again: got %v, want pong", m)
		}
	}
	// The recovery records the whole outage, in place of the record
	// made while it lasted.
	waitUntil(t, "the recovery's record, in place of the last", func() bool {
		g := gaps()
		return len(g) == 1 && !g[0].End.Before(restored.Add(-10*time.Millisecond))
	})
	waitUntil(t, "readyz to see renewals healed", func() bool { return tg.reach.err() == nil })
}

// renewalGaps are the blind intervals tg recorded for its failing
// renewals, read straight from Redis.
func renewalGaps(t *testing.T, direct redis.Cmdable, tg *testGateway) []session.BlindInterval {
	t.Helper()
	members, err := direct.ZRange(context.Background(), tg.store.Keyspace().BlindKey(), 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	var out []session.BlindInterval
	for _, m := range members {
		if b, err := session.ParseBlindInterval(m); err == nil && b.Scope == tg.instance && b.Reason == session.BlindRenewals {
			out = append(out, b)
		}
	}
	return out
}
