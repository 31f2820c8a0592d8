package expiry

import (
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/session"
)

// bucketUIDs returns n uids of bucket b.
func bucketUIDs(b, n int) []string {
	var out []string
	for i := 0; len(out) < n; i++ {
		if uid := "u" + string(rune('a'+i%26)) + time.Duration(i).String(); session.Bucket(uid) == b {
			out = append(out, uid)
		}
	}
	return out
}

// TestDetector: what a read finds is armed, the window moves to now+ahead
// or, when cut, to before its last entry; timers fire by the estimate of
// Redis's clock, late rather than early; a renewal inside the window is
// armed again, one beyond it is left to the window; buckets no longer
// owned lose their timers.
func TestDetector(t *testing.T) {
	cfg := DefaultConfig()
	d := newDetector(cfg)
	var owned [session.Buckets]bool
	owned[3], owned[5] = true, true
	d.own(owned)
	reads := d.reads()
	if len(reads) != 4 || reads[0].Bucket != 3 || reads[0].Hold || !reads[1].Hold || reads[0].From != 0 {
		t.Fatalf("reads = %+v, want index and hold of buckets 3 and 5, from now", reads)
	}
	u3, u5 := bucketUIDs(3, 3), bucketUIDs(5, 1)
	const now = 1_000_000
	// The reply came 5ms after Redis read its clock: the estimate is 5ms
	// late.
	at := d.base.Add(10 * time.Millisecond)
	wins := []session.Window{
		{Now: now, Overdue: 1, Entries: []session.Timed{{UID: u3[0], At: now - 50}, {UID: u3[1], At: now + 200}}},
		{Now: now, Entries: []session.Timed{{UID: u3[2], At: now + 300}}},
		{Now: now + 1, Entries: []session.Timed{{UID: u5[0], At: now + 400}}, Cut: true},
		{Now: now + 1},
	}
	d.apply(reads, wins, at)
	if d.upTo[3] != now+1000 || d.holdUpTo[3] != now+1000 || d.upTo[5] != now+399 || d.holdUpTo[5] != now+1001 {
		t.Fatalf("windows moved to %d %d %d %d", d.upTo[3], d.holdUpTo[3], d.upTo[5], d.holdUpTo[5])
	}
	if got := d.due(at); len(got) != 1 || got[0].UID != u3[0] {
		t.Fatalf("due at once = %+v, want the overdue %s", got, u3[0])
	}
	d.lastFire = at
	// u3[1] is due at now+200; it fires once Redis's clock is past it by
	// the estimate, which lags: not before.
	wake, ok := d.wake()
	if !ok || wake.Sub(d.base) != 211*time.Millisecond {
		t.Fatalf("wake at %v, want 211ms after base (due at +200, +1 past it, +10 of the reply's lag)", wake.Sub(d.base))
	}
	if got := d.due(wake.Add(-time.Millisecond)); len(got) != 0 {
		t.Fatalf("fired early: %+v", got)
	}
	if got := d.due(wake); len(got) != 1 || got[0].UID != u3[1] || got[0].Held {
		t.Fatalf("due at wake = %+v, want %s", got, u3[1])
	}
	// Redis says u3[1] was renewed: to inside the window (armed again),
	// then beyond it (left to the window read).
	d.rearm([]session.NotDue{{UID: u3[1], Index: now + 900, InIndex: true}}, now+201)
	if tm, ok := d.timers.by[u3[1]]; !ok || tm.at != now+900 {
		t.Fatalf("renewed inside the window: timer %+v %v, want at %d", tm, ok, now+900)
	}
	d.timers.popDue(now+901, 10)
	d.rearm([]session.NotDue{{UID: u3[1], Index: now + 5000, InIndex: true}}, now+902)
	if _, ok := d.timers.by[u3[1]]; ok {
		t.Fatalf("renewed beyond the window: armed anyway")
	}
	// Due by its score though Redis did not find it due: left to the next
	// read's overdue part.
	d.rearm([]session.NotDue{{UID: u3[1], Index: now + 800, InIndex: true}}, now+902)
	if _, ok := d.timers.by[u3[1]]; ok {
		t.Fatalf("a timer whose time passed was armed again")
	}
	// Bucket 5 passes to another replica: its timers go, and it is read
	// from scratch if it comes back.
	owned[5] = false
	d.own(owned)
	if _, ok := d.timers.by[u5[0]]; ok || d.upTo[5] != 0 {
		t.Fatalf("bucket 5 given up: timer kept %v, window at %d", ok, d.upTo[5])
	}
	if len(d.reads()) != 2 {
		t.Fatalf("reads after giving up bucket 5: %+v", d.reads())
	}
}
