// Package guide is the guide consumer: a Kafka consumer group that reads
// timeout events and sends each silent user one "are you still there?".
//
// Each record is settled once: delivered (or queued to the user's inbox),
// skipped because the user is back or the event is too old, or sent to the
// dead-letter topic. Both skips are judged by Redis: the session check
// also reads Redis's clock, which wrote the deadline, so that this host's
// clock never decides an event's age. Offsets are committed only up to
// the first record not yet settled. The session check and the send go
// through a circuit breaker each; while one is open, fetching pauses,
// unsent records are held, and one probe goes out per breaker timeout.
// A notify stage goes to the platform's notify webhook, through a breaker
// of its own that holds only notify stages (see pausingStates).
// Every send carries the event id as its idempotency key, so a crash
// between send and commit shows the user nothing twice.
//
// It serves /healthz, /readyz and /metrics on Config.AdminAddr and logs
// through the slog logger it is given; a downstream failing for many
// records logs through an outage.Log, a few lines per outage.
package guide

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"
	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/sync/errgroup"

	"github.com/stillthere/stillthere/pkg/admin"
	"github.com/stillthere/stillthere/pkg/kafka"
	"github.com/stillthere/stillthere/pkg/lifecycle"
	"github.com/stillthere/stillthere/pkg/outage"
	"github.com/stillthere/stillthere/pkg/redisconn"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeline"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
	"github.com/stillthere/stillthere/pkg/userid"
)

// Dead-letter record headers, as package kafka writes them.
const (
	HeaderDLQReason    = kafka.HeaderDLQReason
	HeaderDLQTopic     = kafka.HeaderDLQTopic
	HeaderDLQPartition = kafka.HeaderDLQPartition
	HeaderDLQOffset    = kafka.HeaderDLQOffset
)

// Consumer is an opened guide consumer: Open, then Run, then Close.
type Consumer struct {
	runs     lifecycle.Runs // ties Run to Close
	cfg      Config
	log      *slog.Logger
	rdb      redis.UniversalClient
	keyspace session.Keyspace
	client   *kgo.Client
	sender   sender
	// transport carries the sender's and the notifier's requests.
	transport *syncTransport
	templates map[string]string
	adminLn   net.Listener
	lagEvery  time.Duration // lagInterval; tests shorten it
	// checks gathers the session checks of the records in flight into
	// one round trip; the dispatch loop runs it.
	checks *checkBatcher
	// unasked: whether a reminder asked the user, for the silences
	// between stages; a close of one never asked is dropped.
	unasked unasked

	// timeline records each settlement in its user's timeline; nil when
	// recording is off. Run runs it, and stops it after the last send.
	timeline *timeline.Recorder

	// notifier posts notify stages to the platform's notify webhook; nil
	// when none is set, and a notify stage is dead-lettered.
	notifier *webhookSender

	// breaker guards the sender, named for it; notifyBreaker the
	// notifier; redisBreaker the session check.
	breaker       *gobreaker.CircuitBreaker[Sent]
	notifyBreaker *gobreaker.CircuitBreaker[Sent]
	redisBreaker  *gobreaker.CircuitBreaker[sessionCheck]

	// One log per condition that fails for many records at once, so that
	// an outage logs a few lines, not one per record.
	checkOutage, sendOutage, notifyOutage, dlqOutage, fetchOutage *outage.Log

	// The rebalance callbacks, on the client's goroutine, hand their
	// partitions to the dispatch loop, which owns all record state.
	rebalance chan rebalanceReq
	loopDone  chan struct{} // closed once the loop no longer answers
	endLoop   sync.Once
}

var _ lifecycle.Service = (*Consumer)(nil)

// Open connects to Redis and Kafka, creates the dead-letter topic, joins
// the group and binds the admin listener. What fails on the way is freed
// by Close.
func Open(ctx context.Context, cfg Config, logger *slog.Logger) (_ *Consumer, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("guide consumer config: %w", err)
	}
	templates, err := cfg.templates()
	if err != nil {
		return nil, fmt.Errorf("guide consumer config: %w", err)
	}
	c := &Consumer{
		cfg:       cfg,
		log:       logger,
		keyspace:  cfg.Redis.Keyspace(),
		templates: templates,
		lagEvery:  lagInterval,
		rebalance: make(chan rebalanceReq),
		loopDone:  make(chan struct{}),
	}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	if c.rdb, err = redisconn.Open(ctx, cfg.Redis); err != nil {
		return nil, err
	}
	if err := redisconn.CheckEviction(ctx, c.rdb); err != nil {
		logger.Warn("Redis may evict session keys; give it maxmemory-policy noeviction", "err", err)
	}
	c.timeline = cfg.Timeline.Recorder(session.NewStore(c.rdb, c.keyspace),
		timeline.Config{Service: "consumer", Instance: newInstanceName(), Log: logger})
	// The transport bounds each request by SendTimeout: a Client.Timeout
	// would start a goroutine and a timer per request for a transport
	// that is not net/http's own.
	c.transport = newSyncTransport(cfg.SendTimeout, min(cfg.MaxInFlight, 1024))
	httpc := &http.Client{
		// A redirect is not an answer: the status says what happened.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		Transport:     c.transport,
	}
	switch cfg.Sender {
	case SenderWebhook:
		c.sender = &webhookSender{url: cfg.WebhookURL, secret: []byte(cfg.WebhookSecret), client: httpc}
	default:
		c.sender = &gatewaySender{url: cfg.PushURL, secret: cfg.PushSecret, client: httpc}
	}
	if url, secret := cfg.notifyTarget(); url != "" {
		c.notifier = &webhookSender{url: url, secret: []byte(secret), client: httpc, what: "notify stage"}
	}
	c.checks = newCheckBatcher(c.checkSessions, cfg.SendTimeout, cfg.MaxInFlight)
	c.breaker = newBreaker[Sent](cfg.Sender, cfg, logger)
	c.notifyBreaker = newBreaker[Sent](downstreamNotify, cfg, logger)
	c.redisBreaker = newBreaker[sessionCheck](downstreamRedis, cfg, logger)
	c.checkOutage = outage.NewLog(logger.With("downstream", downstreamRedis), "check sessions", 0)
	c.sendOutage = outage.NewLog(logger.With("downstream", cfg.Sender), "send guides", 0)
	c.notifyOutage = outage.NewLog(logger.With("downstream", downstreamNotify), "notify the platform", 0)
	c.dlqOutage = outage.NewLog(logger.With("topic", cfg.DLQTopic), "dead-letter records", 0)
	c.fetchOutage = outage.NewLog(logger.With("topic", cfg.Kafka.Topic), "fetch records", 0)

	if c.client, err = kafka.NewClient(cfg.Kafka, logger,
		kgo.ConsumerGroup(cfg.Group),
		kgo.SessionTimeout(cfg.GroupSessionTimeout),
		kgo.HeartbeatInterval(min(3*time.Second, cfg.GroupSessionTimeout/3)),
		kgo.ConsumeTopics(cfg.Kafka.Topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		// Only marked (settled) records are ever committed: with plain
		// DisableAutoCommit, CommitUncommittedOffsets would also commit
		// records polled but not yet settled, on revoke and at shutdown.
		kgo.AutoCommitMarks(),
		// Commit settled marks every second: less to send again after a
		// crash, and lag that tells the truth.
		kgo.AutoCommitInterval(time.Second),
		// A poll's records reach the dispatch loop before a rebalance can
		// revoke their partition; the loop allows it right after.
		kgo.BlockRebalanceOnPoll(),
		kgo.OnPartitionsAssigned(c.onAssigned),
		kgo.OnPartitionsRevoked(c.onRevoked),
		kgo.OnPartitionsLost(c.onLost),
		kgo.ProducerLinger(0),
	); err != nil {
		return nil, err
	}
	dlq := cfg.Kafka
	dlq.Topic = cfg.DLQTopic
	if err := kafka.EnsureTopic(ctx, c.client, dlq); err != nil {
		return nil, fmt.Errorf("dlq-topic: %w", err)
	}
	if c.adminLn, err = net.Listen("tcp", cfg.AdminAddr); err != nil {
		return nil, fmt.Errorf("listen on consumer-admin-addr: %w", err)
	}
	return c, nil
}

// Close stops Run if it runs and waits for it (see Run), then leaves the
// group and frees what Open took. The loop has stopped (or never ran), so
// the revoke callback that leaving the group runs does not wait for it.
// Later calls return the first one's error.
func (c *Consumer) Close() error {
	return c.runs.Close(func() error {
		c.endLoop.Do(func() { close(c.loopDone) })
		if c.client != nil {
			c.client.AllowRebalance() // a poll the loop never took must not block the leave
			c.client.Close()
		}
		var err error
		if c.rdb != nil {
			err = c.rdb.Close()
		}
		if c.adminLn != nil {
			c.adminLn.Close() // Run's server closed it already, if it ran
		}
		if c.transport != nil {
			c.transport.CloseIdleConnections()
		}
		return err
	})
}

// AdminAddr is where health and metrics are served.
func (c *Consumer) AdminAddr() net.Addr { return c.adminLn.Addr() }

// Run consumes until ctx is done or Close is called, then lets the sends
// under way finish and commits what was settled. Close leaves the group.
func (c *Consumer) Run(ctx context.Context) error {
	ctx, end, err := c.runs.Start(ctx)
	if err != nil {
		return err
	}
	defer end()
	// The timeline's recorder outlives the loop: it stops once the last
	// send has settled (and been recorded), and sends what it still
	// holds before Run returns.
	if c.timeline != nil {
		tctx, stopTimeline := context.WithCancel(context.WithoutCancel(ctx))
		timelineDone := make(chan struct{})
		go func() {
			defer close(timelineDone)
			c.timeline.Run(tctx)
		}()
		defer func() {
			stopTimeline()
			<-timelineDone
		}()
	}
	c.log.Info("guide consumer running", "group", c.cfg.Group, "topic", c.cfg.Kafka.Topic,
		"sender", c.cfg.Sender, "dlq_topic", c.cfg.DLQTopic, "admin", c.AdminAddr().String())
	eg, ctx := errgroup.WithContext(ctx)
	srv := &http.Server{Handler: admin.NewMux(c.ready, c.cfg.Pprof), ReadHeaderTimeout: 5 * time.Second}
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
	eg.Go(func() error { return c.exportLag(ctx) })
	eg.Go(func() error {
		defer c.endLoop.Do(func() { close(c.loopDone) })
		return newLoop(c).run(ctx)
	})
	err = eg.Wait()
	// Commit what was settled before leaving the group.
	cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if cerr := c.client.CommitMarkedOffsets(cctx); cerr != nil {
		c.log.Warn("final commit", "err", cerr)
	}
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

func (c *Consumer) ready(ctx context.Context) error {
	if err := c.rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	if err := c.client.Ping(ctx); err != nil {
		return fmt.Errorf("kafka: %w", err)
	}
	return nil
}

// process takes one record as far as it goes: to a settled outcome, or to
// an error meaning "try again later". It runs on its own goroutine, one
// per record in flight, started and awaited by the loop. Each settlement
// goes to its user's timeline once it has taken effect.
func (c *Consumer) process(ctx context.Context, r *kgo.Record, sendTried *bool) (Outcome, error) {
	ev, err := timeoutevent.Parse(r.Value)
	if err != nil {
		if err := c.deadLetter(ctx, r, err.Error()); err != nil {
			return "", err
		}
		c.log.Error("dead-lettered a record that is not a timeout event", "partition", r.Partition, "offset", r.Offset, "err", err)
		// The listener keys each record by its uid: the user's timeline
		// shows the poison record too, when its key names one.
		if uid := string(r.Key); userid.Valid(uid) {
			c.record(uid, settlement{outcome: OutcomeInvalid, reason: err.Error()})
		}
		return OutcomeInvalid, nil
	}
	// Even a too old event waits for Redis: only its clock says so.
	check, err := c.redisBreaker.Execute(func() (sessionCheck, error) {
		// A check waits for the batch out, if any, and then goes in the
		// next: two round trips, each bounded by SendTimeout in the
		// batcher. Cut off at one, a check asked for mid-batch failed
		// whenever Redis took over half of SendTimeout, opening the
		// breaker although every round trip was in time.
		ctx, cancel := context.WithTimeout(ctx, 2*c.cfg.SendTimeout)
		defer cancel()
		return c.checks.check(ctx, ev.UID)
	})
	track(c.checkOutage, err)
	if err != nil {
		return "", err
	}
	if outcome := needless(ev, check, c.cfg.GuideMaxAge); outcome != "" {
		if outcome == OutcomeStale {
			// Another silence in this minute window gets its own guide
			// at once, rather than at the window's end. Best effort: if
			// the mark is lost, that silence still gets its guide, later.
			mctx, cancel := context.WithTimeout(ctx, c.cfg.SendTimeout)
			if err := session.NewStore(c.rdb, c.keyspace).MarkStale(mctx, ev.UID, ev.Stage, time.UnixMilli(ev.DueMS), ev.Deadline()); err != nil {
				c.log.Debug("mark a stale timeout in its dedup window", "uid", ev.UID, "err", err)
			}
			cancel()
		}
		c.record(ev.UID, settlement{ev: ev, outcome: outcome, needless: true, check: check, maxAge: c.cfg.GuideMaxAge})
		if *sendTried {
			// An earlier attempt may have shown it, its answer lost: the
			// user may have been asked.
			c.unasked.mayHaveAsked(ev)
		} else {
			c.unasked.settled(ev, outcome)
		}
		return outcome, nil
	}
	if c.unasked.closes(ev) {
		c.record(ev.UID, settlement{ev: ev, outcome: OutcomeTooOld, unasked: true})
		c.unasked.settled(ev, OutcomeTooOld)
		return OutcomeTooOld, nil
	}
	g := Guide{ID: ev.ID, UID: ev.UID, Segment: ev.Segment, Text: c.text(ev), DeadlineMS: ev.DeadlineMS, DueMS: ev.DueMS,
		DetectedMS: ev.DetectedMS, Stage: ev.Stage, Action: ev.Action, Final: ev.Final, Reason: ev.Reason}
	breaker, send, outage := c.breaker, c.sender.Send, c.sendOutage
	if ev.Action == timeoutevent.ActionNotify {
		breaker, send, outage = c.notifyBreaker, c.notify, c.notifyOutage
	}
	sent, err := breaker.Execute(func() (Sent, error) {
		start := time.Now()
		defer func() { metricSendSeconds.Observe(time.Since(start).Seconds()) }()
		sent, err := send(ctx, g)
		if err != nil && mayHaveShown(err) {
			*sendTried = true
		}
		return sent, err
	})
	track(outage, err)
	if isPermanent(err) {
		if err := c.deadLetter(ctx, r, err.Error()); err != nil {
			return "", err
		}
		c.log.Error("guide refused by downstream, dead-lettered", "uid", ev.UID, "guide_id", ev.ID, "err", err)
		c.record(ev.UID, settlement{ev: ev, outcome: OutcomeRejected, reason: err.Error(), code: permanentCode(err)})
		return OutcomeRejected, nil
	}
	if err != nil {
		return "", err
	}
	observeSent(ev, sent.Outcome)
	c.record(ev.UID, settlement{ev: ev, sender: c.cfg.Sender, outcome: sent.Outcome, sent: sent})
	c.unasked.settled(ev, sent.Outcome)
	return sent.Outcome, nil
}

// errNoNotifier refuses a notify stage where no notify webhook is set.
var errNoNotifier = errors.New("a notify stage, and no notify webhook: set notify-url (the platform's endpoint for notify stages)")

// notify posts a notify stage to the platform's notify webhook. With none
// set it is refused for good: dead-lettered, so that it is kept, and
// named, rather than retried forever or dropped.
func (c *Consumer) notify(ctx context.Context, g Guide) (Sent, error) {
	if c.notifier == nil {
		return Sent{}, permanentError{fmt.Errorf("notify stage %s: %w", g.ID, errNoNotifier), 0}
	}
	return c.notifier.Send(ctx, g)
}

// record adds a settlement's entries to uid's timeline, without waiting.
func (c *Consumer) record(uid string, s settlement) {
	if c.timeline == nil {
		return
	}
	for _, e := range s.entries() {
		c.timeline.Record(uid, e)
	}
}

// text is what the guide of ev says: its stage's text from the timeout
// policy, or, when the policy gives none, the segment's template or the
// default guide text.
func (c *Consumer) text(ev timeoutevent.Event) string {
	if ev.Text != "" || ev.Action == timeoutevent.ActionNotify {
		return ev.Text
	}
	if text, ok := c.templates[ev.Segment]; ok {
		return text
	}
	return c.cfg.GuideText
}

// deadLetter copies r to the dead-letter topic with the reason in a header.
// dlqTimeout bounds producing one dead letter.
const dlqTimeout = 10 * time.Second

func (c *Consumer) deadLetter(ctx context.Context, r *kgo.Record, reason string) error {
	// Kafka's own pace, not the downstream's: a dead letter that fails is
	// retried by sending the guide again, which a refused guide should not
	// be for a slow first metadata load.
	ctx, cancel := context.WithTimeout(ctx, max(c.cfg.SendTimeout, dlqTimeout))
	defer cancel()
	if err := kafka.ProduceDeadLetter(ctx, c.client, r, c.cfg.DLQTopic, reason); err != nil {
		err = fmt.Errorf("dead-letter %s/%d@%d: %w", r.Topic, r.Partition, r.Offset, err)
		track(c.dlqOutage, err)
		return err
	}
	c.dlqOutage.OK()
	return nil
}

// track books one call to a downstream on its outage log. A breaker
// refusing the call, or our own cancellation, says nothing about the
// downstream; a permanentError is the downstream answering.
func track(o *outage.Log, err error) {
	switch {
	case err == nil || isPermanent(err):
		o.OK()
	case isBreakerRefusal(err) || errors.Is(err, context.Canceled):
	default:
		o.Fail(err)
	}
}
