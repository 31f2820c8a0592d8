package activityfeed

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

var (
	metricRecords = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "stillthere_activity_feed_records_total",
		Help: "Records of the activity topic this member handled, by outcome: applied, dead-lettered (refused, with the reason in a header).",
	}, []string{"outcome"})
	_ = promauto.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "stillthere_activity_feed_lag_seconds",
		Help: "How far the activity watermark of the partitions this member owns trails now: the listener holds deadlines past it. It grows while stamps fail (Kafka or Redis down, records that cannot be applied); 0 while the member owns no partition. Take the max over members.",
	}, live.lag)
)

// live are the feeds of this process, whose lag the gauge reports: one
// in a gateway, several in a test.
var live = &feeds{set: map[*Feed]bool{}}

type feeds struct {
	mu  sync.Mutex
	set map[*Feed]bool
}

func (fs *feeds) add(f *Feed) {
	fs.mu.Lock()
	fs.set[f] = true
	fs.mu.Unlock()
}

func (fs *feeds) remove(f *Feed) {
	fs.mu.Lock()
	delete(fs.set, f)
	fs.mu.Unlock()
}

// lag is the largest lag of the feeds, in seconds.
func (fs *feeds) lag() float64 {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	var most time.Duration
	for f := range fs.set {
		most = max(most, f.lag())
	}
	return most.Seconds()
}
