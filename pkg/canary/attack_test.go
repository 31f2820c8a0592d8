package canary

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/stillthere/stillthere/pkg/chatsim"
	"github.com/stillthere/stillthere/pkg/frame"
	"github.com/stillthere/stillthere/pkg/promise"
	"github.com/stillthere/stillthere/pkg/token"
)

// TestJudgeLateDuplicateCounted: a stage counted ok once its bound and the
// settle time passed, then guided a second time (a consumer that replays
// its topic after a restart, a redelivery whose ack was lost), broke "one
// guide per silence". The operator must see it: StillthereCanaryPromiseBroken
// pages on any duplicated stage. Counting each key once, whatever its class
// became, hides the duplicate for good: the stage stays "ok".
func TestJudgeLateDuplicateCounted(t *testing.T) {
	r := newRecorder()
	const settle = 500 * time.Millisecond
	ping(r, "leaver", 0, 3*time.Second)
	guide(r, "leaver", "g1", 1, 3*time.Second, 3200*time.Millisecond)
	vs := r.judge(testPromise, at(5*time.Second), settle)
	if got := byClass(vs); len(vs) != 1 || got[promise.OK] != 1 {
		t.Fatalf("at 5s: %v, want the stage ok", vs)
	}
	// The same stage again, 20s later, while the cycle still runs.
	guide(r, "leaver", "g1-again", 1, 3*time.Second, 23*time.Second)
	vs = r.judge(testPromise, at(24*time.Second), settle)
	if got := byClass(vs); got[promise.Duplicated] != 1 {
		t.Fatalf("after a second guide for a stage counted ok: %v, want it counted duplicated", vs)
	}
	// And once only.
	if vs := r.judge(testPromise, at(30*time.Second), settle); len(vs) != 0 {
		t.Fatalf("later: %v, want the duplicate not counted again", vs)
	}
	r.end("leaver", at(31*time.Second))
	if vs := r.judge(testPromise, at(32*time.Second), settle); len(vs) != 0 {
		t.Fatalf("at the cycle's end: %v, want nothing counted again", vs)
	}
}

// TestJudgeLateDuplicateAtEnd: the duplicate came after the stage was
// counted and the cycle ended before the next check: the last judgement
// of the ended cycle must still count it.
func TestJudgeLateDuplicateAtEnd(t *testing.T) {
	r := newRecorder()
	const settle = 500 * time.Millisecond
	ping(r, "leaver", 0, 3*time.Second)
	guide(r, "leaver", "g1", 1, 3*time.Second, 3200*time.Millisecond)
	if vs := r.judge(testPromise, at(5*time.Second), settle); len(vs) != 1 {
		t.Fatalf("at 5s: %v, want the stage counted", vs)
	}
	guide(r, "leaver", "g1", 1, 3*time.Second, 6*time.Second) // the same id, shown twice
	r.end("leaver", at(6500*time.Millisecond))
	vs := r.judge(testPromise, at(7*time.Second), settle)
	if got := byClass(vs); got[promise.Duplicated] != 1 {
		t.Fatalf("%v, want the repeat counted duplicated", vs)
	}
}

// guidingGateway upgrades every connection with a valid token, answers
// pings with a pong of ttl, and sends one guide guideAfter after the
// connect, naming the deadline connect+guideAfter; its clock is ahead of
// the canary's by skew (Redis's, which names deadlines, on another node).
// pingDelay holds each ping before it lands (a busy gateway reading it),
// pongDelay each pong after its renewal (a slow write, a busy reader on
// the client): neither moves the deadline the pong names, nor the guide.
type guidingGateway struct {
	ttl, guideAfter, skew time.Duration
	pingDelay, pongDelay  time.Duration
	verifier              *token.Verifier
	sent                  atomic.Int64 // the first guide's named deadline, Unix ms
	wg                    sync.WaitGroup
}

func (g *guidingGateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// Counted before the server may count the request done (a hijack
	// is done, for httptest): once the server is closed, every handler
	// that will run is counted, and the wait for them races no Add.
	g.wg.Add(1)
	defer g.wg.Done()
	claims, err := g.verifier.Verify(strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "))
	if err != nil {
		http.Error(w, "bad token", http.StatusUnauthorized)
		return
	}
	ws, err := (&websocket.Upgrader{}).Upgrade(w, r, nil)
	if err != nil {
		return
	}
	defer ws.Close()
	now := func() time.Time { return time.Now().Add(g.skew) }
	deadline := now().Add(g.guideAfter)
	frames := make(chan []byte)
	g.wg.Go(func() {
		defer close(frames)
		for {
			_, b, err := ws.ReadMessage()
			if err != nil {
				return
			}
			frames <- b
		}
	})
	guided := time.NewTimer(g.guideAfter)
	defer guided.Stop()
	for {
		select {
		case b, ok := <-frames:
			if !ok {
				return
			}
			if f, _ := frame.Parse(b); f.Type == frame.TypePing {
				// The fault itself: a gateway slow to read the ping, in
				// real time, which the canary's clock must bear.
				time.Sleep(g.pingDelay)
				deadline = now().Add(g.ttl)
				guided.Reset(g.ttl)
				// The fault itself: a pong slow on its way, in real time.
				time.Sleep(g.pongDelay)
				ws.WriteMessage(websocket.TextMessage, frame.Pong(g.ttl.Milliseconds(), deadline.UnixMilli()))
			}
		case <-guided.C:
			ws.WriteMessage(websocket.TextMessage, frame.Guide("g-"+claims.UID, "still there?", deadline.UnixMilli(), 1, true))
			g.sent.CompareAndSwap(0, deadline.UnixMilli())
			ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(frame.CloseInactive, "inactive"), time.Now().Add(time.Second))
			// Drain until the client's close.
			for range frames {
			}
			return
		}
	}
}

// attackConfig is a short-cycled canary against url, of no users yet.
func attackConfig(url string) Config {
	cfg := DefaultConfig()
	cfg.URL = url
	cfg.TokenSecret = testSecret
	cfg.TTL, cfg.Jitter, cfg.StageDelays = 2*time.Second, 0, nil
	cfg.Stayers, cfg.Leavers, cfg.LeavePings = 0, 0, 1
	cfg.StayFor = 10 * time.Second
	cfg.Slack, cfg.AnswerTimeout = time.Second, time.Second
	cfg.CheckInterval = 100 * time.Millisecond
	cfg.Window = time.Minute
	cfg.AdminAddr = "127.0.0.1:0"
	return cfg
}

// runCanary runs a canary of cfg until the test's end.
func runCanary(t *testing.T, cfg Config) {
	t.Helper()
	initSeries()
	c, err := Open(context.Background(), cfg, slog.New(slog.NewTextHandler(testWriter{t}, nil)))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(context.Background()) }()
	t.Cleanup(func() {
		c.Close()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	})
}

// waitFor polls cond until it holds, or fails after within.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: still waiting for %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// classes0 are the stage counters now, to read how they moved.
func classes0() map[promise.Class]float64 {
	out := map[promise.Class]float64{}
	for _, c := range classes {
		out[c] = testutil.ToFloat64(stagesTotal.WithLabelValues(string(c)))
	}
	return out
}

func moved(before map[promise.Class]float64, c promise.Class) float64 {
	return testutil.ToFloat64(stagesTotal.WithLabelValues(string(c))) - before[c]
}

// TestCanaryActivityRejectedIsNotAFalseGuide: the canary's activity
// secret is wrong (rotated on the gateways, not in the canary's Secret):
// every activity call of a feed user is answered 401, which the canary
// counts as rejected and records nothing of. Its WebSocket stays open, and
// the gateway's guide to it (the service never heard from the user: it
// is owed one) matches no recorded silence: the checker calls it a stray,
// false, and StillthereCanaryPromiseBroken pages the operator for "a
// guide to a user who was there" when the fault is the canary's own
// configuration.
func TestCanaryActivityRejectedIsNotAFalseGuide(t *testing.T) {
	v, err := token.NewVerifier([]byte(testSecret), token.Rules{})
	if err != nil {
		t.Fatal(err)
	}
	g := &guidingGateway{ttl: 2 * time.Second, guideAfter: 1500 * time.Millisecond, verifier: v}
	srv := httptest.NewServer(g)
	// Stopped after the canary (cleanups run last first), and its
	// connections' goroutines waited for once it is closed.
	t.Cleanup(g.wg.Wait)
	t.Cleanup(srv.Close)
	act := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, `{"error":"missing or wrong activity credentials"}`, http.StatusUnauthorized)
	}))
	t.Cleanup(act.Close)

	cfg := attackConfig("ws" + strings.TrimPrefix(srv.URL, "http") + "/v1/ws")
	cfg.FeedLeavers = 1
	cfg.ActivityURL, cfg.ActivitySecret = act.URL+"/v1/activity", testSecret
	before := classes0()
	rejected0 := testutil.ToFloat64(signalsTotal.WithLabelValues(viaActivity, outcomeRejected))
	runCanary(t, cfg)
	waitFor(t, 30*time.Second, "a rejected activity call", func() bool {
		return testutil.ToFloat64(signalsTotal.WithLabelValues(viaActivity, outcomeRejected))-rejected0 >= 1
	})
	// The gateway guides guideAfter after the connect; the stray is final
	// the settle time after the deadline it names.
	past := time.Now().Add(g.guideAfter + cfg.settle() + 200*time.Millisecond)
	waitFor(t, 30*time.Second, "a check past the guide's deadline and the settle time", func() bool {
		return testutil.ToFloat64(lastCheck) > float64(past.UnixMilli())/1000
	})
	for _, c := range classes {
		if n := moved(before, c); n != 0 && c.Failure() {
			t.Errorf("%v stages %s: the canary's own rejected calls read as the service's broken promise", n, c)
		}
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// TestCanaryClockSkew: Redis's clock, which names every deadline the
// gateways grant and guide, is 3s off the canary's node (an NTP daemon
// down on one of them). The service guides each silence exactly at its
// deadline, by its clock: on time. The canary judged the pong's deadline
// against its own clock: a guide 3s "before its deadline" is false (a
// page: "a guide to a user who was there"), and one 3s behind it late (a
// burn of the budget), though the service kept its promise to the
// millisecond. The pong tells the canary Redis's now (its deadline less
// its TTL), within the ping's round trip: enough to judge in one clock.
func TestCanaryClockSkew(t *testing.T) {
	for _, skew := range []time.Duration{0, 3 * time.Second, -3 * time.Second} {
		t.Run(skew.String(), func(t *testing.T) {
			skewed(t, &guidingGateway{ttl: 2 * time.Second, guideAfter: 2 * time.Second, skew: skew}, 2, nil)
		})
	}
}

// TestCanaryClockSkewSlowTrip: a ping's round trip is slow (a busy
// gateway, a busy canary: a CPU-starved node). The pong tells Redis's
// renewal time only to within that trip, and the canary must not judge by
// an estimate that puts the deadline later than it can be: Redis 3s
// ahead and a pong 600ms on its way back, the canary took Redis's clock
// as 2.4s ahead, and the deadline 600ms later than it was. The guide, on
// time by Redis's clock, then came before the deadline as the canary
// reckoned it, and the gateway's close right after it ended the history
// before that deadline too: no silence, and the guide false ("delivered
// for no silence"), a page for a service that kept its promise to the
// millisecond. A trip slower than the in-flight slack makes it false
// however long the history runs.
func TestCanaryClockSkewSlowTrip(t *testing.T) {
	const slow = 600 * time.Millisecond // within the test's answer timeout
	for _, tt := range []struct {
		name                 string
		skew                 time.Duration
		pingDelay, pongDelay time.Duration
		answerTimeout        time.Duration // 0: attackConfig's
	}{
		{"ahead/slow-pong", 3 * time.Second, 0, slow, 0},
		// Slower than the in-flight slack (the default answer timeout is
		// longer): before its deadline as the canary reckoned it.
		{"ahead/slower-pong", 3 * time.Second, 0, 1500 * time.Millisecond, 2 * time.Second},
		{"ahead/slow-ping", 3 * time.Second, slow, 0, 0},
		{"agreed/slow-pong", 0, 0, slow, 0},
		{"behind/slow-pong", -3 * time.Second, 0, slow, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			skewed(t, &guidingGateway{ttl: 2 * time.Second, guideAfter: 2 * time.Second, skew: tt.skew,
				pingDelay: tt.pingDelay, pongDelay: tt.pongDelay}, 1, func(c *Config) {
				if tt.answerTimeout > 0 {
					c.AnswerTimeout = tt.answerTimeout
				}
			})
		})
	}
}

// skewed runs a leaver against g (its config set by set, when not nil)
// until stages stages are judged, and wants each ok: g guides each
// silence at its deadline by its clock.
func skewed(t *testing.T, g *guidingGateway, stages float64, set func(*Config)) {
	t.Helper()
	v, err := token.NewVerifier([]byte(testSecret), token.Rules{})
	if err != nil {
		t.Fatal(err)
	}
	g.verifier = v
	srv := httptest.NewServer(g)
	// Stopped after the canary (cleanups run last first), and its
	// connections' goroutines waited for once it is closed.
	t.Cleanup(g.wg.Wait)
	t.Cleanup(srv.Close)
	cfg := attackConfig("ws" + strings.TrimPrefix(srv.URL, "http") + "/v1/ws")
	cfg.Leavers = 1
	if set != nil {
		set(&cfg)
	}
	before := classes0()
	runCanary(t, cfg)
	waitFor(t, 30*time.Second, "stages judged", func() bool {
		n := 0.0
		for _, c := range classes {
			n += moved(before, c)
		}
		return n >= stages
	})
	for _, c := range classes {
		if n := moved(before, c); n != 0 && c != promise.OK {
			t.Errorf("%v stages %s, want every stage ok: the service guided each at its deadline", n, c)
		}
	}
}

// TestRedisAhead: a pong's renewal time by Redis's clock, less the ping's
// send: the most Redis can be ahead, so that a deadline taken into the
// canary's clock is the earliest the pong allows (Answer.Low), never
// later than it was. Taking the renewal at the pong's arrival, or no
// skew within the trip, put the deadline up to the trip later than it
// was: an on-time guide looked early (TestCanaryClockSkewSlowTrip).
func TestRedisAhead(t *testing.T) {
	ttl := 30 * time.Second
	for _, tt := range []struct {
		name    string
		renewed time.Duration // by Redis's clock, from the send
		want    time.Duration
	}{
		{"at the send", 0, 0},
		{"within the trip", 40 * time.Millisecond, 40 * time.Millisecond},
		{"at the answer", 100 * time.Millisecond, 100 * time.Millisecond},
		{"ahead", 3100 * time.Millisecond, 3100 * time.Millisecond},
		{"behind", -2 * time.Second, -2 * time.Second},
	} {
		a := chatsim.Answer{Sent: t0, At: t0.Add(100 * time.Millisecond), TTL: ttl, Deadline: t0.Add(tt.renewed + ttl)}
		got := redisAhead(a)
		if got != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
		if d := a.Deadline.Add(-got); !d.Equal(a.Low()) {
			t.Errorf("%s: the deadline in our clock %v, want the earliest the pong allows, %v", tt.name, d, a.Low())
		}
	}
}

// TestValidateCheckInterval: StillthereCanaryStopped fires when the
// checker has not reported for 2 minutes. A canary told to check every 5
// minutes is accepted, and then looks stopped to the operator between
// every two checks: a warning that never clears, which teaches them to
// ignore the one that would tell a canary gone blind.
func TestValidateCheckInterval(t *testing.T) {
	c := DefaultConfig()
	c.URL, c.TokenSecret = "ws://gw:8080/v1/ws", testSecret
	c.CheckInterval = 5 * time.Minute
	if err := c.Validate(); err == nil || !strings.HasPrefix(err.Error(), "canary-check-interval:") {
		t.Errorf("a check every 5m: %v, want an error naming canary-check-interval", err)
	}
	c.CheckInterval = time.Minute
	if err := c.Validate(); err != nil {
		t.Errorf("a check every minute: %v", err)
	}
}

// TestCanaryTTLMismatch: the operator told the canary canary-ttl 2s, and
// the canary segment's policy grants 4s (never set, or set apart from
// the canary's settings). The canary's ping users still judge by the
// deadlines their pongs name, but its feed users' deadlines, its cycles
// and its stayers' pace are reckoned from its own setting: guides judged
// early (false) or late, cycles ending before their stages fall due.
// Every pong tells the TTL granted; a canary that does not compare it
// with its setting leaves the operator to find this out from the pages.
func TestCanaryTTLMismatch(t *testing.T) {
	v, err := token.NewVerifier([]byte(testSecret), token.Rules{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		granted time.Duration
		want    float64
	}{{2 * time.Second, 0}, {4 * time.Second, 1}, {1 * time.Second, 1}} {
		t.Run(tt.granted.String(), func(t *testing.T) {
			g := &guidingGateway{ttl: tt.granted, guideAfter: tt.granted, verifier: v}
			srv := httptest.NewServer(g)
			// Stopped after the canary (cleanups run last first), and its
			// connections' goroutines waited for once it is closed.
			t.Cleanup(g.wg.Wait)
			t.Cleanup(srv.Close)
			cfg := attackConfig("ws" + strings.TrimPrefix(srv.URL, "http") + "/v1/ws")
			cfg.Stayers = 1
			initSeries()
			answered0 := testutil.ToFloat64(signalsTotal.WithLabelValues(viaPing, outcomeAnswered))
			mismatch0 := testutil.ToFloat64(ttlMismatches)
			runCanary(t, cfg)
			waitFor(t, 30*time.Second, "two answered pings", func() bool {
				return testutil.ToFloat64(signalsTotal.WithLabelValues(viaPing, outcomeAnswered))-answered0 >= 2
			})
			if got := testutil.ToFloat64(ttlMismatches) - mismatch0; (got > 0) != (tt.want > 0) {
				t.Errorf("the policy grants %v, the canary is told %v: ttl mismatches moved by %v, want moved: %v", tt.granted, cfg.TTL, got, tt.want > 0)
			}
		})
	}
}
