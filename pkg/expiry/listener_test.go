package expiry

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/stillthere/stillthere/pkg/session"
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
// spooled, their index entries settled, and all produced exactly once when
// Kafka takes them again: a replica that meets another's claim leaves the
// entry to the claimer, who spools what fails.
func TestProduceFailure(t *testing.T) {
	tests := []struct {
		name       string
		partitions []int32 // that refuse records; nil means all
		err        *kerr.Error
		// replicas is the number of listeners; 0 means 1.
		replicas int
	}{
		// Retriable: the producer retries until its delivery timeout.
		{"kafka down", nil, kerr.NotEnoughReplicas, 0},
		// Not retriable: a produce fails at once.
		{"kafka refuses", nil, kerr.UnknownServerError, 0},
		// Batches partly produced, partly spooled.
		{"one partition refuses", []int32{0}, kerr.UnknownServerError, 0},
		{"kafka down under two listeners", nil, kerr.NotEnoughReplicas, 2},
		{"kafka refuses under two listeners", nil, kerr.UnknownServerError, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			replicas := max(tt.replicas, 1)
			var ls []*Listener
			var stops []func()
			for range replicas {
				l, stop := h.startListener(h.config(ModeHybrid))
				ls, stops = append(ls, l), append(stops, stop)
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

			// Every silence leaves the index during the outage: produced
			// (to a partition still up) or spooled.
			h.waitSettled(slices.Collect(maps.Keys(want)))
			spooled := 0
			for _, l := range ls {
				spooled += l.spool.Len()
			}
			if tt.partitions == nil {
				if n := h.produced(); n != 0 {
					t.Fatalf("%d events produced while Kafka was down", n)
				}
				if spooled != len(want) {
					t.Fatalf("%d events spooled while Kafka was down, want %d", spooled, len(want))
				}
			} else if spooled == 0 {
				t.Fatal("nothing spooled while a partition refused records")
			}
			outage.Remove()

			h.waitProduced(len(want))
			waitFor(t, waitLong, "the spools to drain", func() bool {
				for _, l := range ls {
					if l.spool.Len() != 0 {
						return false
					}
				}
				return true
			})
			stop()
			checkExactlyOnce(t, h.events(), want, sourcesOf(ModeHybrid)...)
			h.checkLive(live)

			// Each timeout holds its dedup key, marked produced or
			// spooled: another replica, or a later sweep, settles rather
			// than produces it.
			ks := h.store.Keyspace()
			for uid, g := range want {
				v, err := h.rdb.Get(context.Background(), ks.DedupKey(uid, session.DedupWindow(g.deadline))).Result()
				if err != nil || (v != session.DedupProduced(g.deadline) && v != session.DedupSpooled(g.deadline)) {
					t.Errorf("dedup key of %s: %q, %v; want %q or %q", uid, v, err, session.DedupProduced(g.deadline), session.DedupSpooled(g.deadline))
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
	checkCollapsible(t, evs, want)
	// The dedup key makes it exactly once while Kafka takes every record.
	checkExactlyOnce(t, evs, want, sourcesOf(ModeHybrid)...)
	h.checkLive(live)
}

// TestOwnClaimIsFresh: a dedup key left holding this listener's own claim
// (its release failed) does not hold the timeout up until the claim
// lapses: the listener produces it.
func TestOwnClaimIsFresh(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	l, stop := h.startListener(h.config(ModeSweep))
	g := h.renew("user", "default", 300*time.Millisecond)
	key := h.store.Keyspace().DedupKey("user", session.DedupWindow(g.deadline))
	if err := h.rdb.Set(context.Background(), key, l.claim, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	h.waitProduced(1) // well within the minute the claim would hold
	h.waitSettled([]string{"user"})
	stop()
	checkExactlyOnce(t, h.events(), map[string]grant{"user": g}, timeoutevent.SourceSweep)
}
