// Package canary runs synthetic users against a deployment's public
// WebSocket endpoint (and its activity API), judges what they got with the
// promise checker (package promise), and exports the promise as metrics:
// stages by class (ok, late, lost, false, duplicated, ...), their
// lateness, the silences begun and the signals sent, by outcome.
//
// Its users live in a canary segment, which the operator gives a short
// TTL and its stages with "gateway policy set"; the canary is told the
// same TTL and stages. Stayers ping every TTL/3 and are owed nothing: a
// guide to one is false. Leavers ping a few times, then go silent on
// purpose with their connection open, and receive their stages on it;
// feed users do either through the activity API, holding a WebSocket only
// to receive. Each cycle of a user is a uid of its own, so a history is
// short and is judged, then dropped, once its cycle ends.
//
// Each user is one goroutine (plus the reader of its connection, which
// chatsim starts and the user waits for); one more runs the checker every
// CheckInterval and counts each stage's verdict once, when it is final.
// It logs dial failures, rejected activity calls (each ends its cycle),
// a pong's TTL other than the one it was told (once a cycle), and every stage
// that broke the promise, with the checker's reason.
package canary

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/stillthere/stillthere/pkg/admin"
	"github.com/stillthere/stillthere/pkg/lifecycle"
)

// Canary is an opened canary: Open, Run, Close.
type Canary struct {
	cfg     Config
	log     *slog.Logger
	rec     *recorder
	adminLn net.Listener
	client  *http.Client // activity calls
	// run names this process's uids apart from an earlier run's.
	run  string
	runs lifecycle.Runs
	// redisAhead is the latest pong's measure of Redis's clock against
	// ours (see redisAhead), in nanoseconds: the users' goroutines set it
	// and read it to take the deadlines guides name into our clock.
	redisAhead atomic.Int64
}

// setRedisAhead keeps a pong's measure of Redis's clock, and exports it.
func (c *Canary) setRedisAhead(d time.Duration) {
	c.redisAhead.Store(int64(d))
	clockOffset.Set(d.Seconds())
}

// Open validates cfg and takes the admin listener.
func Open(ctx context.Context, cfg Config, logger *slog.Logger) (*Canary, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	initSeries()
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", cfg.AdminAddr)
	if err != nil {
		return nil, fmt.Errorf("canary admin listener: %w", err)
	}
	var b [3]byte
	rand.Read(b[:])
	return &Canary{
		cfg:     cfg,
		log:     logger,
		rec:     newRecorder(),
		adminLn: ln,
		client:  &http.Client{Timeout: cfg.AnswerTimeout},
		run:     hex.EncodeToString(b[:]),
	}, nil
}

// AdminAddr is where health and metrics are served.
func (c *Canary) AdminAddr() net.Addr { return c.adminLn.Addr() }

// Run runs the users and the checker until ctx is done or Close is
// called. It returns once every user's goroutine (and its connection's
// reader) has exited.
func (c *Canary) Run(ctx context.Context) error {
	ctx, end, err := c.runs.Start(ctx)
	if err != nil {
		return err
	}
	defer end()
	c.log.Info("canary running", "url", c.cfg.URL, "segment", c.cfg.Segment, "ttl", c.cfg.TTL,
		"stage_delays", c.cfg.StageDelays, "admin", c.AdminAddr().String(), "run", c.run)
	eg, ctx := errgroup.WithContext(ctx)
	srv := &http.Server{Handler: admin.NewMux(func(context.Context) error { return nil }, false), ReadHeaderTimeout: 5 * time.Second}
	eg.Go(func() error {
		if err := srv.Serve(c.adminLn); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	eg.Go(func() error {
		<-ctx.Done()
		return srv.Close()
	})
	eg.Go(func() error { c.judgeLoop(ctx); return nil })
	users := c.users()
	for i, u := range users {
		// Spread the starts over a ping period, so that the users' signals
		// do not all land at once.
		start := time.Duration(i) * c.cfg.pingEvery() / time.Duration(len(users))
		eg.Go(func() error { c.runUser(ctx, u, start); return nil })
	}
	err = eg.Wait()
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// Close stops Run and frees the listener.
func (c *Canary) Close() error {
	return c.runs.Close(func() error {
		c.client.CloseIdleConnections()
		c.adminLn.Close() // Run's server closed it already, if it ran
		return nil
	})
}

// judgeLoop runs the checker every CheckInterval until ctx is done.
func (c *Canary) judgeLoop(ctx context.Context) {
	t := time.NewTicker(c.cfg.CheckInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			c.judge(now)
		}
	}
}

// judge counts the verdicts that became final at now, and logs each that
// broke the promise.
func (c *Canary) judge(now time.Time) {
	vs := c.rec.judge(c.cfg.promise(), now, c.cfg.settle())
	count(vs)
	for _, v := range vs {
		if v.Class.Failure() {
			c.log.Warn("canary: promise broken", "class", string(v.Class), "uid", v.UID, "stage", v.Stage,
				"deadline", v.Deadline, "due", v.Due, "bound", v.Bound, "why", v.Why)
		}
	}
	lastCheck.Set(float64(now.UnixMilli()) / 1000)
	historiesHeld.Set(float64(c.rec.size()))
}
