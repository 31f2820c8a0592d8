package devstack

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/stillthere/stillthere/pkg/chatsim"
	"github.com/stillthere/stillthere/pkg/gateway"
	"github.com/stillthere/stillthere/pkg/lifecycle/lifecycletest"
	"github.com/stillthere/stillthere/pkg/redisconn"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/tcpproxy"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// TestRollingRestartSendsNoGuide restarts a gateway under 1,000 active
// clients. They are told 1001, reconnect to another instance at once and
// keep pinging: no session may run out, so no guide may go out. The
// whole instance reconnects to the other at once; on a busy machine
// their reconnects and first pings there can take longer than what their
// grants have left, and the drain that told them to go is a silence we
// caused (TestRollingRestartSlowReconnectsHeld stages that for certain).
// The clients ping as the real client does, every quarter of the TTL: a
// TTL of 4 s leaves a busy machine's clients time to spare, as a minute
// does in production.
func TestRollingRestartSendsNoGuide(t *testing.T) {
	if testing.Short() {
		t.Skip("1,000 connections")
	}
	rollingRestart(t, restartPlan{clients: 1000, ttl: 4 * time.Second})
}

// TestRollingRestartSlowReconnectsHeld restarts a gateway while the other
// instance takes no connection for longer than any grant, as a fleet
// busy with a whole instance's reconnects may, and while one client that
// never answers the close keeps the drain going until the shutdown
// timeout, the stopping instance still beating: every user told to go
// has lapsed by the time they renew elsewhere, and none may be guided.
func TestRollingRestartSlowReconnectsHeld(t *testing.T) {
	rollingRestart(t, restartPlan{clients: 20, ttl: testTTL, otherAway: testTTL + testJitter + 500*time.Millisecond, deaf: true})
}

// restartPlan is a rolling restart to stage.
type restartPlan struct {
	clients int
	ttl     time.Duration // the sessions' TTL; the jitter is testJitter
	// otherAway is how long the other instance takes no connection (each
	// hangs, then is closed), from just before the restart; 0 for none.
	otherAway time.Duration
	// deaf adds a client of the restarting instance that never reads, so
	// never answers the close: the drain lasts the shutdown timeout. It
	// stops pinging, and its guide is owed.
	deaf bool
}

// rollingRestart stops one of two gateway instances under plan.clients
// clients, who move to the other and keep pinging, and checks that none
// who kept pinging was guided.
func rollingRestart(t *testing.T, plan restartPlan) {
	s := startStack(t, map[string]string{"STILLTHERE_SESSION_TTL": plan.ttl.String()})
	// The real client's interval: a quarter of the TTL, at least the
	// renewal granularity, so that each ping renews.
	interval := max(s.GatewayConfig.RenewGranularity, plan.ttl/4)

	// The instance that restarts, beside the stack's own gateway.
	cfg := s.GatewayConfig
	cfg.Addr, cfg.PushAddr, cfg.InstanceID = "127.0.0.1:0", "127.0.0.1:0", "restarting"
	b, runB := lifecycletest.Start(t, gateway.Open, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))

	urlB := "ws://" + b.PublicAddr().String() + "/v1/ws"
	// The other instance, through a proxy that can keep it out of reach.
	front, err := tcpproxy.Start(s.Gateway.PublicAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { front.Close() })
	urlA := "ws://" + front.Addr() + "/v1/ws"
	var (
		wg    sync.WaitGroup
		moved atomic.Int64
		ready = make(chan struct{}, plan.clients)
		stop  = make(chan struct{})
		users = make([]*rollClient, plan.clients)
	)
	for i := range users {
		uid := "roll-" + strconv.Itoa(i)
		u := &rollClient{interval: interval, User: &chatsim.User{
			UID:    uid,
			Token:  mint(t, s, uid),
			Dialer: &websocket.Dialer{HandshakeTimeout: 10 * time.Second},
		}}
		users[i] = u
		wg.Go(func() { u.run(urlB, urlA, ready, stop, &moved) })
	}
	for range plan.clients {
		<-ready
	}
	const deafUID = "roll-deaf"
	if plan.deaf {
		c := connectAs(t, &chatsim.User{UID: deafUID, Token: mint(t, s, deafUID)}, urlB)
		// Answered, so served: it is among the connections the drain
		// waits for. It answers nothing after.
		ping(t, c)
		c.Freeze()
	}
	if plan.otherAway > 0 {
		front.Blackhole()
	}
	// Closed as SIGTERM would stop it: the drain runs while the test goes
	// on.
	stoppedB := make(chan error, 1)
	go func() { stoppedB <- runB.Stop() }()
	if plan.otherAway > 0 {
		// Real time must pass: the other instance is out of reach for
		// longer than any grant.
		time.Sleep(plan.otherAway)
		front.Restore()
	}
	if err := <-stoppedB; err != nil {
		t.Errorf("restarting gateway: %v", err)
	}
	waitCond(t, 60*time.Second, "every client to move to the other instance, or give up", func() bool {
		n := moved.Load()
		for _, u := range users {
			if u.failed.Load() {
				n++
			}
		}
		return n == int64(plan.clients)
	})
	// Real time must pass: the clients keep pinging on the other instance
	// for one grace, so that every timeout the drain held is released and
	// checked again while its user is still there.
	time.Sleep(s.ListenerConfig.OutageGrace)
	close(stop)
	wg.Wait()
	// Sessions were ended with 1000: once none is left in the index or
	// held, and the listener has swept twice since, nothing that lapsed
	// is still on its way to the topic. The deaf client's session ends
	// with its guide.
	waitQuiet(t, s)

	// A client that the machine did not run in time, and that pinged
	// past the deadline its last pong proved while nothing of ours kept
	// it waiting, let its own grant run out: its guide is owed. Every
	// other client was there throughout.
	var failed, late int
	byUID := map[string]*rollClient{}
	for _, u := range users {
		byUID[u.UID] = u
		if u.failed.Load() {
			failed++
		}
		if u.lateAt != "" {
			late++
			if late <= 3 {
				t.Logf("%s pinged past its own deadline: %s", u.UID, u.lateAt)
			}
		}
	}
	if late > 0 {
		t.Logf("%d of %d clients pinged past their own deadline (the machine did not run them in time); their guides are owed", late, plan.clients)
	}
	if failed != 0 {
		t.Errorf("%d clients could not connect", failed)
	}
	if n := moved.Load(); n < int64(plan.clients) {
		t.Errorf("only %d of %d clients moved to the other instance", n, plan.clients)
	}
	var guided []string
	for _, u := range users {
		if u.Record().Guides > 0 && u.lateAt == "" {
			guided = append(guided, u.UID)
		}
	}
	if len(guided) != 0 {
		t.Errorf("%d clients that kept pinging got guides: %v", len(guided), guided[:min(len(guided), 5)])
	}
	var wrong []timeoutevent.Event
	for _, e := range topicEvents(t, s) {
		if u := byUID[e.UID]; e.UID != deafUID && (u == nil || u.lateAt == "") {
			wrong = append(wrong, e)
		}
	}
	if len(wrong) != 0 {
		t.Errorf("%d timeout events for clients that never went silent; first %+v", len(wrong), wrong[0])
	}
}

// rollClient is one client of the rolling restart (a chatsim.User), and
// behaves as the real client does: it reads all along, so that it hears
// a 1001 at once; it pings one at a time, each an interval after the last
// was answered (at least the renewal granularity apart, so that each
// renews); told to go, or cut off, it reconnects to the other instance at
// once, then with an exponential backoff with full jitter, and pings as
// soon as it is connected.
type rollClient struct {
	*chatsim.User
	interval time.Duration

	failed atomic.Bool
	// lateAt says when the client, idle, first found the deadline its
	// last pong proved (its record's Low) passed, or is empty. Its
	// goroutine's own.
	lateAt string
}

func (u *rollClient) run(urlB, urlA string, ready chan<- struct{}, stop <-chan struct{}, moved *atomic.Int64) {
	c := u.connect(urlB)
	if c == nil || u.ping(c) != nil {
		if c != nil {
			c.Close()
		}
		u.failed.Store(true)
		ready <- struct{}{}
		return
	}
	ready <- struct{}{}
	hasMoved := false
	for {
		timer := time.NewTimer(u.interval)
		select {
		case <-stop:
			timer.Stop()
			c.Leave(0)
			return
		case <-c.Gone():
			timer.Stop()
			u.idleUntil(c.GoneAt(), "told to go")
		case <-timer.C:
			u.idleUntil(time.Now(), "next ping")
			if u.ping(c) == nil {
				continue
			}
		}
		// Told to go, or cut: reconnect to the other instance, and renew
		// there. Waiting for us, it is there.
		c.Close()
		for {
			if c = u.connect(urlA); c == nil {
				u.failed.Store(true)
				return
			}
			if u.ping(c) == nil {
				break
			}
			c.Close()
		}
		if !hasMoved {
			hasMoved = true
			moved.Add(1)
		}
	}
}

// idleUntil notes the end of a time in which the client waited for
// nothing of ours: if its deadline passed in it, the silence was its own.
func (u *rollClient) idleUntil(at time.Time, what string) {
	if low := u.Record().Low; u.lateAt == "" && at.After(low) {
		u.lateAt = fmt.Sprintf("%s %v past the deadline its last pong proved", what, at.Sub(low).Round(time.Millisecond))
	}
}

// connect dials url at once, then again after an exponential backoff
// with full jitter, until it gets through or the test has waited long
// enough to call it a failure.
func (u *rollClient) connect(url string) *chatsim.Conn {
	giveUp := time.Now().Add(30 * time.Second)
	for step := 0; ; step++ {
		c, err := u.Connect(context.Background(), url)
		if err == nil {
			return c
		}
		if time.Now().After(giveUp) {
			return nil
		}
		pace(rand.N(min(5*time.Second, 500*time.Millisecond<<step)))
	}
}

// ping pings and waits for the pong; an error means the connection ended
// (told 1001, or cut) or did not answer with a pong.
func (u *rollClient) ping(c *chatsim.Conn) error {
	a, err := c.PingWait(5 * time.Second)
	if err == nil && a.Unavailable {
		err = errors.New("ping answered: session store unavailable")
	}
	return err
}

// waitQuiet waits until the stack's deadline index and hold sets are
// empty, every session ended or settled, and then until the listener has
// completed two sweeps since: a timeout a sweep read before has been
// produced by then, or never will be.
func waitQuiet(t *testing.T, s *Stack) {
	t.Helper()
	ctx := context.Background()
	rdb, err := redisconn.Open(ctx, s.GatewayConfig.Redis)
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	ks := s.GatewayConfig.Redis.Keyspace()
	waitCond(t, 30*time.Second, "the deadline index and hold sets to empty", func() bool {
		for b := range session.Buckets {
			n, err := rdb.ZCard(ctx, ks.IndexKey(b)).Result()
			if err != nil || n != 0 {
				return false
			}
			if n, err = rdb.ZCard(ctx, ks.HoldKey(b)).Result(); err != nil || n != 0 {
				return false
			}
		}
		return true
	})
	from := listenerSweeps(t, s)
	waitCond(t, 30*time.Second, "two more sweeps of the listener", func() bool { return listenerSweeps(t, s) >= from+2 })
}

// listenerSweeps is how many sweeps the stack's listener has completed,
// from its metrics.
func listenerSweeps(t *testing.T, s *Stack) int64 {
	t.Helper()
	resp, err := http.Get("http://" + s.Listener.AdminAddr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "stillthere_listener_sweep_seconds_count "); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("sweep count %q: %v", v, err)
			}
			return n
		}
	}
	t.Fatal("the listener's metrics have no sweep count")
	return 0
}
