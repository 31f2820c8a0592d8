package guide

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/sony/gobreaker/v2"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Retry pacing of a record whose attempt failed while no breaker is open.
const (
	retryFirst = 50 * time.Millisecond
	retryMax   = 2 * time.Second
)

// loop is the dispatch loop. It alone owns the records taken from Kafka
// until they are settled: which are in flight, which wait to be retried,
// how far each partition may be committed, and whether fetching is
// paused. Sends run on goroutines it starts and waits for; they report on
// results. The poller goroutine polls only when the loop asks, and the
// rebalance callbacks reach it over Consumer.rebalance.
type loop struct {
	c       *Consumer
	topic   string
	max     int
	results chan result      // capacity max: a send never blocks on it
	want    chan int         // to the poller: poll up to n records
	polled  chan kgo.Fetches // from the poller

	parts   map[int32]*partition // assigned partitions
	retry   []*job               // unsent records, in the order taken
	held    int                  // records taken and not settled or dropped
	running int                  // process goroutines not yet reported
	polling bool                 // a poll is outstanding

	paused      map[int32]bool // partitions this loop paused
	pauseGauge  int            // our share of metricPaused
	inFlightSet int            // our share of metricInFlight

	// While a breaker is open, fetching pauses and one record at a time
	// probes the downstreams, the next at probeAt.
	probing bool
	probe   *job
	probeAt time.Time

	revokes []*revoke // revoked partitions waiting for their sends
}

// partition is the loop's view of one assigned partition.
type partition struct {
	id      int32
	pending []*job // taken and not yet marked, in offset order
	// byKey holds, per record key (a user), the records taken and not
	// settled, in offset order. Only the first of a key is sent: the
	// stages of one silence go out in order, a reminder never after its
	// close, even when the reminder's send is retried.
	byKey    map[string][]*job
	inFlight int
	leaving  bool // revoked: sends under way still settle and mark
	lost     bool // lost: nothing more is marked
}

// job is one record between poll and settle.
type job struct {
	rec      *kgo.Record
	p        *partition
	attempts int
	// sendTried: an attempt reached the downstream, which may have shown
	// the guide though its answer never came back (see unasked).
	sendTried bool
	notBefore time.Time
	done      bool
}

func newPartition(id int32) *partition {
	return &partition{id: id, byKey: make(map[string][]*job)}
}

// blocked reports whether an earlier record of j's key is not settled.
func (j *job) blocked() bool { return j.p.byKey[string(j.rec.Key)][0] != j }

// settled takes j, settled, off its key's queue, unblocking the next.
func (j *job) settled() {
	k := string(j.rec.Key)
	q := j.p.byKey[k]
	if i := slices.Index(q, j); i >= 0 {
		q = slices.Delete(q, i, i+1)
	}
	if len(q) == 0 {
		delete(j.p.byKey, k)
	} else {
		j.p.byKey[k] = q
	}
}

type result struct {
	j       *job
	outcome Outcome
	err     error
}

type revoke struct {
	parts []*partition
	done  chan struct{}
}

func newLoop(c *Consumer) *loop {
	return &loop{
		c:       c,
		topic:   c.cfg.Kafka.Topic,
		max:     c.cfg.MaxInFlight,
		results: make(chan result, c.cfg.MaxInFlight),
		want:    make(chan int, 1),
		polled:  make(chan kgo.Fetches),
		parts:   make(map[int32]*partition),
		paused:  make(map[int32]bool),
	}
}

// run dispatches until ctx is done, then waits for the sends under way
// and marks what they settled. The poller has stopped when it returns.
func (l *loop) run(ctx context.Context) error {
	pollCtx, stopPoll := context.WithCancel(ctx)
	pollerDone := make(chan struct{})
	go func() {
		defer close(pollerDone)
		l.poll(pollCtx)
	}()
	defer func() {
		stopPoll()
		// No longer answering before waiting for the poller: a poll waits
		// for a rebalance callback under way, and the callback for the
		// loop's answer. Stopped while partitions were being assigned,
		// the consumer otherwise never returned.
		l.c.endLoop.Do(func() { close(l.c.loopDone) })
		<-pollerDone
		l.setGauges(0, 0)
	}()
	// Sends outlive a shutdown so that what they settle is committed;
	// SendTimeout bounds them. Their session checks too: the batcher stops
	// only once they have settled (drain), when run returns.
	sendCtx := context.WithoutCancel(ctx)
	checkCtx, stopChecks := context.WithCancel(sendCtx)
	checksDone := make(chan struct{})
	go func() {
		defer close(checksDone)
		l.c.checks.run(checkCtx)
	}()
	defer func() {
		stopChecks()
		<-checksDone
	}()

	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		l.pace()
		if wake := l.wake(); wake.IsZero() {
			timer.Stop()
		} else {
			timer.Reset(time.Until(wake))
		}
		select {
		case <-ctx.Done():
			l.drain()
			return ctx.Err()
		case fs := <-l.polled:
			l.polling = false
			if fs.IsClientClosed() {
				l.drain()
				return errors.New("kafka client closed")
			}
			l.take(sendCtx, fs)
			l.c.client.AllowRebalance()
		case r := <-l.results:
			l.settle(r)
		case req := <-l.c.rebalance:
			l.rebalanced(req)
		case <-timer.C:
			l.due(sendCtx, time.Now())
		}
	}
}

// poll runs on its own goroutine: one poll per request from the loop.
func (l *loop) poll(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case n := <-l.want:
			fs := l.c.client.PollRecords(ctx, n)
			select {
			case l.polled <- fs:
			case <-ctx.Done():
				return
			}
		}
	}
}

// pace asks for records while there is room, and pauses or resumes
// fetching: paused while a breaker is open, and from the in-flight bound
// until half of it is free again.
func (l *loop) pace() {
	pause := l.wantPause()
	if pause {
		l.pause()
	} else if len(l.paused) > 0 {
		l.resume()
	}
	if !pause && !l.polling && l.held < l.max {
		l.polling = true
		l.want <- l.max - l.held
	}
	n := 0
	for id, p := range l.parts {
		if l.paused[id] && !p.leaving {
			n++
		}
	}
	l.setGauges(n, l.held)
}

func (l *loop) wantPause() bool {
	return l.probing || l.held >= l.max || (len(l.paused) > 0 && l.held > l.max/2)
}

func (l *loop) setGauges(paused, held int) {
	metricPaused.Add(float64(paused - l.pauseGauge))
	metricInFlight.Add(float64(held - l.inFlightSet))
	l.pauseGauge, l.inFlightSet = paused, held
}

// pause stops fetching every assigned partition not paused yet; it runs
// again after an assignment, so new partitions are paused too.
func (l *loop) pause() {
	var ids []int32
	for id := range l.parts {
		if !l.paused[id] {
			ids = append(ids, id)
			l.paused[id] = true
		}
	}
	if len(ids) > 0 {
		l.c.client.PauseFetchPartitions(map[string][]int32{l.topic: ids})
		// Debug: at the in-flight bound this happens many times a second
		// under load; an open breaker logs its own line.
		l.c.log.Debug("fetching paused", "partitions", ids, "probing", l.probing, "held", l.held)
	}
}

// resume resumes every partition the loop paused, assigned or not: a
// pause outlives an assignment in the client.
func (l *loop) resume() {
	ids := make([]int32, 0, len(l.paused))
	for id := range l.paused {
		ids = append(ids, id)
	}
	clear(l.paused)
	l.c.client.ResumeFetchPartitions(map[string][]int32{l.topic: ids})
	l.c.log.Debug("fetching resumed", "partitions", ids, "held", l.held)
}

// take tracks a poll's records and starts them, or holds them while the
// downstreams are probed.
func (l *loop) take(ctx context.Context, fs kgo.Fetches) {
	failed := false
	fs.EachError(func(topic string, p int32, err error) {
		if !errors.Is(err, context.Canceled) {
			failed = true
			l.c.fetchOutage.Fail(fmt.Errorf("fetch %s/%d: %w", topic, p, err))
		}
	})
	if !failed {
		l.c.fetchOutage.OK()
	}
	fs.EachRecord(func(r *kgo.Record) {
		p := l.parts[r.Partition]
		if p == nil {
			// The assignment always reaches the loop before fetching
			// starts; this is only a safety net.
			p = newPartition(r.Partition)
			l.parts[r.Partition] = p
		}
		j := &job{rec: r, p: p}
		p.pending = append(p.pending, j)
		p.byKey[string(r.Key)] = append(p.byKey[string(r.Key)], j)
		l.held++
		if l.probing || j.blocked() {
			j.notBefore = time.Now()
			l.retry = append(l.retry, j)
			return
		}
		l.start(ctx, j)
	})
}

func (l *loop) start(ctx context.Context, j *job) {
	j.p.inFlight++
	l.running++
	go func() {
		outcome, err := l.c.process(ctx, j.rec, &j.sendTried)
		l.results <- result{j: j, outcome: outcome, err: err}
	}()
}

// settle books one attempt's result.
func (l *loop) settle(r result) {
	j, p := r.j, r.j.p
	p.inFlight--
	l.running--
	wasProbe := j == l.probe
	if wasProbe {
		l.probe = nil
	}
	defer l.finishRevokes()

	if r.err == nil {
		l.held--
		metricGuides.WithLabelValues(string(r.outcome)).Inc()
		l.c.log.Debug("guide settled", "outcome", r.outcome, "partition", j.rec.Partition, "offset", j.rec.Offset)
		j.done = true
		j.settled()
		l.mark(p)
		if wasProbe {
			l.probed()
		}
		return
	}

	// The downstream's outage log, not this, tells an operator about it.
	l.c.log.Debug("guide not settled, will retry", "partition", j.rec.Partition, "offset", j.rec.Offset, "err", r.err)
	metricSendErrors.Inc()
	if p.leaving || p.lost {
		l.held-- // the partition's next owner sends it
		return
	}
	j.attempts++
	j.notBefore = time.Now().Add(min(retryFirst<<min(j.attempts-1, 10), retryMax))
	l.retry = append(l.retry, j)
	switch {
	case wasProbe:
		l.probeAt = time.Now().Add(l.c.cfg.BreakerTimeout)
	case !l.probing && l.anyOpen():
		l.probing = true
		l.probeAt = time.Now().Add(l.c.cfg.BreakerTimeout)
		l.c.log.Warn("a circuit breaker opened: pausing fetch, holding unsent records", "held", l.held)
	}
}

// mark marks the partition's settled records up to the first one that is
// not, so that a commit never passes an unsent guide.
func (l *loop) mark(p *partition) {
	n := 0
	for n < len(p.pending) && p.pending[n].done {
		n++
	}
	if n == 0 {
		return
	}
	last := p.pending[n-1].rec
	p.pending = p.pending[n:]
	if !p.lost {
		l.c.client.MarkCommitRecords(last)
	}
}

// probed follows a probe that settled: resume once every breaker is
// closed, probe again at once while one is half-open.
func (l *loop) probed() {
	switch {
	case l.allClosed():
		l.probing = false
		now := time.Now()
		for _, j := range l.retry {
			j.notBefore = now
		}
		l.c.log.Info("circuit breakers closed: resuming", "held", l.held)
	case l.anyOpen():
		l.probeAt = time.Now().Add(l.c.cfg.BreakerTimeout)
	default:
		l.probeAt = time.Now()
	}
}

func (l *loop) anyOpen() bool {
	return slices.Contains(l.c.pausingStates(), gobreaker.StateOpen)
}

func (l *loop) allClosed() bool {
	return !slices.ContainsFunc(l.c.pausingStates(), func(s gobreaker.State) bool { return s != gobreaker.StateClosed })
}

// wake is when the loop next has a retry or probe to start; zero if none.
func (l *loop) wake() time.Time {
	if l.probing {
		if l.probe != nil {
			return time.Time{}
		}
		return l.probeAt
	}
	var at time.Time
	for _, j := range l.retry {
		if j.blocked() {
			continue // started once the record before it settles
		}
		if at.IsZero() || j.notBefore.Before(at) {
			at = j.notBefore
		}
	}
	return at
}

// due starts what is due: the next probe, or the retries whose time came.
func (l *loop) due(ctx context.Context, now time.Time) {
	if l.probing {
		if l.probe != nil || now.Before(l.probeAt) {
			return
		}
		if len(l.retry) == 0 {
			l.probing = false // nothing left to probe with: fetch, and learn from the next send
			return
		}
		i := slices.IndexFunc(l.retry, func(j *job) bool { return !j.blocked() })
		if i < 0 {
			return // cannot happen: the first record of a key is never blocked
		}
		l.probe = l.retry[i]
		l.retry = slices.Delete(l.retry, i, i+1)
		l.start(ctx, l.probe)
		return
	}
	keep := l.retry[:0]
	for _, j := range l.retry {
		if now.Before(j.notBefore) || j.blocked() {
			keep = append(keep, j)
			continue
		}
		l.start(ctx, j)
	}
	clear(l.retry[len(keep):])
	l.retry = keep
}

// drain waits for the sends under way and books them, so that shutdown
// commits what they settled.
func (l *loop) drain() {
	for l.running > 0 {
		l.settle(<-l.results)
	}
}

// rebalanceReq is a rebalance callback's partitions for the loop.
type rebalanceReq struct {
	kind  rebalanceKind
	parts []int32
	done  chan struct{} // closed when the loop is done with them
}

type rebalanceKind int

const (
	assigned rebalanceKind = iota
	revoked
	lost
)

// rebalanced applies an assignment change. Revoked partitions drop their
// unsent records (their next owner reads them from the last commit) and
// are answered once their sends under way have settled and marked, so the
// callback's commit covers them. Lost partitions are dropped at once:
// they cannot be committed.
func (l *loop) rebalanced(req rebalanceReq) {
	if req.kind == assigned {
		for _, id := range req.parts {
			if l.parts[id] == nil {
				l.parts[id] = newPartition(id)
			}
		}
		if l.wantPause() {
			l.pause() // before the callback returns and fetching starts
		}
		close(req.done)
		return
	}
	rv := &revoke{done: req.done}
	drop := make(map[*partition]bool)
	for _, id := range req.parts {
		p := l.parts[id]
		if p == nil {
			continue
		}
		delete(l.parts, id)
		p.leaving = true
		p.lost = req.kind == lost
		drop[p] = true
		if !p.lost {
			rv.parts = append(rv.parts, p)
		}
	}
	keep := l.retry[:0]
	for _, j := range l.retry {
		if drop[j.p] {
			l.held--
			continue
		}
		keep = append(keep, j)
	}
	clear(l.retry[len(keep):])
	l.retry = keep
	l.revokes = append(l.revokes, rv)
	l.finishRevokes()
}

// finishRevokes answers the revokes whose partitions have nothing in
// flight.
func (l *loop) finishRevokes() {
	keep := l.revokes[:0]
	for _, rv := range l.revokes {
		busy := false
		for _, p := range rv.parts {
			busy = busy || p.inFlight > 0
		}
		if busy {
			keep = append(keep, rv)
			continue
		}
		close(rv.done)
	}
	clear(l.revokes[len(keep):])
	l.revokes = keep
}
