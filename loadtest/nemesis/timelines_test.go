package main

import (
	"strings"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/promise"
)

// A close stage the mass-expiry brake held, engaged by a crowd of close
// stages (their reminders held together by a failover's blind interval,
// then released together), past its bound; the user came back during the
// hold and their renewal cancelled it. The devices saw nothing, as they
// should: late, not lost. From a run of seed 737445.
func TestCancelledLate(t *testing.T) {
	t0 := time.UnixMilli(1_800_000_000_000)
	at := func(ms int64) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	ms := func(rel int64) int64 { return at(rel).UnixMilli() }
	cfg := checkConfig(settings{ttl: 4 * time.Second, closeAfter: 3 * time.Second, grace: 8 * time.Second})
	h := promise.History{Signals: []promise.Signal{
		{UID: "ws-016", Kind: promise.Ping, Sent: at(13797), Answered: at(13800), Outcome: promise.Answered, Deadline: at(17800)},
		{UID: "ws-016", Kind: promise.Ping, Sent: at(29069), Answered: at(29072), Outcome: promise.Answered, Deadline: at(33072)},
	}}
	lost := promise.Verdict{UID: "ws-016", Deadline: at(17800), Stage: 2, Due: at(20800), Bound: at(26893), Class: promise.Lost, Why: "never delivered"}
	lapse := tlEntry{AtMS: ms(24872), Kind: "lapse", Stage: 2, Deadline: ms(17800)}
	held := tlEntry{AtMS: ms(24874), Kind: "held", Rule: "mass-expiry", Stage: 2, Deadline: ms(17800), Until: ms(32866)}
	stale := tlEntry{AtMS: ms(29072), Kind: "stale", Rule: "renewed"}
	granted := tlEntry{AtMS: ms(29072), Kind: "granted", Rule: "stages-cancelled", Stage: 2, Deadline: ms(17800)}
	sent := tlEntry{AtMS: ms(25000), Kind: "sent", Rule: "delivered", Stage: 2, Deadline: ms(17800)}
	early := func(e tlEntry) tlEntry { e.AtMS = ms(26000); return e }
	for _, c := range []struct {
		name string
		es   []tlEntry
		late bool
	}{
		{"held, cancelled when the user came back", []tlEntry{lapse, held, stale, granted}, true},
		{"held, its hold cancelled by the renewal's script", []tlEntry{lapse, held, stale}, true},
		{"lapsed, the stages cancelled by a grant", []tlEntry{lapse, granted}, true},
		{"nothing of the stage", []tlEntry{stale, granted}, false},
		{"no timeline", nil, false},
		{"held and never cancelled", []tlEntry{lapse, held}, false},
		{"cancelled before the user came back", []tlEntry{lapse, held, early(stale), early(granted)}, false},
		{"sent, and no device saw it", []tlEntry{lapse, sent, stale, granted}, false},
		{"another stage's", []tlEntry{{AtMS: ms(24872), Kind: "lapse", Stage: 1, Deadline: ms(17800)}, {AtMS: ms(29072), Kind: "skipped", Rule: "came-back", Stage: 1, Deadline: ms(17800)}}, false},
		{"the consumer found the user back", []tlEntry{lapse, {AtMS: ms(29500), Kind: "skipped", Rule: "came-back", Stage: 2, Deadline: ms(17800)}}, true},
		{"the consumer found it too old", []tlEntry{lapse, {AtMS: ms(29500), Kind: "skipped", Rule: "too-old", Stage: 2, Deadline: ms(17800)}}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			v, ok := cancelledLate(lost, h, c.es, cfg)
			if ok != c.late {
				t.Fatalf("reclassified %v, want %v: %+v", ok, c.late, v)
			}
			switch {
			case c.late && (v.Class != promise.Late || !strings.Contains(v.Why, "came back")):
				t.Errorf("got %s (%s), want late", v.Class, v.Why)
			case !c.late && v.Class != promise.Lost:
				t.Errorf("got %s, want lost", v.Class)
			}
		})
	}
	t.Run("not lost", func(t *testing.T) {
		ok := lost
		ok.Class = promise.OK
		if v, changed := cancelledLate(ok, h, []tlEntry{lapse, held, stale, granted}, cfg); changed || v.Class != promise.OK {
			t.Errorf("an ok stage became %s", v.Class)
		}
	})
}
