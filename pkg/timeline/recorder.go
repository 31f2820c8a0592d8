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
	wake  chan struct{} // one token: entries wait in pending

	mu      sync.Mutex
	pending []record // recorded, not yet taken by Run; at most defaultQueue
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
	r.mu.Lock()
	full := len(r.pending) >= defaultQueue
	if !full {
		r.pending = append(r.pending, record{uid, e, at})
	}
	r.mu.Unlock()
	if full {
		metricDropped.WithLabelValues(r.cfg.Service).Inc()
		return
	}
	metricEntries.WithLabelValues(r.cfg.Service, string(e.Kind), e.Rule).Inc()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// takePending returns what waits, leaving spare (emptied) in its place.
func (r *Recorder) takePending(spare []record) []record {
	r.mu.Lock()
	defer r.mu.Unlock()
	got := r.pending
	r.pending = spare[:0]
	return got
}

// spareMax is the largest queue Run keeps for reuse: one that grew in a
// storm is left to the collector.
const spareMax = defaultBatch

// Run sends queued entries until ctx is done, then what is still queued,
// for up to a second.
func (r *Recorder) Run(ctx context.Context) {
	tick := time.NewTicker(defaultFlush)
	defer tick.Stop()
	batch := make([]session.TimelineRecord, 0, defaultBatch)
	ats := make([]time.Time, 0, defaultBatch) // each record's decision time
	send := func(ctx context.Context) {
		if len(batch) == 0 {
			return
		}
		for i := range batch {
			batch[i].Ago = time.Since(ats[i])
		}
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		n, err := r.store.AppendTimeline(sctx, batch, r.cfg.Bounds)
		cancel()
		if err != nil {
			metricDropped.WithLabelValues(r.cfg.Service).Add(float64(len(batch) - n))
			r.cfg.Log.Warn("timeline entries not recorded", "entries", len(batch)-n, "err", err)
		}
		batch, ats = batch[:0], ats[:0]
	}
	take := func(rec record) {
		s, err := rec.e.encode()
		if err != nil {
			metricDropped.WithLabelValues(r.cfg.Service).Inc()
			return
		}
		batch = append(batch, session.TimelineRecord{UID: rec.uid, Entry: s})
		ats = append(ats, rec.at)
	}
	// takeAll takes what waits, sending each batch as it fills.
	var spare []record
	takeAll := func(ctx context.Context) {
		got := r.takePending(spare)
		for _, rec := range got {
			take(rec)
			if len(batch) >= defaultBatch {
				send(ctx)
			}
		}
		clear(got)
		if spare = nil; cap(got) <= spareMax {
			spare = got[:0]
		}
	}
	for {
		select {
		case <-r.wake:
			takeAll(ctx)
		case <-tick.C:
			send(ctx)
		case <-ctx.Done():
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			defer cancel()
			takeAll(dctx)
			send(dctx)
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
		out = append(out, e)
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
