package session

import (
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestPrefetchWindow: a window read lists the overdue entries and the new
// part up to now+ahead, with their scores; the new part starts after what
// was read before, is cut at the limit, and the mark rides along.
func TestPrefetchWindow(t *testing.T) {
	s, ctx := newStore(t)
	const b = 7
	now := time.Now().UnixMilli()
	add := func(uid string, at int64) {
		if err := s.rdb.ZAdd(ctx, s.ks.IndexKey(b), redis.Z{Score: float64(at), Member: uid}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	add("past", now-5000)
	add("soon", now+300_000) // moved below, once the first read is done
	for i := range 5 {
		add(fmt.Sprintf("w%d", i), now+60_000+int64(i))
	}
	add("far", now+3_600_000)
	read := WindowRead{Bucket: b, Ahead: 2 * time.Minute, Limit: 3}
	wins, marked, err := s.Prefetch(ctx, []WindowRead{read}, &SweepMark{GapMax: time.Second, Keep: time.Hour, Listener: "me"})
	if err != nil || marked.Err != nil {
		t.Fatal(err, marked.Err)
	}
	if _, ok := marked.Control.Listeners["me"]; !ok {
		t.Fatalf("the mark in the pipeline did not record the listener: %+v", marked.Control)
	}
	w := wins[0]
	if w.Overdue != 1 || w.Entries[0] != (Timed{"past", now - 5000}) {
		t.Fatalf("overdue part = %d %+v, want past", w.Overdue, w.Entries)
	}
	if len(w.Entries) != 4 || !w.Cut || w.Entries[3] != (Timed{"w2", now + 60_002}) {
		t.Fatalf("new part = %+v cut %v, want w0..w2, cut", w.Entries[1:], w.Cut)
	}
	// The next read goes on after the last score it got.
	read.From = w.Entries[3].At
	wins, _, err = s.Prefetch(ctx, []WindowRead{read}, nil)
	if err != nil {
		t.Fatal(err)
	}
	w = wins[0]
	if w.Overdue != 1 || len(w.Entries) != 3 || w.Entries[1].UID != "w3" || w.Entries[2].UID != "w4" || w.Cut {
		t.Fatalf("second read = %+v cut %v, want past, w3, w4", w.Entries, w.Cut)
	}
	// The hold set is read alike.
	if err := s.rdb.ZAdd(ctx, s.ks.HoldKey(b), redis.Z{Score: float64(now + 1000), Member: "held"}).Err(); err != nil {
		t.Fatal(err)
	}
	wins, _, err = s.Prefetch(ctx, []WindowRead{{Bucket: b, Hold: true, Ahead: time.Minute, Limit: 10}}, nil)
	if err != nil || len(wins[0].Entries) != 1 || wins[0].Entries[0].UID != "held" {
		t.Fatalf("hold window = %+v, %v", wins, err)
	}
}

// TestConfirm: of fired candidates, the due ones are listed as Due lists
// them; a renewed one is not due and says where its deadline is now; a
// held one whose release came is put back and listed.
func TestConfirm(t *testing.T) {
	s, ctx := newStore(t)
	for _, uid := range []string{"gone", "renewed"} {
		if _, err := s.Renew(ctx, uid, "default", 30*time.Millisecond, ClockPresence); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 20*time.Second, "both sessions to run out", func() bool {
		n, err := s.rdb.Exists(ctx, s.ks.SessionKey("gone"), s.ks.SessionKey("renewed")).Result()
		return err == nil && n == 0
	})
	renewed, err := s.Renew(ctx, "renewed", "default", time.Minute, ClockPresence)
	if err != nil {
		t.Fatal(err)
	}
	// "parked" is held until a release that has come.
	parked, err := s.Renew(ctx, "parked", "default", 20*time.Millisecond, ClockPresence)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "parked to run out", func() bool { live, err := s.Live(ctx, "parked"); return err == nil && !live })
	e := Expired{UID: "parked", Due: parked, Deadline: parked}
	if n, err := s.Hold(ctx, []Expired{e}, time.Now().Add(-time.Second)); err != nil || n != 1 {
		t.Fatalf("Hold = %d, %v", n, err)
	}
	got, marked, err := s.Confirm(ctx, []Candidate{{UID: "gone"}, {UID: "renewed"}, {UID: "parked", Held: true}, {UID: "nobody"}}, nil)
	if err != nil || marked.Err != nil {
		t.Fatal(err, marked.Err)
	}
	due := map[string]Expired{}
	for _, e := range got.Due {
		due[e.UID] = e
	}
	if len(due) != 2 || due["gone"].UID == "" || !due["parked"].Rechecked {
		t.Fatalf("due = %+v, want gone and parked (rechecked)", got.Due)
	}
	nd := map[string]NotDue{}
	for _, n := range got.NotDue {
		nd[n.UID] = n
	}
	if r := nd["renewed"]; !r.InIndex || r.Index != renewed.UnixMilli() || r.Held {
		t.Fatalf("renewed not due = %+v, want its new deadline %d", r, renewed.UnixMilli())
	}
	if r, ok := nd["nobody"]; !ok || r.InIndex || r.Held {
		t.Fatalf("nobody not due = %+v %v, want listed nowhere", r, ok)
	}
	if got.Now < renewed.UnixMilli()-int64(time.Minute/time.Millisecond) {
		t.Fatalf("now %d", got.Now)
	}
}

// TestConfirmHeldRelease: a held candidate whose release came is put
// back and found due at the deadline it was held with, read once in the
// release; one whose user renewed in the grace is not due, and says the
// renewal's deadline.
func TestConfirmHeldRelease(t *testing.T) {
	s, ctx := newStore(t)
	deadlines := map[string]time.Time{}
	for _, uid := range []string{"released", "came-back"} {
		d, err := s.Renew(ctx, uid, "default", 20*time.Millisecond, ClockPresence)
		if err != nil {
			t.Fatal(err)
		}
		deadlines[uid] = d
	}
	eventually(t, 20*time.Second, "both sessions to run out", func() bool {
		n, err := s.rdb.Exists(ctx, s.ks.SessionKey("released"), s.ks.SessionKey("came-back")).Result()
		return err == nil && n == 0
	})
	var held []Expired
	for uid, d := range deadlines {
		held = append(held, Expired{UID: uid, Due: d, Deadline: d})
	}
	if n, err := s.Hold(ctx, held, time.Now().Add(-time.Second)); err != nil || n != 2 {
		t.Fatalf("Hold = %d, %v", n, err)
	}
	back, err := s.Renew(ctx, "came-back", "default", time.Minute, ClockPresence) // in the grace
	if err != nil {
		t.Fatal(err)
	}
	got, _, err := s.Confirm(ctx, []Candidate{{UID: "released", Held: true}, {UID: "came-back", Held: true}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Due) != 1 || got.Due[0].UID != "released" || !got.Due[0].Rechecked ||
		got.Due[0].Deadline.UnixMilli() != deadlines["released"].UnixMilli() {
		t.Fatalf("due = %+v, want released at its held deadline %d", got.Due, deadlines["released"].UnixMilli())
	}
	if len(got.NotDue) != 1 || got.NotDue[0].UID != "came-back" || !got.NotDue[0].InIndex || got.NotDue[0].Index != back.UnixMilli() {
		t.Fatalf("not due = %+v, want came-back at its renewal's deadline %d", got.NotDue, back.UnixMilli())
	}
}
