// Package activityfeed consumes the activity topic: the platform's servers
// tell us there what their users did and whose turn it is, one JSON event
// per record keyed by uid. A consumer group shares the partitions; each
// member applies its records in order, dead-letters those it refuses, and
// stamps the feed's watermark in Redis (session.Store.ActivityCaughtUp), so
// that the listener judges no deadline the feed has not been applied past.
// What a record means is the caller's: the feed hands batches of records
// to a Prepare function, applies what it returns, and does the Kafka and
// the watermark.
package activityfeed

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/stillthere/stillthere/pkg/config"
	"github.com/stillthere/stillthere/pkg/kafka"
	"github.com/stillthere/stillthere/pkg/outage"
	"github.com/stillthere/stillthere/pkg/session"
)

// Config says where the activity topic is and how its consumer behaves.
type Config struct {
	// Enabled runs the feed. Default false.
	Enabled bool
	// Kafka is the brokers and their security; its Topic is the activity
	// topic, created with its Partitions when missing.
	Kafka kafka.Config
	// Group is the consumer group. Default "stillthere-activity".
	Group string
	// DeadLetterTopic receives the records Apply refuses, with the reason
	// in a header. Default the topic with "-dlq".
	DeadLetterTopic string
	// Stamp is how often the watermark is stamped. Default 250ms.
	Stamp time.Duration
	// Gap is the longest step of a partition's watermark that is not a
	// blind interval: a feed that lagged longer, or a Kafka that was down,
	// may still bring records of that time. Default 5s.
	Gap time.Duration
	// MaxBatch is the most records applied at once. Default 4000: each
	// Redis script call of a batch is one per bucket its users fall in, and
	// its cost is spread over more events (4000 took a tenth less Redis
	// time per event than 1000).
	MaxBatch int
	// GroupSessionTimeout is how long a member that stopped heartbeating
	// (killed, cut off) keeps its partitions before the group hands them
	// to the others. Until then its partitions' watermark stands still
	// and the listener holds every deadline past it, of every user: a
	// fleet-wide hold, so shorter than franz-go's 45s. Default 10s; the
	// brokers allow 6s to 30m unless configured otherwise.
	GroupSessionTimeout time.Duration
}

// Defaults.
const (
	DefaultTopic    = "session-activity"
	DefaultGroup    = "stillthere-activity"
	DefaultStamp    = 250 * time.Millisecond
	DefaultGap      = 5 * time.Second
	DefaultMaxBatch = 4000
	// DefaultGroupSessionTimeout bounds the fleet-wide hold a killed
	// member causes to about ten seconds.
	DefaultGroupSessionTimeout = 10 * time.Second
)

// DefaultConfig is the feed's settings by default: off; on, the activity
// topic of a local broker.
func DefaultConfig() Config {
	k := kafka.DefaultConfig()
	k.Topic = DefaultTopic
	return Config{Kafka: k, Group: DefaultGroup, Stamp: DefaultStamp, Gap: DefaultGap, GroupSessionTimeout: DefaultGroupSessionTimeout, MaxBatch: DefaultMaxBatch}
}

// WithDefaults fills what c leaves empty.
func (c Config) WithDefaults() Config {
	if c.Kafka.Topic == "" {
		c.Kafka.Topic = DefaultTopic
	}
	if c.Group == "" {
		c.Group = DefaultGroup
	}
	if c.DeadLetterTopic == "" {
		c.DeadLetterTopic = c.Kafka.Topic + "-dlq"
	}
	if c.Stamp == 0 {
		c.Stamp = DefaultStamp
	}
	if c.Gap == 0 {
		c.Gap = DefaultGap
	}
	if c.MaxBatch == 0 {
		c.MaxBatch = DefaultMaxBatch
	}
	if c.GroupSessionTimeout == 0 {
		c.GroupSessionTimeout = DefaultGroupSessionTimeout
	}
	return c
}

// Bind registers the feed's settings, Kafka's included.
func (c *Config) Bind(b *config.Binder) {
	d := DefaultConfig()
	b.Bool(&c.Enabled, "activity-feed", d.Enabled, "consume the activity topic: the platform's servers' activity and turns (docs/protocol.md)")
	b.String(&c.Kafka.Topic, "activity-topic", d.Kafka.Topic, "topic of activity events, one JSON event per record keyed by uid")
	b.Int(&c.Kafka.Partitions, "activity-topic-partitions", d.Kafka.Partitions, "partitions of the activity topic, when it is created: the consumer group scales up to this many members")
	b.Int(&c.Kafka.ReplicationFactor, "activity-topic-replication", d.Kafka.ReplicationFactor, "replication factor of the activity topic and its dead-letter topic, when created")
	b.String(&c.Group, "activity-group", d.Group, "consumer group of the activity topic")
	b.Duration(&c.GroupSessionTimeout, "activity-group-session-timeout", d.GroupSessionTimeout, "how long a crashed gateway keeps its activity partitions, and every deadline held, before the group moves them")
	b.String(&c.DeadLetterTopic, "activity-dlq-topic", "", "topic of refused activity records; default the activity topic with -dlq")
	b.Int(&c.MaxBatch, "activity-max-batch", d.MaxBatch, "most activity records applied at once: a larger batch spreads each Redis script call's cost over more events, and holds a rebalance a little longer")
	b.Duration(&c.Stamp, "activity-stamp", d.Stamp, "how often the activity watermark is stamped in Redis")
	b.Duration(&c.Gap, "activity-gap", d.Gap, "a partition that lagged longer than this records a blind interval: deadlines in it wait for the listener's grace after it")
	c.Kafka.BindClient(b)
}

// Validate names the first bad field.
func (c Config) Validate() error {
	switch {
	case c.DeadLetterTopic == c.Kafka.Topic:
		return fmt.Errorf("activity-dlq-topic: %q is the activity topic itself", c.DeadLetterTopic)
	case c.Stamp < 10*time.Millisecond || c.Stamp > 10*time.Second:
		return fmt.Errorf("activity-stamp: %v, want between 10ms and 10s", c.Stamp)
	case c.Gap < 4*c.Stamp:
		return fmt.Errorf("activity-gap: %v, want at least four stamps (%v)", c.Gap, 4*c.Stamp)
	case c.MaxBatch < 1 || c.MaxBatch > 100_000:
		return fmt.Errorf("activity-max-batch: %d, want 1 to 100000", c.MaxBatch)
	case c.GroupSessionTimeout < 6*time.Second || c.GroupSessionTimeout > 30*time.Minute:
		// Kafka's brokers refuse a session shorter than 6s unless told
		// otherwise: a member that never joins never stamps, and the
		// listener would hold every deadline.
		return fmt.Errorf("activity-group-session-timeout: %v, want between 6s and 30m (the brokers' default bounds)", c.GroupSessionTimeout)
	}
	return c.Kafka.Validate()
}

// Apply applies records of the activity topic, in order. It returns the
// reasons for those it refuses, by index: they go to the dead-letter
// topic, and the rest count as applied. An error means nothing is known
// applied: the same records are handed again, so applying a record twice
// must change nothing the first did not.
type Apply func(ctx context.Context, recs []*kgo.Record) (refused map[int]string, err error)

// Prepare readies a batch of records for applying, without I/O (parsing
// them, say), and returns what applies them, as an Apply of those
// records does. The feed prepares a batch while the one before it
// applies; the batches apply one at a time, in order.
type Prepare func(recs []*kgo.Record) func(ctx context.Context) (refused map[int]string, err error)

// Unprepared is the Prepare of apply: nothing ahead, all as it applies.
func Unprepared(apply Apply) Prepare {
	return func(recs []*kgo.Record) func(context.Context) (map[int]string, error) {
		return func(ctx context.Context) (map[int]string, error) { return apply(ctx, recs) }
	}
}

// Feed is one member of the activity consumer group.
type Feed struct {
	cfg     Config
	log     *slog.Logger
	store   *session.Store
	prepare Prepare
	cl      *kgo.Client
	adm     *kadm.Client

	mu    sync.Mutex // guards tr and marks: the rebalance callbacks run on the client's goroutine
	tr    *tracker
	marks map[int32]time.Time // the watermark last stamped, by partition
	// count is the topic's partitions as last written, at counted, and
	// looked when they were last asked for (the loop's own).
	count           int
	counted, looked time.Time
	// skew is this host's clock less Redis's, at the last stamp.
	skew    time.Duration
	started time.Time

	applyOutage, stampOutage, dlqOutage, fetchOutage *outage.Log
}

// Open makes the group's client. It reaches Kafka only in Run: a gateway
// starts, and serves its WebSockets, while Kafka is down.
func Open(ctx context.Context, cfg Config, store *session.Store, prepare Prepare, logger *slog.Logger) (_ *Feed, err error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := logger.With("topic", cfg.Kafka.Topic)
	f := &Feed{
		cfg: cfg, log: log, store: store, prepare: prepare, tr: newTracker(), marks: map[int32]time.Time{}, started: time.Now(),
		applyOutage: outage.NewLog(log, "apply activity", 0),
		stampOutage: outage.NewLog(log, "stamp the activity watermark", 0),
		dlqOutage:   outage.NewLog(log.With("dlq_topic", cfg.DeadLetterTopic), "dead-letter activity records", 0),
		fetchOutage: outage.NewLog(log, "fetch activity records", 0),
	}
	if f.cl, err = kafka.NewClient(cfg.Kafka, logger,
		kgo.ConsumerGroup(cfg.Group),
		kgo.ConsumeTopics(cfg.Kafka.Topic),
		// A member killed holds every deadline until the group moves its
		// partitions: a session timeout of its own, and a heartbeat that
		// tells the others of the rebalance well within it.
		kgo.SessionTimeout(cfg.GroupSessionTimeout),
		kgo.HeartbeatInterval(heartbeatInterval(cfg.GroupSessionTimeout)),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		// A platform may write the topic in transactions: what it aborted
		// never happened, so only committed records are read. Each
		// transaction's marker takes an offset of its own, the partition's
		// end one past it: markers are kept, to count the partition applied
		// past them (see applyBatch), or no checkpoint after a transaction
		// would ever be passed.
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.KeepControlRecords(),
		// A partition added to the topic holds every deadline until a
		// member reads it: find it within half a minute, not five.
		kgo.MetadataMaxAge(30*time.Second),
		// Only applied records are committed.
		kgo.AutoCommitMarks(),
		kgo.AutoCommitInterval(time.Second),
		// A polled batch is applied and marked before its partitions can
		// be revoked; the loop allows the rebalance between batches.
		kgo.BlockRebalanceOnPoll(),
		kgo.OnPartitionsAssigned(f.onAssigned),
		kgo.OnPartitionsRevoked(f.onRevoked),
		kgo.OnPartitionsLost(f.onLost),
		kgo.ProducerLinger(0),
	); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			f.cl.Close()
		}
	}()
	f.adm = kadm.NewClient(f.cl)
	live.add(f)
	return f, nil
}

// heartbeatInterval is a member's heartbeat for a group session timeout:
// a tenth of it, so that the survivors of a member killed learn of the
// rebalance soon after the timeout, at most franz-go's 3s.
func heartbeatInterval(session time.Duration) time.Duration {
	return min(session/10, 3*time.Second)
}

// ensureTopics makes sure the activity topic and its dead-letter topic
// exist.
func (f *Feed) ensureTopics(ctx context.Context) error {
	if err := kafka.EnsureTopic(ctx, f.cl, f.cfg.Kafka); err != nil {
		return fmt.Errorf("activity-topic: %w", err)
	}
	dlq := f.cfg.Kafka
	dlq.Topic = f.cfg.DeadLetterTopic
	if err := kafka.EnsureTopic(ctx, f.cl, dlq); err != nil {
		return fmt.Errorf("activity-dlq-topic: %w", err)
	}
	return nil
}

// Close leaves the group, committing what was applied.
func (f *Feed) Close() {
	live.remove(f)
	f.cl.AllowRebalance()
	f.cl.Close()
}

// Run consumes until ctx is done. This goroutine polls, prepares and
// stamps; one at a time, a goroutine it starts and waits for applies a
// batch (applying), while this one polls and prepares the next. The
// batches apply in the order polled, each after the one before it is
// applied and marked, so a user's records keep their order. A rebalance
// is let in only with no batch applying: a polled batch's partitions
// stay this member's until it is applied.
func (f *Feed) Run(ctx context.Context) {
	// Before anything is read, and without Kafka, Redis learns that a
	// feed exists: one that cannot reach Kafka from its start never
	// stamps, and the listener, which waits only for a feed it knows of,
	// would judge users whose activity sits unread in the topic.
	if !retry(ctx, func() error { return track(f.stampOutage, f.store.ActivityFeedStarting(ctx)) }) {
		return
	}
	// Until the topics are known to exist, nothing is read: the watermark
	// stays where it was, and the listener holds what it must.
	if !retry(ctx, func() error { return track(f.fetchOutage, f.ensureTopics(ctx)) }) {
		return
	}
	var stamped, allowed time.Time
	var cur *applying
	// wait waits for the batch applying, if any: false if ctx ended first
	// (it is not marked, and its partitions' next owner applies it).
	wait := func() bool {
		ok := cur.wait()
		cur = nil
		return ok
	}
	defer func() {
		wait()
		f.cl.AllowRebalance()
	}()
	for ctx.Err() == nil {
		// Stamp once a Stamp, and poll no longer than until the next is
		// due, so that the stamps keep their cadence whether records flow
		// or not: the listener times its holds by it (the stamp interval
		// written with the watermark). A batch applying counts as not
		// applied yet.
		if time.Since(stamped) >= f.cfg.Stamp {
			stamped = time.Now()
			f.stamp(ctx)
		}
		pctx, cancel := context.WithTimeout(ctx, max(f.cfg.Stamp-time.Since(stamped), minPoll))
		fs := f.cl.PollRecords(pctx, f.cfg.MaxBatch)
		cancel()
		if fs.IsClientClosed() {
			return
		}
		f.fetchErrors(ctx, fs)
		recs := fs.Records()
		if len(recs) > 0 {
			apply := f.prepareData(recs)
			if !wait() {
				return
			}
			cur = f.startApply(ctx, recs, apply)
		}
		// Between batches, a rebalance may come in: when a poll brings
		// none, and at least once a rebalanceEvery while they flow, after
		// the batch applying.
		if len(recs) == 0 || time.Since(allowed) >= rebalanceEvery {
			if !wait() {
				return
			}
			f.cl.AllowRebalance()
			allowed = time.Now()
		}
	}
}

// rebalanceEvery is how long, at most, a member whose records keep
// flowing keeps a rebalance out, between the batches it applies one
// after the other: the other members' partitions wait for it, and so
// does their watermark.
const rebalanceEvery = time.Second

// applying is a batch being applied by a goroutine of its own.
type applying struct{ done chan bool }

// startApply applies recs with apply on a goroutine of its own, as
// applyBatch does; wait waits for it.
func (f *Feed) startApply(ctx context.Context, recs []*kgo.Record, apply func(context.Context) (map[int]string, error)) *applying {
	a := &applying{done: make(chan bool, 1)}
	go func() { a.done <- f.applyBatch(ctx, recs, apply) }()
	return a
}

// wait reports whether the batch applied; a nil batch did.
func (a *applying) wait() bool {
	if a == nil {
		return true
	}
	return <-a.done
}

// minPoll is the shortest poll, for a stamp that took longer than its
// interval: records buffered by then are still taken between stamps.
const minPoll = time.Millisecond

// fetchErrors books the errors of a poll that are not its own timeout.
func (f *Feed) fetchErrors(ctx context.Context, fs kgo.Fetches) {
	var failed error
	fs.EachError(func(topic string, p int32, err error) {
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
			return
		}
		failed = fmt.Errorf("%s/%d: %w", topic, p, err)
	})
	if failed != nil {
		f.fetchOutage.Fail(failed)
	} else if ctx.Err() == nil {
		f.fetchOutage.OK()
	}
}

// prepareData prepares the data records of recs, which may hold
// transaction markers: apply's refused indexes count data records only.
func (f *Feed) prepareData(recs []*kgo.Record) func(context.Context) (map[int]string, error) {
	data := dataRecords(recs)
	if len(data) == 0 {
		return func(context.Context) (map[int]string, error) { return nil, nil }
	}
	return f.prepare(data)
}

// dataRecords is recs without transaction markers (control records),
// recs itself when it has none.
func dataRecords(recs []*kgo.Record) []*kgo.Record {
	n := 0
	for _, r := range recs {
		if !r.Attrs.IsControl() {
			n++
		}
	}
	if n == len(recs) {
		return recs
	}
	data := make([]*kgo.Record, 0, n)
	for _, r := range recs {
		if !r.Attrs.IsControl() {
			data = append(data, r)
		}
	}
	return data
}

// applyBatch applies the data records of recs until it succeeds,
// dead-letters those refused, and marks them all for commit, transaction
// markers included. It returns false if ctx ended first: nothing of the
// batch is then marked, and its next owner applies it.
func (f *Feed) applyBatch(ctx context.Context, recs []*kgo.Record, apply func(context.Context) (map[int]string, error)) bool {
	var refused map[int]string
	if !retry(ctx, func() error {
		var err error
		refused, err = apply(ctx)
		return track(f.applyOutage, err)
	}) {
		return false
	}
	data := dataRecords(recs)
	// The refused go to the dead-letter topic all at once, in the order
	// read; those that fail go again until they land.
	pending := make([]kafka.Refused, 0, len(refused))
	for _, i := range slices.Sorted(maps.Keys(refused)) {
		r := data[i]
		f.log.Warn("activity record refused", "partition", r.Partition, "offset", r.Offset, "reason", refused[i])
		pending = append(pending, kafka.Refused{Record: r, Reason: refused[i]})
	}
	if len(pending) > 0 {
		metricRecords.WithLabelValues("dead-lettered").Add(float64(len(pending)))
		if !retry(ctx, func() error {
			var err error
			pending, err = kafka.ProduceDeadLetters(ctx, f.cl, pending, f.cfg.DeadLetterTopic)
			return track(f.dlqOutage, err)
		}) {
			return false
		}
	}
	metricRecords.WithLabelValues("applied").Add(float64(len(data) - len(refused)))
	f.mu.Lock()
	for _, r := range recs {
		f.tr.applied(r.Partition, r.Offset+1)
	}
	f.mu.Unlock()
	f.cl.MarkCommitRecords(recs...)
	return true
}

// stamp takes a checkpoint of the partitions this member owns and stamps
// those that passed one. The time is read before the ends, so that every
// record appended before it is below the end.
func (f *Feed) stamp(ctx context.Context) {
	if err := f.stampOnce(ctx); err != nil && ctx.Err() == nil {
		f.stampOutage.Fail(err)
		return
	}
	f.stampOutage.OK()
}

func (f *Feed) stampOnce(ctx context.Context) error {
	f.mu.Lock()
	owned, unknown := f.tr.owned(), f.tr.unknown()
	f.mu.Unlock()
	if len(owned) == 0 {
		return nil
	}
	at, err := f.store.ActivityClock(ctx)
	if err != nil {
		return err
	}
	topic := f.cfg.Kafka.Topic
	ends, err := f.adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return fmt.Errorf("list end offsets: %w", err)
	}
	if err := ends.Error(); err != nil {
		return fmt.Errorf("list end offsets: %w", err)
	}
	// A partition not yet fetched from starts at its committed offset, or,
	// with none, at its start.
	var starts kadm.ListedOffsets
	committed := f.cl.CommittedOffsets()[topic]
	if slices.ContainsFunc(unknown, func(p int32) bool { _, ok := committed[p]; return !ok }) {
		if starts, err = f.adm.ListStartOffsets(ctx, topic); err != nil {
			return fmt.Errorf("list start offsets: %w", err)
		}
	}
	f.mu.Lock()
	for p, o := range committed {
		f.tr.applied(p, o.Offset)
	}
	for _, p := range unknown {
		if _, ok := committed[p]; !ok {
			if s, ok := starts.Lookup(topic, p); ok && s.Err == nil {
				f.tr.applied(p, s.Offset)
			}
		}
	}
	mine := map[int32]int64{}
	for _, p := range owned {
		if e, ok := ends.Lookup(topic, p); ok && e.Err == nil {
			mine[p] = e.Offset
		}
	}
	f.tr.checkpoint(at, mine)
	caught := f.tr.caughtUp()
	f.mu.Unlock()
	// Every so often, and whenever it changes, the topic's partitions as
	// the brokers list them: one just added holds every deadline until
	// its owner stamps it, one gone, or another topic's, no longer does.
	st := session.FeedStamp{Gap: f.cfg.Gap, Every: f.cfg.Stamp, CaughtUp: caught}
	var count int
	if time.Since(f.looked) >= partitionsLook {
		// Asked of a broker, not the client's cached metadata, which
		// learns of a partition added only minutes later.
		if count, err = f.partitions(ctx); err != nil {
			return err
		}
		f.looked = time.Now()
		if count != f.count || time.Since(f.counted) >= partitionsEvery {
			st.Topic, st.Partitions = topic, count
		}
	}
	if len(caught) == 0 && st.Partitions == 0 {
		return nil
	}
	now, err := f.store.ActivityCaughtUp(ctx, st)
	if err != nil {
		return err
	}
	if st.Partitions > 0 {
		f.count, f.counted = count, time.Now()
	}
	f.mu.Lock()
	for p, w := range caught {
		f.marks[p] = w
	}
	f.skew = time.Since(now)
	f.mu.Unlock()
	return nil
}

// lag is how far the watermark of the partitions this member owns trails
// now, by this host's clock set to Redis's as of the last stamp: the last
// stamp's age when stamps fail (Kafka or Redis down, a batch that cannot
// be applied), since the feed started for a partition never stamped
// here, zero while it owns none.
func (f *Feed) lag() time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	var low time.Time
	for _, p := range f.tr.owned() {
		w, ok := f.marks[p]
		if !ok {
			w = f.started.Add(-f.skew)
		}
		if low.IsZero() || w.Before(low) {
			low = w
		}
	}
	if low.IsZero() {
		return 0
	}
	return max(time.Since(low.Add(f.skew)), 0)
}

func (f *Feed) onAssigned(_ context.Context, _ *kgo.Client, m map[string][]int32) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, p := range m[f.cfg.Kafka.Topic] {
		f.tr.assign(p)
	}
}

// onRevoked commits what was applied, so the partitions' next owner starts
// right after it.
func (f *Feed) onRevoked(ctx context.Context, cl *kgo.Client, m map[string][]int32) {
	if err := cl.CommitMarkedOffsets(ctx); err != nil {
		f.log.Warn("commit on revoke", "err", err)
	}
	f.forget(m)
}

func (f *Feed) onLost(_ context.Context, _ *kgo.Client, m map[string][]int32) {
	f.log.Warn("activity partitions lost", "partitions", m[f.cfg.Kafka.Topic])
	f.forget(m)
}

func (f *Feed) forget(m map[string][]int32) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, p := range m[f.cfg.Kafka.Topic] {
		f.tr.revoke(p)
		delete(f.marks, p)
	}
}

// partitionsLook is how often a member asks a broker how many partitions
// the topic has.
const partitionsLook = time.Second

// partitions asks a broker how many partitions the activity topic has.
func (f *Feed) partitions(ctx context.Context) (int, error) {
	req := kmsg.NewPtrMetadataRequest()
	t := kmsg.NewMetadataRequestTopic()
	t.Topic = kmsg.StringPtr(f.cfg.Kafka.Topic)
	req.Topics = append(req.Topics, t)
	resp, err := req.RequestWith(ctx, f.cl)
	if err != nil {
		return 0, fmt.Errorf("topic metadata: %w", err)
	}
	for _, t := range resp.Topics {
		if t.Topic == nil || *t.Topic != f.cfg.Kafka.Topic {
			continue
		}
		if err := kerr.ErrorForCode(t.ErrorCode); err != nil {
			return 0, fmt.Errorf("topic metadata: %w", err)
		}
		n := 0
		for _, p := range t.Partitions {
			n = max(n, int(p.Partition)+1)
		}
		return n, nil
	}
	return 0, fmt.Errorf("topic metadata: %q not in the answer", f.cfg.Kafka.Topic)
}

// partitionsEvery is how often a member writes the topic's partitions
// into the watermark even when they have not changed (another member may
// have been on another topic).
const partitionsEvery = 30 * time.Second

// retry calls do until it succeeds or ctx ends, backing off between
// tries; it reports whether do succeeded.
func retry(ctx context.Context, do func() error) bool {
	wait := 50 * time.Millisecond
	for {
		if do() == nil {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(wait):
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// track books err on an outage log and returns it.
func track(l *outage.Log, err error) error {
	if err != nil {
		l.Fail(err)
		return err
	}
	l.OK()
	return nil
}
