package expiry

import (
	"errors"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/stillthere/stillthere/pkg/spool"
)

// The spool keeps, on this replica's disk, the events Kafka did not take,
// and every event after them until they are replayed (replay.go), so that
// the replay keeps them in order.

// direct reports whether the pipeline may produce to Kafka itself: the
// topic exists and nothing waits in the spool ahead of it.
func (l *Listener) direct() bool {
	return l.topicReady.Load() && l.spool.Len() == 0
}

// toSpool appends records' values to the spool, durably, and wakes the
// replayer. The value carries the uid, which is all the key needs.
func (l *Listener) toSpool(records []*kgo.Record) error {
	values := make([][]byte, len(records))
	for i, r := range records {
		values[i] = r.Value
	}
	err := l.spool.Append(values...)
	l.updateSpoolMetrics()
	if err != nil {
		if errors.Is(err, spool.ErrFull) {
			l.spoolFull.Store(true)
		}
		return err
	}
	metricSpooled.Add(float64(len(records)))
	select {
	case l.spooled <- struct{}{}:
	default:
	}
	return nil
}

// pausedBySpool reports whether the spool is at its cap with events in it
// to replay, in which case the listener takes no new work: the sessions
// stay in the deadline index, where the sweep finds them once the spool
// has drained. A spool with nothing to replay never holds work back, even
// one its committed bytes still fill (its read position could not be
// saved nor removed, so the file is not cut): the listener produces
// directly, and an append that does not fit is refused whole (ErrFull),
// its sessions left in the index.
func (l *Listener) pausedBySpool() bool {
	full := l.spool.Full() && l.spool.Len() > 0
	if full != l.spoolFull.Swap(full) {
		if full {
			l.log.Error("spool is full; sweeps pause until Kafka takes the spooled events", "bytes", l.spool.Size(), "cap", l.cfg.SpoolMaxBytes)
		} else {
			l.log.Info("spool has room again; sweeps resume")
		}
	}
	if full {
		metricSpoolFull.Set(1)
	} else {
		metricSpoolFull.Set(0)
	}
	return full
}

func (l *Listener) updateSpoolMetrics() {
	metricSpoolEvents.Set(float64(l.spool.Len()))
	metricSpoolBytes.Set(float64(l.spool.Size()))
}
