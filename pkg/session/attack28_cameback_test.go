package session

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// guidedOne leaves uid between the stages of a guided silence, as the
// listener does once stage 1 is out: a short grant, found due, settled
// with stage 2 an hour later. It returns the settled timeout.
func guidedOne(t *testing.T, s *Store, uid string) Expired {
	t.Helper()
	ctx := context.Background()
	d, err := s.Renew(ctx, uid, "default", 20*time.Millisecond, ClockPresence)
	if err != nil {
		t.Fatal(err)
	}
	redisPast(t, s.rdb, d)
	e := dueOne(t, s, uid, 5*time.Second, sweepAll(s))
	e.NextDue = e.Due.Add(time.Hour)
	if err := s.Settle(ctx, []Expired{e}); err != nil {
		t.Fatal(err)
	}
	if st := s.rdb.HGet(ctx, s.ks.StageKey(Bucket(uid)), uid).Val(); st == "" {
		t.Fatal("no stage entry after the settle")
	}
	return e
}

// storedNote is one stored entry of a timeline, the fields these tests read.
type storedNote struct {
	Kind, Rule, Detail string
	Stage              int
	Deadline           int64 `json:"deadline_ms"`
}

func notesOf(t *testing.T, s *Store, uid string) []storedNote {
	t.Helper()
	_, raw, err := s.Timeline(context.Background(), uid)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]storedNote, 0, len(raw))
	for _, e := range raw {
		var n storedNote
		if e.Err != nil || json.Unmarshal([]byte(e.Entry), &n) != nil {
			t.Fatalf("stored entry %q (%v)", e.Entry, e.Err)
		}
		out = append(out, n)
	}
	return out
}

// TestAttack28CameBackEveryPath: every grant that ends a guided silence
// between its stages (its stage entry dropped: the stages left are
// cancelled) says so in the user's timeline, once, with the stage that
// was due next and the silence's deadline: a renewal, the renewer's, a
// resync, a lapsed resync whose ping came after the silence's deadline
// (restored as a new silence: the old one's close is cancelled all the
// same), and each activity event that grants. A turn to the user is the
// platform speaking, not the user: its entry must not say the user
// renewed.
func TestAttack28CameBackEveryPath(t *testing.T) {
	t.Parallel()
	base, ctx := newStore(t)
	s := base.WithHoldNotes(testNotes)
	activity := func(kind ActivityKind) func(string) error {
		return func(uid string) error {
			_, err := s.ApplyActivity(ctx, "gw-a", SegmentRules{}, []Activity{{UID: uid, Kind: kind, TTL: time.Minute}})
			return err
		}
	}
	for _, c := range []struct {
		name string
		act  func(uid string) error
		// notRenewed: the user did nothing; the entry must not say so.
		notRenewed bool
	}{
		{name: "renewal", act: func(uid string) error {
			_, err := s.Renew(ctx, uid, "default", time.Minute, ClockPresence)
			return err
		}},
		{name: "renewer", act: func(uid string) error {
			return withRenewer(s, func(r *Renewer) error {
				_, err := r.Renew(ctx, uid, "default", time.Minute, ClockPresence)
				return err
			})
		}},
		{name: "resync", act: func(uid string) error {
			return withRenewer(s, func(r *Renewer) error {
				_, err := r.Resync(ctx, []Grant{{UID: uid, Segment: "default", Left: time.Minute, Ago: 10 * time.Millisecond, Clock: ClockPresence}})
				return err
			})
		}},
		{name: "lapsed resync", act: func(uid string) error {
			return withRenewer(s, func(r *Renewer) error {
				_, err := r.Resync(ctx, []Grant{{UID: uid, Segment: "default", Ago: 10 * time.Millisecond, Clock: ClockPresence}})
				return err
			})
		}},
		{name: "activity", act: activity(ActivityActive)},
		{name: "turn to us", act: activity(ActivityTurnUs)},
		{name: "turn to the user", act: activity(ActivityTurnUser), notRenewed: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			uid := "a28-" + strings.ReplaceAll(c.name, " ", "-")
			e := guidedOne(t, s, uid)
			// The act's ping is after the silence's deadline (a lapsed
			// resync restores only such a ping).
			redisPast(t, s.rdb, e.Deadline.Add(50*time.Millisecond))
			if err := c.act(uid); err != nil {
				t.Fatal(err)
			}
			_, err := s.rdb.HGet(ctx, s.ks.StageKey(Bucket(uid)), uid).Result()
			if !errors.Is(err, redis.Nil) {
				t.Fatalf("stage entry after the act: %v; want it dropped (the premise: the stages left cancelled)", err)
			}
			got := notesOf(t, s, uid)
			if len(got) != 1 || got[0].Kind != holdNotes.StagesCancelled.Kind || got[0].Rule != holdNotes.StagesCancelled.Rule ||
				got[0].Stage != 2 || got[0].Deadline != e.Deadline.UnixMilli() {
				t.Fatalf("timeline %+v; want one granted:stages-cancelled of stage 2, deadline %d: the silence's close was cancelled and nothing says why",
					got, e.Deadline.UnixMilli())
			}
			if c.notRenewed && strings.Contains(got[0].Detail, "the user renewed") {
				t.Errorf("detail %q: a turn to the user is the platform speaking, the user did nothing", got[0].Detail)
			}
		})
	}
}
