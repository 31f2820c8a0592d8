package expiry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// replayChunk is how many spooled events are produced together.
const replayChunk = 500

// pathSpool labels the lag of events produced from the spool.
const pathSpool = "spool"

// replay is the one goroutine that produces spooled events, oldest first,
// in chunks. A chunk is committed (and the spool truncated once empty)
// only when every event of it is produced; a failed chunk is retried with
// backoff, sending only the events still unproduced. A crash between
// producing and committing produces a chunk again, with the same event
// ids, which downstream collapses.
func (l *Listener) replay(ctx context.Context) error {
	const maxBackoff = 5 * time.Second
	backoff := 100 * time.Millisecond
	wait := func() bool {
		sleep(ctx, backoff)
		backoff = min(backoff*2, maxBackoff)
		return ctx.Err() == nil
	}
	for !l.topicReady.Load() {
		tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		ok := l.ensureTopic(tctx)
		cancel()
		if !ok && !wait() {
			return nil
		}
	}
	backoff = 100 * time.Millisecond
	for {
		if l.spool.Len() == 0 {
			select {
			case <-ctx.Done():
				return nil
			case <-l.spooled:
				continue
			}
		}
		skipped := l.spool.Skipped()
		values, next, err := l.spool.Peek(replayChunk)
		if n := l.spool.Skipped() - skipped; n > 0 {
			metricSpoolDamaged.Add(float64(n))
			l.log.Error("spool: damaged bytes (a bad disk) went past to the next intact event; the events in them are lost, kept aside for an operator",
				"bytes", n, "kept_in", l.spool.DamagedFile())
		}
		if err != nil {
			l.log.Error("read spool", "err", err)
			if !wait() {
				return nil
			}
			continue
		}
		if !l.produceSpooled(ctx, values) {
			return nil
		}
		if err := l.spool.Commit(next); err != nil {
			l.log.Error("commit spool", "err", err)
		}
		l.updateSpoolMetrics()
		if len(values) == 0 {
			// Nothing read though the spool counts some (damage only, or
			// a count gone wrong): not a loop on the spool's lock.
			if !wait() {
				return nil
			}
			continue
		}
		backoff = 100 * time.Millisecond
		if l.spool.Len() == 0 {
			l.log.Info("spool replayed; producing directly again")
		}
	}
}

// produceSpooled produces one chunk of spooled events, retrying with
// backoff what Kafka fails, until all are produced (true) or ctx is done
// (false). Events that do not parse are dropped with an error log:
// they were written by this program, so that means a corrupt disk.
func (l *Listener) produceSpooled(ctx context.Context, values [][]byte) bool {
	records := make([]*kgo.Record, 0, len(values))
	deadlines := make(map[*kgo.Record]time.Time, len(values))
	events := make(map[*kgo.Record]timeoutevent.Event, len(values))
	var follow []session.Replayed
	for _, v := range values {
		ev, err := timeoutevent.Parse(v)
		if errors.Is(err, timeoutevent.ErrUnknownVersion) {
			// Spooled by a newer build before a rollback: produce it as
			// it is, keyed by its uid; consumers that cannot read it
			// dead-letter it, where it is kept.
			var head struct {
				UID string `json:"uid"`
			}
			if json.Unmarshal(v, &head) == nil && head.UID != "" {
				ev, err = timeoutevent.Event{UID: head.UID}, nil
			}
		}
		if err != nil {
			metricSpoolCorrupt.Inc()
			l.log.Error("drop unreadable spooled event", "err", err, "value", string(v))
			continue
		}
		r := &kgo.Record{Key: []byte(ev.UID), Value: v}
		records = append(records, r)
		events[r] = ev
		if ev.DueMS > 0 {
			deadlines[r] = time.UnixMilli(ev.DueMS) // the stage's; for stage 1 the deadline
		}
	}
	backoff := 100 * time.Millisecond
	for len(records) > 0 {
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.cfg.ProduceTimeout)
		results := l.producer.ProduceSync(pctx, records...)
		cancel()
		var again []*kgo.Record
		var lastErr error
		for _, r := range results {
			if r.Err != nil {
				// A new record: franz-go keeps the produce context in
				// the old one, and that context is done.
				nr := &kgo.Record{Key: r.Record.Key, Value: r.Record.Value}
				if d, ok := deadlines[r.Record]; ok {
					deadlines[nr] = d
				}
				if ev, ok := events[r.Record]; ok {
					events[nr] = ev
				}
				again = append(again, nr)
				lastErr = r.Err
				continue
			}
			metricReplayed.Inc()
			// Redis's clock set the deadline and this host's reads now:
			// on one machine or NTP-synced hosts the gap is noise next to
			// an outage's lag.
			if d, ok := deadlines[r.Record]; ok {
				metricLag.WithLabelValues(pathSpool).Observe(time.Since(d).Seconds())
			}
			if ev, ok := events[r.Record]; ok {
				if ev.ID != "" && !ev.Last() { // a stage that others follow
					follow = append(follow, l.replayed(ev))
				}
				l.noteReplayed(ev)
			}
		}
		// The stages after those on the topic now are due from now on;
		// not before, or they could overtake them.
		if !l.followReplayed(ctx, follow) {
			return false
		}
		follow = follow[:0]
		if len(again) == 0 {
			l.replayDown.OK()
			return true
		}
		metricProduceErrors.Add(float64(len(again)))
		l.replayDown.Fail(fmt.Errorf("%d of %d failed: %w", len(again), len(records), lastErr))
		records = again
		sleep(ctx, backoff)
		backoff = min(backoff*2, 5*time.Second)
		if ctx.Err() != nil {
			return false
		}
	}
	return true
}
