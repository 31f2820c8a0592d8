package promise

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// perfect is a random history of answered pings of a few users, with
// every silence guided as the service should: each stage once, on time.
// It returns the history and how many stages it delivered.
func perfect(r *rand.Rand) (History, int) {
	var h History
	end := at(600)
	h.End = end
	stages := 0
	for u := range 1 + r.IntN(4) {
		uid := fmt.Sprintf("u%d", u)
		t := at(r.Float64() * 5)
		for t.Before(end) {
			s := Signal{UID: uid, Kind: Ping, Sent: t, Outcome: Answered, Deadline: t.Add(ttl)}
			h.Signals = append(h.Signals, s)
			gap := time.Duration(r.Float64()*float64(ttl)) + time.Second // most renew in time
			if r.IntN(4) == 0 {
				gap = ttl + time.Duration(r.IntN(30))*time.Second // some go silent
			}
			next := t.Add(gap)
			// A silence: the deadline passed well before the next ping.
			if d := s.Deadline; next.After(d.Add(cfg.InFlight)) && d.Before(end) {
				g := d.Add(time.Duration(r.IntN(900)) * time.Millisecond)
				// Back well after the guide (a guide after a return
				// is one to someone present), so that a guide dropped
				// or delayed by the mutations below is missed.
				next = later(next, g.Add(3*time.Second))
				h.Deliveries = append(h.Deliveries, Delivery{UID: uid, ID: uid + d.String(), Stage: 1, Deadline: d, At: g, Sink: "phone"})
				stages++
				g2 := g.Add(cfg.Delays[0]).Add(time.Duration(r.IntN(900)) * time.Millisecond)
				// Back before stage 2 could fall due, or well after it
				// came: a return while it falls due may go either way.
				if !next.Before(d.Add(cfg.Delays[0] - 200*time.Millisecond)) {
					next = later(next, g2.Add(3*time.Second))
					if g2.Before(end) {
						h.Deliveries = append(h.Deliveries, Delivery{UID: uid, ID: uid + d.String() + "/2", Stage: 2, Deadline: d, At: g2, Sink: "phone"})
						stages++
					}
				}
			}
			t = next
		}
	}
	return h, stages
}

func count(vs []Verdict) map[Class]int {
	n := map[Class]int{}
	for _, v := range vs {
		n[v.Class]++
	}
	return n
}

// TestPerfectHistories: a perfect history is all ok; one delivery taken
// away is one loss (and no more), one repeated is one duplicate, one
// moved past its bound is one late.
func TestPerfectHistories(t *testing.T) {
	for seed := range uint64(200) {
		r := rand.New(rand.NewPCG(seed, 1))
		h, stages := perfect(r)
		if stages == 0 {
			continue
		}
		n := count(Check(cfg, h))
		for c, k := range n {
			if c != OK && c != Pending {
				t.Fatalf("seed %d: a perfect history has %d %s: %v", seed, k, c, n)
			}
		}
		i := r.IntN(len(h.Deliveries))
		mutate := func(name string, edit func([]Delivery) []Delivery, want Class) {
			h2 := h
			h2.Deliveries = edit(append([]Delivery(nil), h.Deliveries...))
			n := count(Check(cfg, h2))
			bad := 0
			for c, k := range n {
				if c != OK && c != Pending && c != Indeterminate {
					bad += k
				}
			}
			if n[want] != 1 || bad != 1 {
				t.Errorf("seed %d, %s delivery %d (%+v): %v, want one %s and no other failure", seed, name, i, h.Deliveries[i], n, want)
			}
		}
		d := h.Deliveries[i]
		if d.Stage == 1 {
			// Taking a stage 1 away leaves its stage 2 a close without a
			// reminder: two failures. Take the last stage of the silence.
			if i+1 < len(h.Deliveries) && h.Deliveries[i+1].Stage == 2 && h.Deliveries[i+1].UID == d.UID {
				i++
				d = h.Deliveries[i]
			}
		}
		if d.At.Add(2 * time.Second).Before(h.End) {
			mutate("drop", func(ds []Delivery) []Delivery { return append(ds[:i], ds[i+1:]...) }, Lost)
		}
		mutate("repeat", func(ds []Delivery) []Delivery {
			again := ds[i]
			again.At = again.At.Add(time.Millisecond)
			return append(ds, again)
		}, Duplicated)
		mutate("delay", func(ds []Delivery) []Delivery {
			ds[i].At = ds[i].At.Add(cfg.Slack + time.Second)
			return ds
		}, Late)
	}
}
