package expiry

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// sourcesOf are the detection paths a mode may report.
func sourcesOf(mode string) []string {
	switch mode {
	case ModeEvents:
		return []string{timeoutevent.SourceEvent}
	case ModeSweep:
		return []string{timeoutevent.SourceSweep}
	default:
		return []string{timeoutevent.SourceSweep, timeoutevent.SourceEvent}
	}
}

// goSilent renews n sessions with TTLs from 300ms to 800ms and returns
// what they were granted.
func (h *harness) goSilent(name string, n int) map[string]grant {
	want := make(map[string]grant, n)
	for i := range n {
		uid := fmt.Sprintf("%s-%02d", name, i)
		ttl := 300*time.Millisecond + time.Duration(i%6)*100*time.Millisecond
		want[uid] = h.renew(uid, fmt.Sprintf("seg-%d", i%3), ttl)
	}
	return want
}

// stayLive renews n sessions that outlive the test.
func (h *harness) stayLive(n int) []string {
	var uids []string
	for i := range n {
		uid := fmt.Sprintf("live-%d", i)
		h.renew(uid, "default", time.Minute)
		uids = append(uids, uid)
	}
	return uids
}

// checkLive checks that live sessions kept their keys and index entries.
func (h *harness) checkLive(uids []string) {
	h.t.Helper()
	for _, uid := range uids {
		live, err := h.store.Live(context.Background(), uid)
		if err != nil || !live || !h.inIndex(uid) {
			h.t.Errorf("live session %s: key present %v (%v), index entry present %v", uid, live, err, h.inIndex(uid))
		}
	}
}

// TestModes: in every mode, each session that goes silent gets exactly one
// event with its deadline and segment, and its index entry is settled;
// sessions still live get none.
func TestModes(t *testing.T) {
	for _, mode := range []string{ModeEvents, ModeSweep, ModeHybrid} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			ctx := context.Background()

			// A user whose session ran out but who came back before any
			// listener noticed: only the silence after the renewal counts.
			h.renew("comeback", "default", 20*time.Millisecond)
			waitFor(t, waitLong, "the first session of comeback to run out", func() bool {
				live, err := h.store.Live(ctx, "comeback")
				if err != nil {
					t.Fatal(err)
				}
				return !live
			})
			// Long enough for the listener to subscribe first: events mode
			// has no other way to see it.
			comeback := h.renew("comeback", "back", 1500*time.Millisecond)

			stop := h.start(h.config(mode))
			if mode != ModeSweep {
				h.waitSubscribed(1)
			}
			live := h.stayLive(3)
			want := h.goSilent("user", 50)
			want["comeback"] = comeback

			h.waitProduced(len(want))
			h.waitSettled(slices.Collect(maps.Keys(want)))
			stop() // nothing is produced after this
			evs := h.events()
			checkExactlyOnce(t, evs, want, sourcesOf(mode)...)
			h.checkLive(live)
		})
	}
}

// TestEnablesKeyspaceEvents: a Redis with expired keyevents off gets them
// turned on, keeping the flags it had, and events mode then works.
func TestEnablesKeyspaceEvents(t *testing.T) {
	tests := []struct {
		name    string
		initial string
	}{
		{"off", ""},
		{"keyspace and generic only", "Kg"},
		{"keyevents without expired", "Ee"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			ctx := context.Background()
			if err := h.rdb.ConfigSet(ctx, "notify-keyspace-events", tt.initial).Err(); err != nil {
				t.Fatal(err)
			}
			if got := notifyFlags(t, h); hasExpiredEvents(got) {
				t.Fatalf("notify-keyspace-events is %q before the listener started", got)
			}

			stop := h.start(h.config(ModeEvents))
			h.waitSubscribed(1)
			got := notifyFlags(t, h)
			for _, c := range tt.initial + "Ex" {
				if !strings.ContainsRune(got, c) {
					t.Errorf("notify-keyspace-events = %q, want it to contain %q", got, c)
				}
			}

			want := h.goSilent("user", 5)
			h.waitProduced(len(want))
			h.waitSettled(slices.Collect(maps.Keys(want)))
			stop()
			checkExactlyOnce(t, h.events(), want, timeoutevent.SourceEvent)
		})
	}
}

func notifyFlags(t *testing.T, h *harness) string {
	t.Helper()
	got, err := h.rdb.ConfigGet(context.Background(), "notify-keyspace-events").Result()
	if err != nil {
		t.Fatal(err)
	}
	return got["notify-keyspace-events"]
}

// TestProduceFailure: sessions that run out while Kafka refuses them are
// all produced once it takes them again, exactly once: a failed produce
// releases its dedup key and keeps its index entry for the next sweep.
func TestProduceFailure(t *testing.T) {
	tests := []struct {
		name       string
		partitions []int32 // that refuse records; nil means all
		err        *kerr.Error
		// failAgain is how many records must fail after every deadline
		// passed before the outage ends; 0 means as many as went silent.
		failAgain int
		// replicas is the number of listeners; 0 means 1.
		replicas int
	}{
		// Retriable: the producer retries until its delivery timeout, at
		// the pace of its metadata refreshes, then gives up. Each round
		// takes seconds, so one failure after the deadlines is enough.
		{"kafka down", nil, kerr.NotEnoughReplicas, 1, 0},
		// Not retriable: every sweep fails at once, so every silent
		// session fails and is retried.
		{"kafka refuses", nil, kerr.UnknownServerError, 0, 0},
		// Batches partly produced, partly failed.
		{"one partition refuses", []int32{0}, kerr.UnknownServerError, 1, 0},
		// A replica that meets another's claim must leave the index entry
		// for a retry, or the claimer's failure loses the timeout.
		{"kafka down under two listeners", nil, kerr.NotEnoughReplicas, 1, 2},
		{"kafka refuses under two listeners", nil, kerr.UnknownServerError, 0, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t)
			replicas := max(tt.replicas, 1)
			var stops []func()
			for range replicas {
				stops = append(stops, h.start(h.config(ModeHybrid)))
			}
			stop := func() {
				for _, s := range stops {
					s()
				}
			}
			h.waitSubscribed(replicas)

			// Refused before anything is written, so a failed record is
			// never on the topic.
			outage := h.kafka.Fault(kfake.Fault{
				Keys:       []kmsg.Key{kmsg.Produce},
				Topic:      testTopic,
				Partitions: tt.partitions,
				Err:        tt.err,
				Count:      -1,
			})
			live := h.stayLive(3)
			want := h.goSilent("user", 40)

			// Hold the outage until, after every deadline passed, the
			// listener failed on failAgain more records.
			var last time.Time
			for _, g := range want {
				if g.deadline.After(last) {
					last = g.deadline
				}
			}
			waitFor(t, waitLong, "every deadline to pass", func() bool { return time.Now().After(last) })
			failed := counterValue(t, metricProduceErrors)
			again := float64(tt.failAgain)
			if again == 0 {
				again = float64(len(want))
			}
			waitFor(t, waitLong, "produce failures", func() bool {
				return counterValue(t, metricProduceErrors)-failed >= again
			})
			if tt.partitions == nil {
				if n := h.produced(); n != 0 {
					t.Fatalf("%d events produced while Kafka was down", n)
				}
			}
			outage.Remove()

			h.waitProduced(len(want))
			h.waitSettled(slices.Collect(maps.Keys(want)))
			stop()
			checkExactlyOnce(t, h.events(), want, sourcesOf(ModeHybrid)...)
			h.checkLive(live)

			// Each produced timeout holds its dedup key again: released on
			// failure, claimed anew by the retry.
			ks := h.store.Keyspace()
			for uid, g := range want {
				n, err := h.rdb.Exists(context.Background(), ks.DedupKey(uid, dedupWindow(g.deadline))).Result()
				if err != nil || n != 1 {
					t.Errorf("dedup key of %s: exists %d, %v; want it held", uid, n, err)
				}
			}
		})
	}
}

// TestTwoListeners: two replicas on one Redis and one Kafka produce each
// silence once, and any duplicate carries the same id.
func TestTwoListeners(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	stopA := h.start(h.config(ModeHybrid))
	stopB := h.start(h.config(ModeHybrid))
	h.waitSubscribed(2)

	live := h.stayLive(3)
	want := h.goSilent("user", 80)
	h.waitProduced(len(want))
	h.waitSettled(slices.Collect(maps.Keys(want)))
	stopA()
	stopB()

	evs := h.events()
	got := byUID(evs)
	for uid, g := range want {
		if len(got[uid]) == 0 {
			t.Errorf("no event for %s", uid)
		}
		for _, ev := range got[uid] {
			checkEvent(t, ev, g, sourcesOf(ModeHybrid)...)
		}
	}
	// The dedup key makes it exactly once while Kafka takes every record.
	checkExactlyOnce(t, evs, want, sourcesOf(ModeHybrid)...)
	h.checkLive(live)
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}
