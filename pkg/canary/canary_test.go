package canary

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/stillthere/stillthere/pkg/frame"
	"github.com/stillthere/stillthere/pkg/token"
)

// fakeGateway answers pings with a pong that grants ttl, and misbehaves
// on purpose: it guides a stayer after its second ping (a false guide),
// and guides a leaver's silence once, at its deadline, as a close stage.
type fakeGateway struct {
	ttl      time.Duration
	verifier *token.Verifier
	wg       sync.WaitGroup // the connections' goroutines
}

func (g *fakeGateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// Counted before the server may count the request done (a hijack
	// is done, for httptest): once the server is closed, every handler
	// that will run is counted, and the wait for them races no Add.
	g.wg.Add(1)
	defer g.wg.Done()
	claims, err := g.verifier.Verify(strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "))
	if err != nil || claims.Segment != "canary" {
		http.Error(w, "bad token", http.StatusUnauthorized)
		return
	}
	ws, err := (&websocket.Upgrader{}).Upgrade(w, r, nil)
	if err != nil {
		return
	}
	defer ws.Close()
	var deadline time.Time
	pings := 0
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	frames, done := make(chan []byte), make(chan struct{})
	defer close(done)
	g.wg.Go(func() {
		defer close(frames)
		for {
			_, b, err := ws.ReadMessage()
			if err != nil {
				return
			}
			select {
			case frames <- b:
			case <-done:
				return
			}
		}
	})
	for {
		select {
		case b, ok := <-frames:
			if !ok {
				return
			}
			f, _ := frame.Parse(b)
			if f.Type != frame.TypePing {
				continue
			}
			pings++
			deadline = time.Now().Add(g.ttl)
			timer.Reset(g.ttl)
			ws.WriteMessage(websocket.TextMessage, frame.Pong(g.ttl.Milliseconds(), deadline.UnixMilli()))
			if strings.Contains(claims.UID, "-stay-") && pings == 2 {
				ws.WriteMessage(websocket.TextMessage, frame.Guide("false-"+claims.UID, "?", deadline.Add(-time.Second).UnixMilli(), 1, false))
			}
		case <-timer.C:
			ws.WriteMessage(websocket.TextMessage, frame.Guide("g-"+claims.UID, "closed", deadline.UnixMilli(), 1, true))
			ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(frame.CloseInactive, "inactive"), time.Now().Add(time.Second))
			return
		}
	}
}

// TestCanaryJudgesAGateway runs the canary against the fake gateway: the
// leavers' stages are ok, the stayer's guide is false, and the stages are
// counted once each.
func TestCanaryJudgesAGateway(t *testing.T) {
	// The gateway requires an issuer and an audience, as production's do.
	v, err := token.NewVerifier([]byte(testSecret), token.Rules{Issuer: "https://login.example", Audience: "stillthere"})
	if err != nil {
		t.Fatal(err)
	}
	g := &fakeGateway{ttl: 2 * time.Second, verifier: v}
	srv := httptest.NewServer(g)
	// Closed before its connections' goroutines are waited for.
	defer g.wg.Wait()
	defer srv.Close()

	cfg := DefaultConfig()
	cfg.URL = "ws" + strings.TrimPrefix(srv.URL, "http") + "/v1/ws"
	cfg.TokenSecret = testSecret
	cfg.TokenIssuer, cfg.TokenAudience = "https://login.example", "stillthere"
	cfg.TTL, cfg.Jitter, cfg.StageDelays = 2*time.Second, 0, nil
	cfg.Stayers, cfg.Leavers, cfg.LeavePings = 1, 2, 1
	cfg.StayFor = 10 * time.Second
	cfg.Slack, cfg.AnswerTimeout = time.Second, time.Second
	cfg.CheckInterval = 100 * time.Millisecond
	cfg.Window = time.Minute
	cfg.AdminAddr = "127.0.0.1:0"

	initSeries()
	ok0 := testutil.ToFloat64(stagesTotal.WithLabelValues("ok"))
	false0 := testutil.ToFloat64(stagesTotal.WithLabelValues("false"))
	bad0 := map[string]float64{}
	for _, class := range []string{"lost", "duplicated", "late"} {
		bad0[class] = testutil.ToFloat64(stagesTotal.WithLabelValues(class))
	}
	c, err := Open(context.Background(), cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(context.Background()) }()
	waitFor(t, 30*time.Second, "at least 4 stages judged ok and 1 false", func() bool {
		return testutil.ToFloat64(stagesTotal.WithLabelValues("ok"))-ok0 >= 4 &&
			testutil.ToFloat64(stagesTotal.WithLabelValues("false"))-false0 >= 1
	})
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	// The stayer's one false guide, counted once, however many checks ran.
	if got := testutil.ToFloat64(stagesTotal.WithLabelValues("false")) - false0; got != 1 {
		t.Errorf("false moved by %v, want 1", got)
	}
	for _, class := range []string{"lost", "duplicated", "late"} {
		if got := testutil.ToFloat64(stagesTotal.WithLabelValues(class)) - bad0[class]; got != 0 {
			t.Errorf("%s: %v, want none", class, got)
		}
	}
}
