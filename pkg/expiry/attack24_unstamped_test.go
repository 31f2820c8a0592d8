package expiry

import (
	"context"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
	"github.com/stillthere/stillthere/pkg/session"
)

// TestAttack24FirstStampAfterUnstampedOutage: an activity feed starts
// while Kafka is out of its reach. It marks Redis "unstamped", and the
// listener holds every deadline. The platform's servers cannot reach Kafka
// either: they buffer their users' activity records. Kafka comes back; the
// member's first stamp moves the partition from 0 to now, and the records
// the platform buffered during the outage are appended after it (its
// producer retries with backoff). A deadline inside the outage is then
// judged at once: its user's activity record, still on its way to the
// topic, never counts, and the user is guided while active.
//
// A feed that had stamped before the same outage records it as an
// activity-lag blind interval, and the listener holds the deadlines in it
// until the watermark has passed the grace after it (the subtest "stamped
// before", which passes). A feed that never stamped records nothing: the
// script takes a step from 0 for a partition's first stamp, never a lag.
func TestAttack24FirstStampAfterUnstampedOutage(t *testing.T) {
	const (
		gap   = 200 * time.Millisecond
		every = 50 * time.Millisecond
		grace = 2 * time.Second
	)
	for _, tc := range []struct {
		name          string
		stampedBefore bool
	}{
		{"stamped before", true},
		{"never stamped (Kafka down from the feed's start)", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t)
			ks, err := session.NewKeyspace(redistest.Prefix(t))
			if err != nil {
				t.Fatal(err)
			}
			s := session.NewStore(redistest.Client(t, srv), ks)
			ctx := context.Background()
			clock := func() time.Time {
				t.Helper()
				now, err := s.ActivityClock(ctx)
				if err != nil {
					t.Fatal(err)
				}
				return now
			}
			mark := func() session.Control {
				t.Helper()
				c, err := s.Mark(ctx, session.SweepMark{Keep: time.Hour, GapMax: time.Hour})
				if err != nil {
					t.Fatal(err)
				}
				return c
			}
			stamp := func(at time.Time) {
				t.Helper()
				st := session.FeedStamp{Gap: gap, Every: every, Topic: "acts", Partitions: 1,
					CaughtUp: map[int32]time.Time{0: at}}
				if _, err := s.ActivityCaughtUp(ctx, st); err != nil {
					t.Fatal(err)
				}
			}
			if tc.stampedBefore {
				stamp(clock())
			}
			// The member starts (again); Kafka is out of reach from here.
			if err := s.ActivityFeedStarting(ctx); err != nil {
				t.Fatal(err)
			}
			start := clock()
			// The user's last activity, in a record the platform buffers,
			// and their deadline, both inside the outage.
			due := start.Add(gap / 2)
			if rel := outageHold(mark(), session.Expired{UID: "u", Stage: 1, Due: due, Deadline: due}, grace).release; rel.IsZero() {
				t.Fatal("while the feed has not stamped, a deadline is not held")
			}
			// The outage lasts longer than the gap: real time must pass,
			// on Redis's clock (it stamps the interval).
			deadline := time.Now().Add(10 * time.Second)
			for clock().Before(start.Add(3 * gap)) {
				if time.Now().After(deadline) {
					t.Fatal("Redis's clock did not move")
				}
				time.Sleep(10 * time.Millisecond) // a poll of Redis's clock
			}
			// Kafka is back: the member's first stamp since. The buffered
			// records land in the topic after this stamp's time.
			stamp(clock())
			c := mark()
			o := outageHold(c, session.Expired{UID: "u", Stage: 1, Due: due, Deadline: due}, grace)
			rel, rule := o.release, o.rule
			if rel.IsZero() {
				w, _ := c.ActivityWatermark()
				t.Errorf("a deadline %v into a %v Kafka outage is judged at the feed's first stamp (watermark %v, blind intervals %+v): "+
					"the platform's records of the outage, appended after the stamp, are never waited for, and an active user is guided",
					due.Sub(start), c.Now.Sub(start), w.Sub(start), c.Blind)
			} else {
				t.Logf("held until %v by %v", rel.Sub(c.Now), rule)
			}
		})
	}
}
