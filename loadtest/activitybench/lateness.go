package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/gorilla/websocket"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/sync/errgroup"

	"github.com/stillthere/stillthere/pkg/activityfeed"
	"github.com/stillthere/stillthere/pkg/chatsim"
	"github.com/stillthere/stillthere/pkg/config"
	"github.com/stillthere/stillthere/pkg/devstack"
	"github.com/stillthere/stillthere/pkg/guide"
	"github.com/stillthere/stillthere/pkg/session"
)

// Timing of the lateness run.
const (
	// tick is how often the drivers look which users are due to act.
	tick = 20 * time.Millisecond
	// dialers bounds the WebSocket connects in flight at the start.
	dialers = 8
	// upWithin bounds the wait for the feed to make its topic.
	upWithin = 30 * time.Second
	// warm is how long, past two periods, the users have to get their
	// sessions before the first silence.
	warm = 2 * time.Second
	// settle is how long past the grace after the latest deadline a
	// silent user's guide is waited for before it is called lost.
	settle = 5 * time.Second
	// tail is how long the active users stay active after the last
	// silent user's guide, so that a guide decided late (a double, one
	// to a user who was there) is counted too.
	tail = 2 * time.Second
	// keyPrefix is the run's Redis key prefix.
	keyPrefix = "ab"
)

// lateSettings size the lateness run.
type lateSettings struct {
	silent, active int           // users of each feed who go silent, and who stay active
	ttl            time.Duration // the session TTL; users act every quarter of it
	spread         time.Duration // the silences begin spread over this
	stamp          time.Duration // how often the feed stamps its watermark
	partitions     int           // of the activity topic
	baseline       bool          // run the WebSocket crowd again with the feed off
}

// Lateness is the guide lateness of topic-fed sessions beside
// WebSocket-fed ones, in one stack with the activity feed on.
type Lateness struct {
	SilentPerFeed int     `json:"silent_per_feed"`
	ActivePerFeed int     `json:"active_per_feed"`
	TTLMS         float64 `json:"ttl_ms"`
	StampMS       float64 `json:"stamp_ms"`
	SpreadMS      float64 `json:"spread_ms"`
	GraceMS       float64 `json:"grace_ms"`
	Partitions    int     `json:"partitions"`
	// Topic and WebSocket are each feed's users.
	Topic     FeedLateness `json:"topic"`
	WebSocket FeedLateness `json:"websocket"`
	// The topic-fed guides' lateness over the WebSocket-fed ones'.
	RatioP50 float64 `json:"ratio_p50"`
	RatioP99 float64 `json:"ratio_p99"`
	RatioMax float64 `json:"ratio_max"`
	// Held counts the timeouts the listener held, by rule, during the
	// silences; activity-lag is the feed's watermark.
	Held map[string]int `json:"held"`
	// Posts is the webhook's posts, repeats included; LaterStages the
	// distinct guides of a stage after the first (none expected).
	Posts       int `json:"webhook_posts"`
	LaterStages int `json:"later_stages"`
	// Dropped counts WebSocket pings that could not be sent (the
	// connection had ended): each is a user who may look silent
	// without being so.
	Dropped int `json:"dropped_pings"`
	// Baseline is the WebSocket crowd again, alone in a stack with the
	// feed off; nil when not run. WebSocketOverBaselineP50 is the feed-on
	// WebSocket users' p50 over its own: what the feed costs every guide.
	Baseline                 *Baseline `json:"baseline_feed_off,omitempty"`
	WebSocketOverBaselineP50 float64   `json:"websocket_over_baseline_p50,omitempty"`
	Seconds                  float64   `json:"seconds"`
}

// Baseline is the WebSocket crowd with the feed off.
type Baseline struct {
	FeedLateness
	Held    map[string]int `json:"held"`
	Dropped int            `json:"dropped_pings"`
}

// FeedLateness is one feed's users: what became of them, and how late
// the silent ones' guides came past the deadline each names.
type FeedLateness struct {
	tally
	LateP50MS float64 `json:"late_p50_ms"`
	LateP99MS float64 `json:"late_p99_ms"`
	LateMaxMS float64 `json:"late_max_ms"`
}

// subject is one simulated user. Its driver goroutine owns it while the
// drivers run; the run reads it only after they stopped.
type subject struct {
	uid      string
	feed     feed
	silentAt time.Time // when its silence begins; zero for one active throughout
	next     time.Time // when it acts next
	last     time.Time // when its last activity was sent
	user     *chatsim.User
	conn     *chatsim.Conn // WebSocket users only
}

func (u *subject) due(now time.Time) bool {
	return !now.Before(u.next) && (u.silentAt.IsZero() || now.Before(u.silentAt))
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// lateness runs the crowds twice, each time in a dev stack of its own:
// with the activity feed on, users kept alive only by `active` events on
// the topic beside users kept alive by WebSocket pings; then, unless
// s.baseline is off, the WebSocket users alone with the feed off, for the
// lateness the feed adds to every guide.
func lateness(ctx context.Context, s lateSettings) (*Lateness, error) {
	started := time.Now()
	rep := &Lateness{SilentPerFeed: s.silent, ActivePerFeed: s.active, TTLMS: ms(s.ttl), StampMS: ms(s.stamp),
		SpreadMS: ms(s.spread), Partitions: s.partitions}
	on, err := crowds(ctx, s, true)
	if err != nil {
		return nil, err
	}
	rep.GraceMS = ms(on.grace)
	rep.Held, rep.Posts, rep.LaterStages, rep.Dropped = on.held, on.posts, on.later, on.dropped
	rep.Topic, rep.WebSocket = feedLateness(on.tallies[feedTopic]), feedLateness(on.tallies[feedWebSocket])
	tp, wp := spreadOf(on.tallies[feedTopic].late), spreadOf(on.tallies[feedWebSocket].late)
	rep.RatioP50, rep.RatioP99, rep.RatioMax = ratio(tp.P50, wp.P50), ratio(tp.P99, wp.P99), ratio(tp.Max, wp.Max)
	if s.baseline {
		off, err := crowds(ctx, s, false)
		if err != nil {
			return nil, fmt.Errorf("baseline, feed off: %w", err)
		}
		b := feedLateness(off.tallies[feedWebSocket])
		rep.Baseline = &Baseline{FeedLateness: b, Held: off.held, Dropped: off.dropped}
		rep.WebSocketOverBaselineP50 = ratio(wp.P50, spreadOf(off.tallies[feedWebSocket].late).P50)
	}
	rep.Seconds = time.Since(started).Seconds()
	return rep, nil
}

func feedLateness(t *tally) FeedLateness {
	sp := spreadOf(t.late)
	return FeedLateness{tally: *t, LateP50MS: ms(sp.P50), LateP99MS: ms(sp.P99), LateMaxMS: ms(sp.Max)}
}

// crowdRun is what one run of the crowds saw.
type crowdRun struct {
	tallies      map[feed]*tally
	held         map[string]int
	posts, later int
	dropped      int
	grace        time.Duration
}

// crowds runs the dev stack (redis-server, embedded Kafka, one gateway,
// the listener, a guide consumer with the webhook sender) and the crowds:
// with feedOn, the gateway consumes the activity topic, and users kept
// alive only by `active` events on it join those kept alive by WebSocket
// pings; without, only the WebSocket users run. Of each crowd, s.silent go
// silent at known times spread over s.spread, and s.active stay active to
// the end. Every guide goes to one webhook.
func crowds(ctx context.Context, s lateSettings, feedOn bool) (*crowdRun, error) {
	out := &crowdRun{}
	dir, err := os.MkdirTemp("", "activitybench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	h, err := startHook()
	if err != nil {
		return nil, err
	}
	defer h.close()
	settings := map[string]string{
		"key-prefix":          keyPrefix,
		"gateway-addr":        "127.0.0.1:0",
		"push-addr":           "127.0.0.1:0",
		"listener-admin-addr": "127.0.0.1:0",
		"consumer-admin-addr": "127.0.0.1:0",
		"demo-page":           "false",
		"session-ttl":         s.ttl.String(),
		// No jitter: the deadlines fall where the schedule puts them.
		"session-jitter":            "0s",
		"activity-feed":             strconv.FormatBool(feedOn),
		"activity-stamp":            s.stamp.String(),
		"activity-topic-partitions": strconv.Itoa(s.partitions),
		"sender":                    guide.SenderWebhook,
		"webhook-url":               h.url,
		"webhook-secret":            hookSecret,
		// The silences are no storm: step 4 measures the mass-expiry
		// brake, here it would only hold them for the grace.
		"mass-expiry-floor": strconv.Itoa(2*s.silent + 1),
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	st, err := devstack.Start(ctx, devstack.Options{Env: lookup(settings), DataDir: dir, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("dev stack: %w", err)
	}
	defer st.Close()
	out.grace = st.ListenerConfig.OutageGrace
	sctx, stopStack := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- st.Run(sctx) }()
	defer func() { stopStack(); <-ran }()

	rdb := redis.NewClient(&redis.Options{Addr: st.RedisAddr})
	defer rdb.Close()
	ks, err := session.NewKeyspace(keyPrefix)
	if err != nil {
		return nil, err
	}
	store := session.NewStore(rdb, ks)

	var topicUsers, wsUsers []*subject
	for _, kind := range []string{"silent", "active"} {
		n := s.silent
		if kind == "active" {
			n = s.active
		}
		for i := range n {
			if feedOn {
				topicUsers = append(topicUsers, &subject{uid: fmt.Sprintf("topic-%s-%05d", kind, i), feed: feedTopic})
			}
			wsUsers = append(wsUsers, &subject{uid: fmt.Sprintf("ws-%s-%05d", kind, i), feed: feedWebSocket})
		}
	}
	var prod *kgo.Client
	if feedOn {
		// The feed makes its topic before it reads; a platform's producer
		// must not make it first, with a broker's default partitions.
		if err := waitFor(ctx, upWithin, "the activity feed's watermark on every partition", func() bool {
			_, parts, err := store.ActivityWatermarks(ctx)
			return err == nil && len(parts) == s.partitions
		}); err != nil {
			return nil, err
		}
		if prod, err = kgo.NewClient(kgo.SeedBrokers(st.KafkaBrokers), kgo.DefaultProduceTopic(activityfeed.DefaultTopic)); err != nil {
			return nil, err
		}
		defer prod.Close()
	}
	var readers sync.WaitGroup
	defer func() {
		for _, u := range wsUsers {
			if u.conn != nil {
				u.conn.Close()
			}
		}
		readers.Wait()
	}()
	url := "ws://" + st.Gateway.PublicAddr().String() + "/v1/ws"
	if err := connect(ctx, wsUsers, url, []byte(st.TokenSecret), s.ttl, &readers); err != nil {
		return nil, err
	}

	// Each user acts first within a period, in a stagger, then every
	// period. User i of each crowd falls silent at the same time as the
	// other crowd's, the silences spread evenly over s.spread from t0,
	// once every user has had time to act and get its session.
	period := s.ttl / 4
	now := time.Now()
	for _, us := range [][]*subject{topicUsers, wsUsers} {
		for i, u := range us {
			u.next = now.Add(period * time.Duration(i) / time.Duration(len(us)))
		}
	}
	t0 := now.Add(warm + 2*period)
	var silent []string
	for i := range s.silent {
		at := t0.Add(s.spread * time.Duration(2*i+1) / time.Duration(2*s.silent))
		wsUsers[i].silentAt = at
		silent = append(silent, wsUsers[i].uid)
		if feedOn {
			topicUsers[i].silentAt = at
			silent = append(silent, topicUsers[i].uid)
		}
	}
	heldBefore := held()
	dctx, stopDrivers := context.WithCancel(ctx)
	var drivers errgroup.Group
	if feedOn {
		drivers.Go(func() error { return drive(dctx, topicUsers, period, sendTopic(prod)) })
	}
	drivers.Go(func() error { return drive(dctx, wsUsers, period, sendWebSocket(&out.dropped)) })
	stop := func() error { stopDrivers(); return drivers.Wait() }
	if err := waitFor(ctx, time.Until(t0), "a session for every user, up to the first silence", func() bool {
		n, err := store.Sessions(ctx)
		return err == nil && n == int64(len(topicUsers)+len(wsUsers))
	}); err != nil {
		stop()
		return nil, err
	}

	// Every silent user's guide, or the grace and settle past the latest
	// deadline any can have: the last silence plus the TTL.
	lastDeadline := t0.Add(s.spread + s.ttl)
	limit := time.Until(lastDeadline.Add(out.grace + settle))
	err = waitFor(ctx, limit, "", func() bool {
		for _, uid := range silent {
			if !h.guided(uid) {
				return false
			}
		}
		return true
	})
	if ctx.Err() != nil {
		stop()
		return nil, ctx.Err()
	}
	// Missing guides are lost, not an error of the bench: judged below.
	if err == nil && !sleepCtx(ctx, tail) {
		stop()
		return nil, ctx.Err()
	}
	if err := stop(); err != nil {
		return nil, err
	}
	out.held = since(held(), heldBefore)
	out.posts, out.later = h.counts()

	var facts []fact
	for _, u := range append(topicUsers, wsUsers...) {
		f := fact{uid: u.uid, feed: u.feed, silent: !u.silentAt.IsZero(), earned: u.last.Add(s.ttl)}
		if u.user != nil {
			// What the last pong proved: the renewal came after the ping.
			f.earned = u.user.Record().Low
		}
		facts = append(facts, f)
	}
	out.tallies = judge(facts, h.guides())
	return out, nil
}

// connect signs each user in and opens its WebSocket, dialers at a time.
func connect(ctx context.Context, users []*subject, url string, secret []byte, ttl time.Duration, readers *sync.WaitGroup) error {
	var g errgroup.Group
	g.SetLimit(dialers)
	for _, u := range users {
		g.Go(func() error {
			tok, err := chatsim.Token(secret, u.uid, "")
			if err != nil {
				return err
			}
			u.user = &chatsim.User{UID: u.uid, Token: tok, TTL: ttl, Readers: readers,
				Dialer: &websocket.Dialer{HandshakeTimeout: 5 * time.Second, ReadBufferSize: 512, WriteBufferSize: 512}}
			if u.conn, err = u.user.Connect(ctx, url); err != nil {
				return fmt.Errorf("connect %s: %w", u.uid, err)
			}
			return nil
		})
	}
	return g.Wait()
}

// drive has each of users act every period until its silence begins,
// through send, until ctx ends. It owns users until it returns.
func drive(ctx context.Context, users []*subject, period time.Duration, send func(context.Context, []*subject) error) error {
	t := time.NewTicker(tick)
	defer t.Stop()
	var due []*subject
	for {
		now := time.Now()
		due = due[:0]
		for _, u := range users {
			if u.due(now) {
				due = append(due, u)
				u.next = now.Add(period)
			}
		}
		if len(due) > 0 {
			if err := send(ctx, due); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// sendTopic returns a send that produces an `active` event for each user,
// keyed by its uid, as a platform's servers do.
func sendTopic(prod *kgo.Client) func(context.Context, []*subject) error {
	return func(ctx context.Context, due []*subject) error {
		recs := make([]*kgo.Record, len(due))
		for i, u := range due {
			recs[i] = &kgo.Record{Key: []byte(u.uid), Value: fmt.Appendf(nil, `{"uid":%q,"kind":"active"}`, u.uid)}
		}
		// Before the produce: the gateway may apply an event before its
		// ack comes back, never before it was sent.
		sent := time.Now()
		if err := prod.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			return fmt.Errorf("produce %d events: %w", len(recs), err)
		}
		for _, u := range due {
			u.last = sent
		}
		return nil
	}
}

// sendWebSocket returns a send that pings on each user's connection,
// counting the pings that could not be sent in dropped.
func sendWebSocket(dropped *int) func(context.Context, []*subject) error {
	return func(_ context.Context, due []*subject) error {
		for _, u := range due {
			at := time.Now()
			if err := u.conn.Ping(true); err != nil {
				*dropped++
				continue
			}
			u.last = at
		}
		return nil
	}
}

// lookup reads settings given by flag name as their STILLTHERE_* names.
func lookup(kv map[string]string) config.Lookup {
	return func(name string) (string, bool) {
		for k, v := range kv {
			if config.EnvName(k) == name {
				return v, true
			}
		}
		return "", false
	}
}

// waitFor polls cond until it holds, within limit; what names the wait
// in the error.
func waitFor(ctx context.Context, limit time.Duration, what string, cond func() bool) error {
	end := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(end) {
			return fmt.Errorf("waited %v for %s", limit.Round(time.Millisecond), what)
		}
		if !sleepCtx(ctx, 50*time.Millisecond) {
			return ctx.Err()
		}
	}
	return nil
}

// sleepCtx reports false if ctx ended first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// heldMetric counts the timeouts the listener held, by rule; the
// listener runs in this process, so it is in the default registry.
const heldMetric = "stillthere_listener_held_total"

func held() map[string]int {
	out := map[string]int{}
	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		return out
	}
	for _, mf := range mfs {
		if mf.GetName() != heldMetric {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "rule" {
					out[l.GetValue()] += int(m.GetCounter().GetValue())
				}
			}
		}
	}
	return out
}

// since is now minus then, per rule, leaving out zeros.
func since(now, then map[string]int) map[string]int {
	out := map[string]int{}
	for k, v := range now {
		if d := v - then[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}
