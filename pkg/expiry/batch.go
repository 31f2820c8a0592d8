package expiry

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/stillthere/stillthere/pkg/session"
)

// emit carries one batch of found timeouts through fixed steps, each at
// most one pipelined round trip, and carries out what decide (verdict.go)
// makes of each timeout as the steps learn more of it. Each item carries
// the verdict of its last judgement; the comment on each step says which
// facts it adds and which verdicts an item can have after it, so that
// decide need not be run in one's head. It returns how many entries left
// the due index (held by an outage rule, or settled), so that the sweep
// knows whether it made progress. An event Kafka does not take goes to the
// spool, or to another replica; one neither produced nor spooled keeps its
// index entry, its claim released, for the next sweep.
func (l *Listener) emit(ctx context.Context, c session.Control, found []session.Expired, source string) (int, error) {
	// 1. Judge. Adds the control state, the grace, the policy, spooling.
	// After: hold (an outage rule), claim, or settle (stage-gone); a
	// leave (awaits-replay) and a repeated dedup key leave the batch.
	b := l.judgeFound(c, found, source)
	defer l.flushFindings(&b.found)
	// 2. Hold: the holds move to the hold set and leave the batch. After:
	// claim, or settle (stage-gone).
	l.hold(ctx, b)
	// 3. Claim the dedup keys of the items judged claim. Adds each claim's
	// reply; no item is judged here.
	if err := l.claimKeys(ctx, b); err != nil {
		return 0, err
	}
	// 4. Judge the claimed again. Adds the claims' replies and braking.
	// After: settle (produced-before, spooled-before), leave
	// (claimed-elsewhere), hold (minute, mass-expiry), produce or spool.
	// Claims are taken now: what is left of the batch is finished even if
	// ctx is done. The holds move to the hold set, their claims released.
	l.judgeClaimed(ctx, b)
	wctx := context.WithoutCancel(ctx)
	// 4b. Hold again, as in step 2: the holds of step 4.
	l.hold(wctx, b)
	// 5. Produce, then spool. Adds spooling again (produce and spool may
	// swap), then Kafka's answer and othersAlive: after, settle
	// (produced), leave (left-to-replica) or spool; then the spool's
	// answer: after, settle (spooled) or leave (unsent).
	if err := l.produce(ctx, b); err != nil {
		return 0, err
	}
	l.spoolEvents(b)
	// 6. Record: resolve the claims and settle the settled. No judgement.
	return l.record(wctx, b)
}

// batch is one batch of found timeouts on its way through emit's steps.
type batch struct {
	facts  facts
	source string    // the path that found it: sweep or event
	begin  time.Time // local time just after detection, for the lag
	items  []*item
	// found are the findings of the items step 1 kept, for their
	// timelines (noteFound): holds leave items, found keeps them all.
	found findings
	// outageHolds counts the items step 1 judged held, by an outage rule:
	// they leave the index, for emit's count.
	outageHolds int
	claims      int // items whose dedup key step 3 claimed
}

// item is one timeout of a batch and the verdict of its last judgement.
type item struct {
	timeout
	// verdict is decide's judgement of the timeout by the facts known at
	// the last step that judged it (emit says what each step adds).
	verdict verdict
	rec     *kgo.Record // its event, once encoded (step 5)
	sentAt  time.Time   // when its event went to Kafka or the spool (step 5), for its timeline
	// foundAt is when step 1 found it, while its timeline entry waits
	// to be folded into the next (findings); zero once recorded. Under
	// the batch's found.mu.
	foundAt time.Time
}

// judge judges it again, by the batch's facts and its own as they are now.
func (b *batch) judge(it *item) { it.verdict = decide(b.facts, it.timeout) }

// with lists the items whose verdict is a.
func (b *batch) with(a act) []*item {
	var out []*item
	for _, it := range b.items {
		if it.verdict.act == a {
			out = append(out, it)
		}
	}
	return out
}

// timeoutsOf is the timeouts of items.
func timeoutsOf(items []*item) []session.Expired {
	es := make([]session.Expired, len(items))
	for i, it := range items {
		es[i] = it.Expired
	}
	return es
}

// judgeFound is the batch of found, each judged by what is known before
// its claim. Of entries with one dedup key all are held if a rule holds
// them, else only the first is kept: a batch from expired events can list
// a uid twice, and the second would meet this listener's own claim.
// Entries left alone leave the batch at once.
func (l *Listener) judgeFound(c session.Control, found []session.Expired, source string) *batch {
	b := &batch{source: source, begin: time.Now(), facts: facts{
		control:    c,
		grace:      l.cfg.OutageGrace,
		sweepEvery: l.cfg.SweepInterval,
		policy:     l.policy.Current(),
		spooling:   !l.direct(),
	}}
	ks := l.store.Keyspace()
	seen := make(map[string]bool, len(found))
	for _, e := range found {
		it := &item{timeout: timeout{Expired: e}}
		b.judge(it)
		if it.verdict.act == actHold {
			b.outageHolds++
		} else if k := ks.StageDedupKey(e.UID, e.Stage, e.Due); seen[k] {
			continue
		} else {
			seen[k] = true
		}
		if it.verdict.reason == whyStageGone {
			metricStagesDropped.Inc()
		}
		if it.verdict.act != actLeave {
			b.items = append(b.items, it)
			l.noteFound(b, it)
		}
	}
	return b
}

// hold moves the items judged hold to the hold set, each until its
// release time, one round trip per rule, and takes them out of the batch.
// The claims taken of them (the minute rule's and the brake's) are
// released only after, so that no other replica produces one before it is
// held. One that could not be held stays in the index, for the next sweep.
func (l *Listener) hold(ctx context.Context, b *batch) {
	byRule := map[holdRule][]*item{}
	var claims []session.Expired
	b.items = slices.DeleteFunc(b.items, func(it *item) bool {
		if it.verdict.act != actHold {
			return false
		}
		byRule[it.verdict.rule] = append(byRule[it.verdict.rule], it)
		if it.claim.outcome == session.ClaimFresh {
			claims = append(claims, it.Expired)
		}
		return true
	})
	type entry struct {
		uid   string
		stage int
		due   int64
	}
	for rule, items := range byRule {
		release := make(map[entry]time.Time, len(items))
		for _, it := range items {
			release[entry{it.UID, it.Stage, it.Due.UnixMilli()}] = it.verdict.release
		}
		releaseOf := func(e session.Expired) time.Time { return release[entry{e.UID, e.Stage, e.Due.UnixMilli()}] }
		held, err := l.holdEach(ctx, rule, timeoutsOf(items), releaseOf)
		if err != nil {
			l.log.Debug("hold timeouts; the next sweep retries", "rule", rule, "count", len(items), "err", err)
		}
		l.notesHeld(b, items, held)
	}
	if err := l.resolveClaims(ctx, nil, nil, claims); err != nil {
		l.log.Debug("release dedup claims of held timeouts", "count", len(claims), "err", err)
	}
}

// holdEach moves timeouts from the index to the hold set until each one's
// release time, counting the holds by rule (and the brake's for its log).
// It says of each whether it was held (see Store.HoldEach).
func (l *Listener) holdEach(ctx context.Context, rule holdRule, es []session.Expired, release func(session.Expired) time.Time) ([]bool, error) {
	held, err := l.store.HoldEach(ctx, es, release)
	l.armWritten(es, release, true)
	n := 0
	for _, ok := range held {
		if ok {
			n++
		}
	}
	metricHeld.WithLabelValues(string(rule)).Add(float64(n))
	if rule == ruleBrake {
		l.brake.holds += n
	}
	return held, err
}

// claimKeys claims the dedup keys of the items judged claim, in one
// pipeline (dedupe), and gives each its claim's reply.
func (l *Listener) claimKeys(ctx context.Context, b *batch) error {
	items := b.with(actClaim)
	if len(items) == 0 {
		return nil
	}
	replies, err := l.dedupe(ctx, timeoutsOf(items))
	if err != nil {
		return err
	}
	for i, it := range items {
		it.claim = replies[i]
	}
	b.claims = len(items)
	return nil
}

// judgeClaimed judges the claimed items again. When the brake would hold
// any of them, it first counts the batch's lapses (one round trip); with
// no lapse to count the state is still brought up to date, so that a
// brake that should have let go holds nothing.
func (l *Listener) judgeClaimed(ctx context.Context, b *batch) {
	items := b.with(actClaim)
	var lapses []time.Time // when each was found
	askBrake := false
	for _, it := range items {
		if lapse(b.facts, it.timeout) {
			lapses = append(lapses, it.Detected)
		}
		askBrake = askBrake || brakeWouldHold(b.facts, it.timeout)
	}
	if askBrake {
		b.facts.braking = l.braking(ctx, b.facts.control.Now, lapses)
	}
	for _, it := range items {
		// New facts: its claim's reply, and braking.
		b.judge(it)
		if r := it.verdict.reason; r == whyProducedBefore || r == whySpooledBefore {
			metricDedupHits.Inc()
		}
	}
	l.paceHolds(items)
}

// produce encodes the events of the items that are ours and produces
// them to Kafka in one call, unless the replica spools them, and judges
// each again by its result. The call is bounded by ProduceTimeout and not
// cut short by shutdown: a batch in flight is finished, so its entries are
// settled now rather than produced again by the next start.
func (l *Listener) produce(ctx context.Context, b *batch) error {
	b.facts.spooling = !l.direct() // the spool may have been replayed since
	var records []*kgo.Record
	byRecord := map[*kgo.Record]*item{}
	for _, it := range b.items {
		if it.verdict.act != actProduce && it.verdict.act != actSpool {
			continue
		}
		// New fact: spooling, read again. Produce and spool may swap.
		b.judge(it)
		v, err := event(it.Expired, it.verdict.stage, it.verdict.last, b.source).Marshal()
		if err != nil {
			return fmt.Errorf("encode timeout for %q: %w", it.UID, err)
		}
		it.rec = &kgo.Record{Key: []byte(it.UID), Value: v}
		if it.verdict.act == actProduce {
			records = append(records, it.rec)
			byRecord[it.rec] = it
		}
	}
	if len(records) == 0 {
		return nil
	}
	sentAt := time.Now()
	for _, r := range records {
		byRecord[r].sentAt = sentAt
	}
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.cfg.ProduceTimeout)
	// ProduceSync lists results in the order records completed, not the
	// order given: match them by record.
	results := l.producer.ProduceSync(pctx, records...)
	cancel()
	producedAt := time.Now()
	b.facts.othersAlive = l.othersAlive()
	for _, r := range results {
		it := byRecord[r.Record]
		it.write = writeProduced
		if r.Err != nil {
			it.write = writeRefused
			metricProduceErrors.Inc()
			l.marker.produceFailed()
			l.produceDown.Fail(r.Err)
		} else {
			l.produceDown.OK()
			metricProduced.WithLabelValues(b.source).Inc()
			// Lag from when the stage was due (for stage 1, the deadline)
			// to detection by Redis's clock, plus the local time since: no
			// two hosts' clocks are compared.
			metricLag.WithLabelValues(b.source).Observe((it.Detected.Sub(it.Due) + producedAt.Sub(b.begin)).Seconds())
		}
		// New facts: Kafka's answer, and othersAlive.
		b.judge(it)
	}
	return nil
}

// spoolEvents writes the events of the items judged to be spooled to the
// spool, in one durable append, and judges each again by its outcome.
func (l *Listener) spoolEvents(b *batch) {
	items := b.with(actSpool)
	if len(items) == 0 {
		return
	}
	records := make([]*kgo.Record, len(items))
	for i, it := range items {
		records[i] = it.rec
	}
	at := time.Now()
	err := l.toSpool(records)
	if err != nil {
		l.log.Warn("spool timeouts; they stay in the deadline index", "count", len(items), "err", err)
	}
	for _, it := range items {
		it.write = writeSpooled
		if err != nil {
			it.write = writeUnsent
		}
		// New fact: the spool's answer.
		b.judge(it)
		if it.verdict.reason == whySpooled {
			// Recorded now, not with the other outcomes once the batch
			// is settled: the replay may put it on the topic before
			// then, and its "replayed" must read after it.
			it.sentAt = at
			l.noteOutcome(b, it, true)
		}
	}
}

// record writes what became of the batch: the claims are resolved (the
// dedup keys of produced and spooled timeouts set so, and the claims of
// unsent ones released: a pipeline each; those left to another replica
// count this one's failure: one pipeline), and then the settled entries are settled
// (Store.Settle). It returns emit's count.
func (l *Listener) record(ctx context.Context, b *batch) (int, error) {
	// In a storm a batch is thousands: the two that take most of it
	// are sized once.
	produced := make([]session.Expired, 0, len(b.items))
	settled := make([]session.Expired, 0, len(b.items))
	var spooled, unsent, elsewhere []session.Expired
	for _, it := range b.items {
		e := it.Expired
		switch it.verdict.reason {
		case whyProduced:
			produced = append(produced, e)
		case whySpooled:
			spooled = append(spooled, e)
		case whyUnsent:
			unsent = append(unsent, e)
		case whyLeftToReplica:
			elsewhere = append(elsewhere, e)
		}
		if it.verdict.act == actSettle {
			e.NextDue = it.verdict.next
			settled = append(settled, e)
		}
	}
	if err := l.resolveClaims(ctx, produced, spooled, unsent); err != nil {
		l.log.Warn("record dedup outcome", "err", err)
	}
	if err := l.retryElsewhere(ctx, elsewhere); err != nil {
		l.log.Warn("leave timeouts to another replica", "count", len(elsewhere), "err", err)
	}
	if len(settled) > 0 {
		if err := l.store.Settle(ctx, settled); err != nil {
			l.noteOutcomes(b, false)
			return 0, err
		}
		l.armWritten(settled, func(e session.Expired) time.Time { return e.NextDue }, false)
	}
	l.noteOutcomes(b, true)
	if len(unsent) > 0 {
		return b.outageHolds + len(settled), fmt.Errorf("%d of %d timeouts neither produced nor spooled", len(unsent), b.claims)
	}
	return b.outageHolds + len(settled), nil
}

// noteOutcomes records in the users' timelines what became of the batch's
// timeouts (noteOutcome); settled says whether the settle went through.
func (l *Listener) noteOutcomes(b *batch, settled bool) {
	if l.timeline == nil {
		return
	}
	for _, it := range b.items {
		if it.verdict.reason != whySpooled { // recorded when spooled
			l.noteOutcome(b, it, settled)
		}
	}
}
