package devstack

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/stillthere/stillthere/pkg/guide"
	"github.com/stillthere/stillthere/pkg/session"
)

// How the tests here wait: on a condition, polled until a deadline
// (waitFor, waitCond), on Redis's clock (waitRedisPast), or on proof that
// the pipeline has done all it will for the deadlines before a time
// (waitDrained). A fixed sleep is left only where real time must pass:
// an outage lasting, a simulated user's silence or pace.

// waitPoll is how often a condition is polled.
const waitPoll = 20 * time.Millisecond

// waitFor polls cond until it holds or within has passed, and reports
// whether it held.
func waitFor(within time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	tick := time.NewTicker(waitPoll)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		<-tick.C
	}
	return true
}

// waitCond waits until cond holds, for at most within, and fails the
// test if it does not.
func waitCond(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	if !waitFor(within, cond) {
		t.Fatalf("waited %v for %s", within, what)
	}
}

// redisNow is the time by Redis's clock, the clock the sessions' TTLs
// and the deadline index run on.
func (r *faultRig) redisNow() (time.Time, error) {
	return r.client().Time(context.Background()).Result()
}

// waitRedisPast waits until Redis's clock reads past at.
func (r *faultRig) waitRedisPast(at time.Time) {
	r.t.Helper()
	within := time.Until(at) + 30*time.Second
	waitCond(r.t, within, "Redis's clock to pass "+at.Format(time.StampMilli), func() bool {
		now, err := r.redisNow()
		return err == nil && now.After(at)
	})
}

// waitDrained waits until the pipeline has done all it will for every
// deadline up to at: Redis's clock is past it, no session of the deadline
// index is due by it, nothing is held for a recheck, and the consumer's
// group (the default one, the rigs' consumers') has committed the topic's end (every timeout produced was
// settled: its guide sent, or given up). A guide that is still to come
// for such a deadline would be a guide too many; "none came" is checked
// after this, not after a pause.
func (p *faultRig) waitDrained(at time.Time) {
	p.t.Helper()
	p.waitRedisPast(at)
	ctx := context.Background()
	rdb := p.client()
	ks := p.keyspace()
	upTo := strconv.FormatInt(at.UnixMilli(), 10)
	waitCond(p.t, time.Minute, "the deadline index and hold sets to be done with every deadline by "+at.Format(time.StampMilli), func() bool {
		for b := range session.Buckets {
			if n, err := rdb.ZCount(ctx, ks.IndexKey(b), "-inf", upTo).Result(); err != nil || n != 0 {
				return false
			}
			if n, err := rdb.ZCard(ctx, ks.HoldKey(b)).Result(); err != nil || n != 0 {
				return false
			}
		}
		return true
	})
	cl, err := kgo.NewClient(kgo.SeedBrokers(p.brokers))
	if err != nil {
		p.t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	waitCond(p.t, time.Minute, "the consumer's group to commit the topic's end", func() bool {
		ends, err := adm.ListEndOffsets(ctx, p.topic)
		if err != nil {
			return false
		}
		committed, err := adm.FetchOffsets(ctx, guide.DefaultConfig().Group)
		if err != nil {
			return false
		}
		done := true
		ends.Each(func(o kadm.ListedOffset) {
			if o.Offset == 0 {
				return
			}
			c, ok := committed.Lookup(o.Topic, o.Partition)
			if !ok || c.At < o.Offset {
				done = false
			}
		})
		return done
	})
}

// pace lets d of real time pass for a simulated client: its think time
// between pings, a silence it keeps, its backoff before a redial. Real
// time is the point there (the sessions' TTLs and the services' timers
// run on it); nothing the client waits for is proved by it.
func pace(d time.Duration) {
	time.Sleep(d) // real time: the client's pace, not a wait for work
}

// paceUntil is pace until at.
func paceUntil(at time.Time) { pace(time.Until(at)) }

func TestLongestStall(t *testing.T) {
	at := func(s float64) time.Time { return time.Unix(1000, 0).Add(time.Duration(s * float64(time.Second))) }
	for _, tc := range []struct {
		name string
		ds   []massDelivery
		gap  time.Duration
		ok   bool
	}{
		{"steady", []massDelivery{{at(0), at(1)}, {at(0), at(2)}, {at(0), at(3)}}, time.Second, true},
		{"a pause with a guide owed", []massDelivery{{at(0), at(1)}, {at(0), at(7)}, {at(6), at(7.5)}}, 6 * time.Second, true},
		{"a pause with nothing owed", []massDelivery{{at(0), at(1)}, {at(6), at(7)}, {at(6), at(7.5)}}, time.Second, true},
		{"a late start", []massDelivery{{at(0), at(5)}, {at(0), at(5.5)}}, 5 * time.Second, true},
		{"done together", []massDelivery{{at(0), at(2)}, {at(1), at(2)}}, 2 * time.Second, true},
		{"one", []massDelivery{{at(0), at(1)}}, time.Second, true},
		{"none", nil, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gap, _, ok := longestStall(tc.ds, true)
			if gap != tc.gap || ok != tc.ok {
				t.Errorf("longestStall = %v, %v; want %v, %v", gap, ok, tc.gap, tc.ok)
			}
		})
	}
	// From one piece done to the next only: a late start is no pause.
	for _, tc := range []struct {
		name string
		ds   []massDelivery
		gap  time.Duration
		ok   bool
	}{
		{"a pause with a guide owed", []massDelivery{{at(0), at(1)}, {at(0), at(7)}, {at(6), at(7.5)}}, 6 * time.Second, true},
		{"a late start", []massDelivery{{at(0), at(5)}, {at(0), at(5.5)}}, 500 * time.Millisecond, true},
		{"one", []massDelivery{{at(0), at(1)}}, 0, false},
	} {
		t.Run("between, "+tc.name, func(t *testing.T) {
			gap, _, ok := longestStall(tc.ds, false)
			if gap != tc.gap || ok != tc.ok {
				t.Errorf("longestStall = %v, %v; want %v, %v", gap, ok, tc.gap, tc.ok)
			}
		})
	}
}
