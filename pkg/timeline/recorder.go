package timeline

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/stillthere/stillthere/pkg/session"
)

// Defaults of Config.
const (
	DefaultEntries = 100
	DefaultKeep    = 24 * time.Hour
	defaultQueue   = 16384
	defaultBatch   = 512
	defaultFlush   = 50 * time.Millisecond
)

// Config sets up a Recorder.
type Config struct {
	Service  string // gateway, listener, consumer
	Instance string
	Bounds   session.TimelineBounds // zero fields: DefaultEntries, DefaultKeep
	Log      *slog.Logger
}

// Recorder appends entries to users' timelines in batches, off the
// caller's goroutine. A nil Recorder records nothing.
//
// Its queue is a slice as long as what waits, not a channel of
// defaultQueue entries: a channel's ring is allocated whole, and once a
// storm of starts has gone round it every page of it stays resident
// (4.4 MB a gateway, a quarter of a KB per connection at 17,000
// connections), though the queue is empty between storms.
type Recorder struct {
	store *session.Store
	cfg   Config
	wake  chan struct{} // one token: entries wait in q
	q     queue
}

type record struct {
	uid string
	e   Entry
	at  time.Time // when the decision was recorded: Redis stamps it so
}

// NewRecorder returns a Recorder over store; Run sends what it records.
func NewRecorder(store *session.Store, cfg Config) *Recorder {
	cfg.Bounds = cfg.Bounds.OrDefault()
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	return &Recorder{store: store, cfg: cfg, wake: make(chan struct{}, 1)}
}

// Record queues e for uid's timeline, made now. It never blocks: with
// the queue full (Redis slow or out of reach) the entry is dropped and
// counted.
func (r *Recorder) Record(uid string, e Entry) { r.RecordAt(uid, e, time.Now()) }

// RecordAt is Record for a decision made at at, by this host's clock:
// one recorded once it took effect, which reads better at when it was
// made (an event produced when it was sent, not once Kafka answered).
func (r *Recorder) RecordAt(uid string, e Entry, at time.Time) {
	if r == nil {
		return
	}
	e.Service, e.Instance = r.cfg.Service, r.cfg.Instance
	if !r.q.push(record{uid, e, at}) {
		metricDropped.WithLabelValues(r.cfg.Service).Add(float64(decisions(e)))
		return
	}
	metricEntries.WithLabelValues(r.cfg.Service, string(e.Kind), e.Rule).Inc()
	if e.Found != "" {
		metricEntries.WithLabelValues(r.cfg.Service, string(e.Found), "").Inc()
	}
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// decisions is how many entries e reads as, and the metrics count: two
// when it folds in its finding (Entry.Found).
func decisions(e Entry) int {
	if e.Found != "" {
		return 2
	}
	return 1
}

// queue is a Recorder's entries waiting for Run, oldest first: at most
// defaultQueue of them. Run takes at most a batch at a time, so that what
// it took and has not sent is never more than one batch beside them.
type queue struct {
	mu   sync.Mutex
	recs []record
	head int // recs[head:] wait
}

// push adds rec, unless defaultQueue wait already.
func (q *queue) push(rec record) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.recs)-q.head >= defaultQueue {
		return false
	}
	q.recs = append(q.recs, rec)
	return true
}

// take appends up to n of the oldest waiting to dst, and returns it.
// What was taken is let go: an emptied queue starts over in its slice
// (or a new one, if a storm grew it past spareMax), and one half taken
// moves its rest to the front.
func (q *queue) take(dst []record, n int) []record {
	q.mu.Lock()
	defer q.mu.Unlock()
	n = min(n, len(q.recs)-q.head)
	dst = append(dst, q.recs[q.head:q.head+n]...)
	clear(q.recs[q.head : q.head+n])
	q.head += n
	switch {
	case q.head == len(q.recs) && cap(q.recs) > spareMax:
		q.recs, q.head = nil, 0
	case q.head == len(q.recs):
		q.recs, q.head = q.recs[:0], 0
	case q.head >= len(q.recs)/2:
		m := copy(q.recs, q.recs[q.head:])
		clear(q.recs[m:])
		q.recs, q.head = q.recs[:m], 0
	}
	return dst
}

// waiting is how many entries wait.
func (q *queue) waiting() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.recs) - q.head
}

// spareMax is the largest emptied queue kept for reuse: one that grew in
// a storm is left to the collector.
const spareMax = defaultBatch

// Run sends queued entries until ctx is done, then what is still queued,
// for up to a second.
func (r *Recorder) Run(ctx context.Context) {
	tick := time.NewTicker(defaultFlush)
	defer tick.Stop()
	batch := make([]session.TimelineRecord, 0, defaultBatch)
	ats := make([]time.Time, 0, defaultBatch) // each record's decision time
	weights := make([]int, 0, defaultBatch)   // each record's decisions (decisions)
	send := func(ctx context.Context) {
		if len(batch) == 0 {
			return
		}
		for i := range batch {
			batch[i].Ago = time.Since(ats[i])
		}
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		appended, err := r.store.AppendTimeline(sctx, batch, r.cfg.Bounds)
		cancel()
		if err != nil {
			lost := 0
			for i, ok := range appended {
				if !ok {
					lost += weights[i]
				}
			}
			metricDropped.WithLabelValues(r.cfg.Service).Add(float64(lost))
			r.cfg.Log.Warn("timeline entries not recorded", "entries", lost, "err", err)
		}
		batch, ats, weights = batch[:0], ats[:0], weights[:0]
	}
	// fill takes what waits into the batch, sending each batch as it
	// fills with sctx, until nothing waits or stop is done.
	got := make([]record, 0, defaultBatch)
	fill := func(sctx, stop context.Context) {
		for stop.Err() == nil {
			got = r.q.take(got[:0], defaultBatch-len(batch))
			if len(got) == 0 {
				return
			}
			for _, rec := range got {
				s, err := rec.e.encode()
				if err != nil {
					metricDropped.WithLabelValues(r.cfg.Service).Add(float64(decisions(rec.e)))
					continue
				}
				batch = append(batch, session.TimelineRecord{UID: rec.uid, Entry: s})
				ats = append(ats, rec.at)
				weights = append(weights, decisions(rec.e))
			}
			clear(got)
			if len(batch) >= defaultBatch {
				send(sctx)
			}
		}
	}
	// A batch in flight when ctx ends is finished (within send's bound),
	// not failed: the drain sends the rest.
	live := context.WithoutCancel(ctx)
	for {
		select {
		case <-r.wake:
			fill(live, ctx)
		case <-tick.C:
			send(live)
		case <-ctx.Done():
			dctx, cancel := context.WithTimeout(live, time.Second)
			defer cancel()
			fill(dctx, dctx)
			send(dctx)
			// What the drain had no time for is dropped, and counted.
			lost := 0
			for _, rec := range r.q.take(nil, defaultQueue) {
				lost += decisions(rec.e)
			}
			if lost > 0 {
				metricDropped.WithLabelValues(r.cfg.Service).Add(float64(lost))
				r.cfg.Log.Warn("timeline entries not recorded: stopped before they were sent", "entries", lost)
			}
			return
		}
	}
}

// Read returns uid's timeline, oldest first by when each decision was
// made (services append in batches, so not in the order appended),
// without entries older than keep by Redis's clock (0: DefaultKeep). An
// unknown user's is empty.
//
// One instance's entries keep the order it made them in, which is the
// order they were appended (inOrder): a stamp is Redis's now less the
// entry's age when its batch left, so a batch that took longer to reach
// Redis stamps its entries later by the difference, and a decision could
// read after the one its instance made next.
func Read(ctx context.Context, store *session.Store, uid string, keep time.Duration) ([]Entry, error) {
	if keep <= 0 {
		keep = DefaultKeep
	}
	now, raw, err := store.Timeline(ctx, uid)
	if err != nil {
		return nil, err
	}
	out := make([]Entry, 0, len(raw))
	for _, s := range raw {
		if now.Sub(s.At) > keep && (s.Err == nil || !s.At.IsZero()) {
			continue
		}
		e, err := decode(s)
		if err != nil {
			// Shown, not hidden, and the rest still read.
			e = Entry{At: s.At, Kind: KindUnreadable, Detail: err.Error()}
		}
		out = unfold(out, e)
	}
	inOrder(out)
	slices.SortStableFunc(out, func(a, b Entry) int { return a.At.Compare(b.At) })
	return out, nil
}

// View is what a person reads of uid's timeline (the endpoint, the
// command): the entries Read returns, and among them, at its time, what
// Redis knows of the user's last grant (lastGrantEntry), oldest first.
func View(ctx context.Context, store *session.Store, uid string, keep time.Duration) ([]Entry, error) {
	if keep <= 0 {
		keep = DefaultKeep
	}
	out, err := Read(ctx, store, uid, keep)
	if err != nil {
		return nil, err
	}
	g, err := store.LastGrant(ctx, uid)
	if err != nil {
		return nil, err
	}
	if e, ok := lastGrantEntry(g); ok && time.Since(e.At) <= keep {
		out = append(out, e)
		slices.SortStableFunc(out, func(a, b Entry) int { return a.At.Compare(b.At) })
	}
	return out, nil
}

// lastGrantEntry is the entry that shows a user's pending deadline and
// the last renewal that set it, read with their timeline (Current), at
// the time of that renewal; false when no deadline is pending (no
// session, or its silence guided to the last stage) or Redis remembers no
// renewal: then the last renewal or end Redis knows of may be an end, and
// the lapse's deadline says when the last ping before it reached us.
// Routine renewals are not recorded: the last one, and the deadline it
// set, is what a reader needs beside the decisions.
func lastGrantEntry(g session.LastGrant) (Entry, bool) {
	if g.At.IsZero() || g.Deadline.IsZero() {
		return Entry{}, false
	}
	e := Entry{At: g.At, Service: "gateway", Kind: KindGranted, Rule: RuleLast, Current: true,
		Stage: g.Stage, Detail: "the last renewal, and the deadline pending; earlier renewals are not recorded"}
	// The instance of the grant the deadline is; one that renewed later
	// with an earlier deadline of its own (another device) is named too.
	if len(g.Vias) > 0 {
		e.Instance = g.Vias[0]
	}
	if len(g.Vias) > 1 {
		e.Detail += "; renewed last by " + g.Vias[len(g.Vias)-1] + ", whose own deadline was earlier"
	}
	e.Deadline = g.Deadline.UnixMilli()
	if g.Stage > 0 {
		e.Detail += "; between the silence's stages: this stage is due next"
	}
	return e, true
}

// inOrder moves each entry of es (in the order appended) that is stamped
// before an earlier entry of its instance to that entry's time, so that
// a stable sort by time keeps each instance's order. The move is at most
// the difference between two batches' trips to Redis. An entry recorded
// in a script (InScript) is stamped when its decision took effect, not
// in a batch of its instance's: it neither moves nor moves the others.
func inOrder(es []Entry) {
	last := make(map[[2]string]time.Time)
	for i := range es {
		if es[i].Kind == KindUnreadable || es[i].InScript {
			continue // whose it was is unknown, or its time exact
		}
		who := [2]string{es[i].Service, es[i].Instance}
		if prev, ok := last[who]; ok && es[i].At.Before(prev) {
			es[i].At = prev
		}
		last[who] = es[i].At
	}
}
