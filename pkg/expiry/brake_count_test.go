package expiry

import (
	"context"
	"testing"
	"time"
)

// TestBrakeHoldsWhenItCannotCount: a crowd lapses while the brake cannot
// count lapses (here the count's keys hold the wrong type, so every count
// fails; a count that times out in a stall fails the same way). Not
// knowing whether this is a storm, the brake holds each fresh lapse for
// the grace and checks it again, rather than let a crowd that may have
// been cut off from us out at once: every one is produced once, a grace
// after its deadline.
func TestBrakeHoldsWhenItCannotCount(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.brakePolicy()
	ctx := context.Background()
	ks := h.store.Keyspace()
	now := h.redisNow().Unix()
	// Every second the count reads, from before the crowd to well after
	// its release: a hash where a counter should be.
	for sec := now - 15; sec <= now+int64((testGrace+30*time.Second)/time.Second); sec++ {
		if err := h.rdb.HSet(ctx, ks.LapsesKey(sec), "not", "a counter").Err(); err != nil {
			t.Fatal(err)
		}
	}
	stop := h.start(h.brakeConfig(ModeHybrid))
	defer stop()
	h.waitSubscribed(1)
	storm := h.storm("uncounted", 120, time.Second)
	waitFor(t, waitLong+testGrace, "an event for every user of the crowd", func() bool {
		by := byUID(h.events())
		for uid := range storm {
			if len(by[uid]) == 0 {
				return false
			}
		}
		return true
	})
	by := byUID(h.events())
	checkStorm(t, by, storm)
	early := 0
	for uid := range storm {
		ev := by[uid][0]
		if d := time.Duration(ev.DetectedMS-ev.DeadlineMS) * time.Millisecond; d < testGrace-250*time.Millisecond {
			if early++; early <= 3 {
				t.Errorf("%s produced %v after its deadline, within the grace (%v), while the brake could not count", uid, d, testGrace)
			}
		}
	}
	if early > 0 {
		t.Errorf("%d of %d lapses produced within the grace while the brake could not count them", early, len(storm))
	}
}
