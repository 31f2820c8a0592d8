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
// makes of each timeout as the steps learn more of it. It returns how many
// entries left the due index (held by an outage rule, or settled), so
// that the sweep knows whether it made progress. An event Kafka does not
// take goes to the spool, or to another replica; one neither produced nor
// spooled keeps its index entry, its claim released, for the next sweep.
func (l *Listener) emit(ctx context.Context, c session.Control, found []session.Expired, source string) (int, error) {
	// 1. Judge: the outage rules, the spool, the stage policy.
	b := l.judge(c, found, source)
	// 2. Hold what an outage rule holds.
	l.holdBack(ctx, b)
	// 3. Claim the rest's dedup keys.
	if err := l.claimKeys(ctx, b); err != nil {
		return 0, err
	}
	// 4. Judge again, by the claims' replies and the mass-expiry brake,
	// and hold what the minute rule or the brake holds. Claims are taken
	// now: what is left of the batch is finished even if ctx is done.
	l.judgeClaimed(ctx, b)
	wctx := context.WithoutCancel(ctx)
	l.holdBack(wctx, b)
	// 5. Produce, or leave to another replica, or spool.
	if err := l.produce(ctx, b); err != nil {
		return 0, err
	}
	l.spoolUnsent(b)
	// 6. Record the outcomes, and settle.
	return l.record(wctx, b)
}

// batch is one batch of found timeouts on its way through emit's steps.
type batch struct {
	facts   facts
	source  string    // the path that found it: sweep or event
	begin   time.Time // local time just after detection, for the lag
	items   []*item
	held    int // entries an outage rule held, for emit's count
	claimed int // entries claimed
}

// item is one timeout of a batch and its verdict so far.
type item struct {
	timeout
	v   verdict
	rec *kgo.Record // its event, once encoded
}

func (b *batch) decide(it *item) { it.v = decide(b.facts, it.timeout) }

// with lists the items whose verdict is a.
func (b *batch) with(a act) []*item {
	var out []*item
	for _, it := range b.items {
		if it.v.act == a {
			out = append(out, it)
		}
	}
	return out
}

func expired(items []*item) []session.Expired {
	es := make([]session.Expired, len(items))
	for i, it := range items {
		es[i] = it.Expired
	}
	return es
}

// judge is the batch of found, each judged by what is known before its
// claim. Of entries with one dedup key all are held if a rule holds them,
// else only the first is kept: a batch from expired events can hold a uid
// twice, and the second would meet this listener's own claim. Entries
// left alone leave the batch at once.
func (l *Listener) judge(c session.Control, found []session.Expired, source string) *batch {
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
		b.decide(it)
		if it.v.act == actHold {
			b.held++
		} else if k := ks.StageDedupKey(e.UID, e.Stage, e.Due); seen[k] {
			continue
		} else {
			seen[k] = true
		}
		if it.v.reason == whyStageGone {
			metricStagesDropped.Inc()
		}
		if it.v.act != actLeave {
			b.items = append(b.items, it)
		}
	}
	return b
}

// holdBack holds the items judged to be held, one round trip per rule,
// and takes them out of the batch. The claims taken of them (the brake's)
// are released only after, so that no other replica produces one before
// it is held. One that could not be held stays in the index, for the next
// sweep.
func (l *Listener) holdBack(ctx context.Context, b *batch) {
	byRule := map[holdRule][]*item{}
	var claims []session.Expired
	b.items = slices.DeleteFunc(b.items, func(it *item) bool {
		if it.v.act != actHold {
			return false
		}
		byRule[it.v.rule] = append(byRule[it.v.rule], it)
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
		until := make(map[entry]time.Time, len(items))
		for _, it := range items {
			until[entry{it.UID, it.Stage, it.Due.UnixMilli()}] = it.v.until
		}
		release := func(e session.Expired) time.Time { return until[entry{e.UID, e.Stage, e.Due.UnixMilli()}] }
		if err := l.holdEach(ctx, rule, expired(items), release); err != nil {
			l.log.Debug("hold timeouts; the next sweep retries", "rule", rule, "count", len(items), "err", err)
		}
	}
	if err := l.markDedup(ctx, nil, nil, claims); err != nil {
		l.log.Debug("release dedup claims of held timeouts", "count", len(claims), "err", err)
	}
}

// holdEach moves timeouts out of the index until each one's release time,
// counting them by rule.
func (l *Listener) holdEach(ctx context.Context, rule holdRule, es []session.Expired, release func(session.Expired) time.Time) error {
	n, err := l.store.HoldEach(ctx, es, release)
	metricHeld.WithLabelValues(string(rule)).Add(float64(n))
	if rule == holdBrake {
		l.brake.held += n
	}
	return err
}

// claimKeys claims the dedup keys of the items judged to be claimed, in
// one pipeline (dedupe).
func (l *Listener) claimKeys(ctx context.Context, b *batch) error {
	items := b.with(actClaim)
	if len(items) == 0 {
		return nil
	}
	replies, err := l.dedupe(ctx, expired(items))
	if err != nil {
		return err
	}
	for i, it := range items {
		it.claim = replies[i]
	}
	b.claimed = len(items)
	return nil
}

// judgeClaimed judges the claimed items again. When the brake would hold
// any of them, it first counts the batch's lapses (one round trip); with
// no lapse to count the state is still brought up to date, so that a
// brake that should have let go holds nothing.
func (l *Listener) judgeClaimed(ctx context.Context, b *batch) {
	items := b.with(actClaim)
	lapses, asked := 0, false
	for _, it := range items {
		if lapse(it.timeout) {
			lapses++
		}
		asked = asked || brakeHolds(b.facts, it.timeout)
	}
	if asked {
		b.facts.braking = l.braking(ctx, b.facts.control.Now, lapses)
	}
	for _, it := range items {
		b.decide(it)
		if r := it.v.reason; r == whyProducedBefore || r == whySpooledBefore {
			metricDedupHits.Inc()
		}
	}
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
		if it.v.act != actProduce && it.v.act != actSpool {
			continue
		}
		b.decide(it)
		v, err := event(it.Expired, it.v.stage.Action, it.v.stage.Text, b.source).Marshal()
		if err != nil {
			return fmt.Errorf("encode timeout for %q: %w", it.UID, err)
		}
		it.rec = &kgo.Record{Key: []byte(it.UID), Value: v}
		if it.v.act == actProduce {
			records = append(records, it.rec)
			byRecord[it.rec] = it
		}
	}
	if len(records) == 0 {
		return nil
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
		b.decide(it)
	}
	return nil
}

// spoolUnsent writes the events of the items judged to be spooled to the
// spool, in one durable append, and judges each again by its outcome.
func (l *Listener) spoolUnsent(b *batch) {
	items := b.with(actSpool)
	if len(items) == 0 {
		return
	}
	records := make([]*kgo.Record, len(items))
	for i, it := range items {
		records[i] = it.rec
	}
	err := l.toSpool(records)
	if err != nil {
		l.log.Warn("spool timeouts; they stay in the deadline index", "count", len(items), "err", err)
	}
	for _, it := range items {
		it.write = writeSpooled
		if err != nil {
			it.write = writeLost
		}
		b.decide(it)
	}
}

// record writes what became of the batch: the dedup keys of produced and
// spooled timeouts are marked and the claims of unsent ones released (one
// pipeline), those left to another replica count this one's failure (one
// pipeline), and then the settled entries are settled (Store.Settle). It
// returns emit's count.
func (l *Listener) record(ctx context.Context, b *batch) (int, error) {
	var produced, spooled, unsent, elsewhere, settled []session.Expired
	failures := map[string]int{}
	for _, it := range b.items {
		e := it.Expired
		switch it.v.reason {
		case whyProduced:
			produced = append(produced, e)
		case whySpooled:
			spooled = append(spooled, e)
		case whyUnsent:
			unsent = append(unsent, e)
		case whyLeftToReplica:
			elsewhere = append(elsewhere, e)
			if it.claim.failed > 0 {
				failures[e.UID] = it.claim.failed
			}
		}
		if it.v.act == actSettle {
			e.NextDue = it.v.next
			settled = append(settled, e)
		}
	}
	if err := l.markDedup(ctx, produced, spooled, unsent); err != nil {
		l.log.Warn("record dedup outcome", "err", err)
	}
	if err := l.retryElsewhere(ctx, elsewhere, failures); err != nil {
		l.log.Warn("leave timeouts to another replica", "count", len(elsewhere), "err", err)
	}
	if len(settled) > 0 {
		if err := l.store.Settle(ctx, settled); err != nil {
			return 0, err
		}
	}
	if len(unsent) > 0 {
		return b.held + len(settled), fmt.Errorf("%d of %d timeouts neither produced nor spooled", len(unsent), b.claimed)
	}
	return b.held + len(settled), nil
}
