package session

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// testNotes record as a gateway's store does.
var testNotes = HoldNotes{Bounds: TimelineBounds{Entries: 100, Keep: time.Hour}, Service: "gateway", Instance: "gw-1"}

// note is an entry the notes append, as timelineOf reads it.
func note(n holdNote) string { return n.Kind + ":" + n.Rule + " by gateway/gw-1" }

// holdOne makes uid's timeout held until an hour from now, as a
// listener's hold rule would: a short grant, found due, held.
func holdOne(t *testing.T, s *Store, uid string) {
	t.Helper()
	ctx := context.Background()
	d, err := s.Renew(ctx, uid, "default", 20*time.Millisecond, ClockPresence)
	if err != nil {
		t.Fatal(err)
	}
	redisPast(t, s.rdb, d)
	e := dueOne(t, s, uid, 5*time.Second, sweepAll(s))
	if n, err := s.Hold(ctx, []Expired{e}, redisNow(t, s.rdb).Add(time.Hour)); err != nil || n != 1 {
		t.Fatalf("Hold = %d, %v; want 1", n, err)
	}
}

// timelineOf is uid's stored timeline: each entry as "kind:rule by
// service/instance", and its time. An entry that is not what the
// scripts write fails the test.
func timelineOf(t *testing.T, s *Store, uid string) ([]string, []time.Time) {
	t.Helper()
	_, raw, err := s.Timeline(context.Background(), uid)
	if err != nil {
		t.Fatal(err)
	}
	var es []string
	var ats []time.Time
	for _, e := range raw {
		var v struct {
			Service, Instance, Kind, Rule, Detail string
			InScript                              bool `json:"in_script"`
		}
		if e.Err != nil || json.Unmarshal([]byte(e.Entry), &v) != nil || v.Detail == "" || !v.InScript {
			t.Fatalf("stored entry %q (%v): want a JSON entry with a detail, in_script", e.Entry, e.Err)
		}
		es, ats = append(es, v.Kind+":"+v.Rule+" by "+v.Service+"/"+v.Instance), append(ats, e.At)
	}
	return es, ats
}

// withRenewer runs f with a Renewer of gateway instance gw-a over s.
func withRenewer(s *Store, f func(r *Renewer) error) error {
	r := NewRenewer(s, RenewerConfig{Instance: "gw-a"})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx) }()
	defer func() { cancel(); <-done }()
	return f(r)
}

// TestHoldNotes: a renewal or an end that cancels a held timeout appends,
// in its own script, the hold's recheck and what made the lapse stale to
// the user's timeline, stamped by Redis's clock; every path that cancels
// a hold does, each once. Nothing is written when nothing was held, when
// the notes are off (timeline recording off), or by a lapsed resync,
// whose silence is due again.
func TestHoldNotes(t *testing.T) {
	t.Parallel()
	base, ctx := newStore(t)
	renewed := []string{note(holdNotes.Rechecked), note(holdNotes.Renewed)}
	ended := []string{note(holdNotes.Rechecked), note(holdNotes.Ended)}
	renew := func(s *Store, uid string) error {
		_, err := s.Renew(ctx, uid, "default", time.Minute, ClockPresence)
		return err
	}
	activity := func(kind ActivityKind) func(*Store, string) error {
		return func(s *Store, uid string) error {
			_, err := s.ApplyActivity(ctx, "gw-a", SegmentRules{}, []Activity{{UID: uid, Kind: kind, TTL: time.Minute}})
			return err
		}
	}
	for _, c := range []struct {
		name  string
		notes HoldNotes
		held  bool // a timeout held before act
		act   func(s *Store, uid string) error
		want  []string
		// kept: the hold is still there after act (nothing cancelled it).
		kept bool
	}{
		{name: "renewal", notes: testNotes, held: true, act: renew, want: renewed},
		{name: "renewal, nothing held", notes: testNotes, act: renew},
		{name: "renewal, recording off", held: true, act: renew},
		{name: "renewer", notes: testNotes, held: true, want: renewed, act: func(s *Store, uid string) error {
			return withRenewer(s, func(r *Renewer) error {
				_, err := r.Renew(ctx, uid, "default", time.Minute, ClockPresence)
				return err
			})
		}},
		{name: "resync", notes: testNotes, held: true, want: renewed, act: func(s *Store, uid string) error {
			return withRenewer(s, func(r *Renewer) error {
				_, err := r.Resync(ctx, []Grant{{UID: uid, Segment: "default", Left: time.Minute, Clock: ClockPresence}})
				return err
			})
		}},
		{name: "lapsed resync", notes: testNotes, held: true, act: func(s *Store, uid string) error {
			return withRenewer(s, func(r *Renewer) error {
				_, err := r.Resync(ctx, []Grant{{UID: uid, Segment: "default", Clock: ClockPresence}})
				return err
			})
		}},
		{name: "end", notes: testNotes, held: true, want: ended, act: func(s *Store, uid string) error {
			return s.End(ctx, uid)
		}},
		{name: "renewer's end", notes: testNotes, held: true, want: ended, act: func(s *Store, uid string) error {
			return withRenewer(s, func(r *Renewer) error { return r.End(ctx, uid) })
		}},
		{name: "end, recording off", held: true, act: func(s *Store, uid string) error { return s.End(ctx, uid) }},
		{name: "last close", notes: testNotes, held: true, want: ended, act: func(s *Store, uid string) error {
			return s.WriteRoutes(ctx, "gw-a", []RouteCount{{UID: uid, End: true}}, time.Minute, nil)[0].Err
		}},
		{name: "close, not the last", notes: testNotes, held: true, kept: true, act: func(s *Store, uid string) error {
			if res := s.WriteRoutes(ctx, "gw-b", []RouteCount{{UID: uid, Count: 1}}, time.Minute, nil)[0]; res.Err != nil {
				return res.Err
			}
			return s.WriteRoutes(ctx, "gw-a", []RouteCount{{UID: uid, End: true}}, time.Minute, nil)[0].Err
		}},
		{name: "activity", notes: testNotes, held: true, want: renewed, act: activity(ActivityActive)},
		{name: "turn to the user", notes: testNotes, held: true, want: renewed, act: activity(ActivityTurnUser)},
		{name: "turn to us", notes: testNotes, held: true, want: renewed, act: activity(ActivityTurnUs)},
		{name: "the platform's end", notes: testNotes, held: true, want: ended, act: activity(ActivityEnd)},
		{name: "activity, recording off", held: true, act: activity(ActivityActive)},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := base.WithHoldNotes(c.notes)
			uid := "u-" + strings.NewReplacer(" ", "-", ",", "", "'", "").Replace(c.name)
			if c.held {
				holdOne(t, s, uid)
			}
			before := redisNow(t, s.rdb).Truncate(time.Millisecond) // entries are stamped in ms
			if err := c.act(s, uid); err != nil {
				t.Fatal(err)
			}
			after := redisNow(t, s.rdb)
			if n := s.rdb.ZCard(ctx, s.ks.HoldKey(Bucket(uid))).Val(); (n == 1) != (c.held && c.kept) {
				t.Fatalf("hold set holds %d after the act, want the hold kept: %v", n, c.held && c.kept)
			}
			got, ats := timelineOf(t, s, uid)
			if !slices.Equal(got, c.want) {
				t.Fatalf("timeline %q, want %q", got, c.want)
			}
			for _, at := range ats {
				if at.Before(before) || at.After(after) {
					t.Errorf("entry at %v, want Redis's clock when it ran, in [%v, %v]", at, before, after)
				}
			}
			if len(c.want) > 0 {
				if ttl := s.rdb.PTTL(ctx, s.ks.TimelineKey(uid)).Val(); ttl <= 0 || ttl > c.notes.Bounds.Keep {
					t.Errorf("timeline TTL %v, want up to the keep, %v", ttl, c.notes.Bounds.Keep)
				}
			}
			// Once: the hold is gone, and a renewal after it finds none; a
			// hold the act kept is this renewal's to cancel.
			if err := renew(s, uid); err != nil {
				t.Fatal(err)
			}
			want := c.want
			if c.kept {
				want = renewed
			}
			if again, _ := timelineOf(t, s, uid); !slices.Equal(again, want) {
				t.Fatalf("after another renewal: timeline %q, want %q", again, want)
			}
		})
	}
}

// TestHoldNotesBounds: the notes keep a timeline to their bounds, as
// AppendTimeline does: the oldest entries go, and the list lives for the
// keep after its last entry.
func TestHoldNotesBounds(t *testing.T) {
	t.Parallel()
	s, ctx := newStore(t)
	notes := testNotes
	notes.Bounds = TimelineBounds{Entries: 3, Keep: 2 * time.Minute}
	s = s.WithHoldNotes(notes)
	var older []TimelineRecord
	for _, k := range []string{"start", "lapse", "held"} {
		e := `{"service":"gateway","instance":"gw-1","kind":"` + k + `","detail":"before","in_script":true}`
		older = append(older, TimelineRecord{UID: "bounded", Entry: e})
	}
	if _, err := s.AppendTimeline(ctx, older, TimelineBounds{Entries: 100, Keep: time.Hour}); err != nil {
		t.Fatal(err)
	}
	holdOne(t, s, "bounded")
	if _, err := s.Renew(ctx, "bounded", "default", time.Minute, ClockPresence); err != nil {
		t.Fatal(err)
	}
	got, _ := timelineOf(t, s, "bounded")
	if want := []string{"held: by gateway/gw-1", note(holdNotes.Rechecked), note(holdNotes.Renewed)}; !slices.Equal(got, want) {
		t.Fatalf("timeline %q, want the last 3: %q", got, want)
	}
	if ttl := s.rdb.PTTL(ctx, s.ks.TimelineKey("bounded")).Val(); ttl <= time.Minute || ttl > 2*time.Minute {
		t.Errorf("timeline TTL %v, want the notes' keep, 2m", ttl)
	}
}

// TestHoldNoteCodec: the entries' words, written into the scripts'
// source as Lua strings, come out of a script as the JSON Go encodes,
// with the call's service and instance, whatever they hold.
func TestHoldNoteCodec(t *testing.T) {
	t.Parallel()
	s, ctx := newStore(t)
	src := holdNoteCodec{}.lua() + `return {encodeHoldNote(holdNoteRechecked, ARGV[1], ARGV[2]),
  encodeHoldNote(holdNoteRenewed, ARGV[1], ARGV[2]), encodeHoldNote(holdNoteEnded, ARGV[1], ARGV[2])}`
	svc, inst := `gate"way\`, "gw-'1/é"
	got, err := s.rdb.Eval(ctx, src, nil, svc, inst).StringSlice()
	if err != nil {
		t.Fatal(err)
	}
	for i, n := range []holdNote{holdNotes.Rechecked, holdNotes.Renewed, holdNotes.Ended} {
		var v struct {
			holdNote
			Service, Instance string
		}
		if err := json.Unmarshal([]byte(got[i]), &v); err != nil || v.holdNote != n || v.Service != svc || v.Instance != inst {
			t.Errorf("entry %q (%v) = %+v, want %+v by %q/%q", got[i], err, v, n, svc, inst)
		}
	}
	if !strings.Contains(luaString(`a'b\c`), `a\'b\\c`) {
		t.Errorf("luaString(a'b\\c) = %s", luaString(`a'b\c`))
	}
}

// TestActivityHoldOfABucketMate: the activity script skips the bucket's
// hold, held and stage keys when it finds them empty as it starts; one
// user's hold makes them not empty, and an event of that user, after one
// of a bucket mate in the same call, cancels it with its notes, while the
// mate's applies as usual and records nothing.
func TestActivityHoldOfABucketMate(t *testing.T) {
	t.Parallel()
	base, ctx := newStore(t)
	s := base.WithHoldNotes(testNotes)
	mate, held := "mate-0", ""
	for i := 1; held == ""; i++ {
		if uid := fmt.Sprintf("held-%d", i); Bucket(uid) == Bucket(mate) {
			held = uid
		}
	}
	holdOne(t, s, held)
	res, err := s.ApplyActivity(ctx, "gw-a", SegmentRules{}, []Activity{
		{UID: mate, Kind: ActivityActive, TTL: time.Minute},
		{UID: held, Kind: ActivityActive, TTL: time.Minute},
	})
	if err != nil || res.Applied != 2 {
		t.Fatalf("%+v, %v", res, err)
	}
	if n := s.rdb.ZCard(ctx, s.ks.HoldKey(Bucket(held))).Val(); n != 0 {
		t.Fatalf("hold set holds %d, want the hold cancelled", n)
	}
	if got, _ := timelineOf(t, s, held); !slices.Equal(got, []string{note(holdNotes.Rechecked), note(holdNotes.Renewed)}) {
		t.Fatalf("held user's timeline %q", got)
	}
	if got, _ := timelineOf(t, s, mate); len(got) != 0 {
		t.Fatalf("mate's timeline %q, want nothing", got)
	}
	for _, uid := range []string{mate, held} {
		if live, err := s.Live(ctx, uid); err != nil || !live {
			t.Fatalf("%s live %v, %v", uid, live, err)
		}
	}
}
