package guide

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeline"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// waitTimeline waits until uid's timeline holds n entries and returns
// them, failing the test after waitLong.
func (e *testEnv) waitTimeline(uid string, n int) []timeline.Entry {
	e.t.Helper()
	var got []timeline.Entry
	waitFor(e.t, fmt.Sprintf("%d entries in %s's timeline", n, uid), func() bool {
		var err error
		got, err = timeline.Read(context.Background(), e.store, uid, 0)
		if err != nil {
			e.t.Fatal(err)
		}
		return len(got) >= n
	})
	if len(got) != n {
		e.t.Fatalf("%s's timeline: %v, want %d entries", uid, timeline.Kinds(got), n)
	}
	return got
}

// checkEntry fails unless e is kind:rule about p's event, recorded by a
// consumer.
func checkEntry(t *testing.T, e timeline.Entry, kind timeline.Kind, rule string, p produced) {
	t.Helper()
	if e.Kind != kind || e.Rule != rule {
		t.Errorf("entry %s:%s, want %s:%s", e.Kind, e.Rule, kind, rule)
	}
	if e.Service != "consumer" || e.Instance == "" {
		t.Errorf("entry recorded by %q/%q, want the consumer and its instance", e.Service, e.Instance)
	}
	if e.Event != p.ev.ID || e.Stage != p.ev.Stage || e.Deadline != p.ev.DeadlineMS {
		t.Errorf("entry of event %q stage %d deadline %d, want %q, %d, %d", e.Event, e.Stage, e.Deadline, p.ev.ID, p.ev.Stage, p.ev.DeadlineMS)
	}
}

// TestTimelineDelivered: a delivered guide is in its user's timeline as
// sent to the connections the gateway reached.
func TestTimelineDelivered(t *testing.T) {
	e := newEnv(t)
	e.start(e.cfg)
	evs := e.produce("tl-sent")
	e.waitShown(evs)
	got := e.waitTimeline("tl-sent", 1)
	checkEntry(t, got[0], timeline.KindSent, RuleDelivered, evs[0])
	if got[0].Conns != 1 {
		t.Errorf("sent to %d connections, want the gateway's 1", got[0].Conns)
	}
}

// TestTimelineCameBack: a user who renewed after the deadline gets no
// guide, and their timeline says why.
func TestTimelineCameBack(t *testing.T) {
	e := newEnv(t)
	if _, err := e.store.Renew(context.Background(), "tl-back", "default", time.Minute, session.ClockPresence); err != nil {
		t.Fatal(err)
	}
	e.start(e.cfg)
	evs := e.produce("tl-back")
	got := e.waitTimeline("tl-back", 1)
	checkEntry(t, got[0], timeline.KindSkipped, RuleCameBack, evs[0])
	if !strings.Contains(got[0].Detail, "live") {
		t.Errorf("detail %q: want the live session named", got[0].Detail)
	}
	if e.gw.Shown(evs[0].ev.ID) {
		t.Error("a guide went to a user who came back")
	}
}

// TestTimelineDeadLettered: a guide the gateway refuses for good is
// dead-lettered, and the timeline keeps the status.
func TestTimelineDeadLettered(t *testing.T) {
	e := newEnv(t)
	e.gw.SetStatus("tl-dead", http.StatusBadRequest)
	e.start(e.cfg)
	evs := e.produce("tl-dead")
	e.deadLetters(1)
	got := e.waitTimeline("tl-dead", 1)
	checkEntry(t, got[0], timeline.KindDead, RuleRejected, evs[0])
	if got[0].Code != http.StatusBadRequest || got[0].Detail == "" {
		t.Errorf("dead letter with code %d, detail %q; want 400 and the reason", got[0].Code, got[0].Detail)
	}
}

// TestTimelineOff: with recording off the consumer records nothing, and
// still delivers.
func TestTimelineOff(t *testing.T) {
	e := newEnv(t)
	cfg := e.cfg
	cfg.Timeline.Off = true
	r := e.start(cfg)
	evs := e.produce("tl-off")
	e.waitShown(evs)
	e.waitCommittedToEnd(cfg.Group)
	r.stop() // the recorder, were there one, would have sent its entries
	got, err := timeline.Read(context.Background(), e.store, "tl-off", 0)
	if err != nil || len(got) != 0 {
		t.Fatalf("timeline with recording off: %v, %v; want none", timeline.Kinds(got), err)
	}
}

// TestSettlementEntries: what each settlement adds to the timeline.
func TestSettlementEntries(t *testing.T) {
	ev := timeoutevent.Event{ID: "e1", UID: "u", Stage: 2, DeadlineMS: 1_000_000, DueMS: 1_010_000}
	final := ev
	final.Action, final.Final = timeoutevent.ActionClose, true
	now := time.UnixMilli(1_020_000)
	tests := []struct {
		name string
		s    settlement
		want string // kind:rule ...
		code int
	}{
		{"delivered", settlement{ev: ev, sender: SenderGateway, outcome: OutcomeDelivered, sent: Sent{Outcome: OutcomeDelivered, Conns: 2}}, "sent:delivered", 0},
		{"queued", settlement{ev: ev, sender: SenderGateway, outcome: OutcomeQueued}, "sent:inbox", 0},
		{"webhook", settlement{ev: ev, sender: SenderWebhook, outcome: OutcomeDelivered, sent: Sent{Outcome: OutcomeDelivered, Code: 202}}, "sent:webhook", 202},
		{"close stage delivered: the gateway records the close", settlement{ev: final, sender: SenderGateway, outcome: OutcomeDelivered}, "sent:delivered", 0},
		{"close stage kept", settlement{ev: final, sender: SenderGateway, outcome: OutcomeQueued}, "sent:inbox closed:inbox", 0},
		{"close stage by webhook", settlement{ev: final, sender: SenderWebhook, outcome: OutcomeDelivered, sent: Sent{Code: 200}}, "sent:webhook closed:webhook", 200},
		{"came back, live", settlement{ev: ev, outcome: OutcomeStale, needless: true, check: sessionCheck{live: true, now: now}}, "skipped:came-back", 0},
		{"came back, by the gateway", settlement{ev: ev, sender: SenderGateway, outcome: OutcomeStale}, "skipped:came-back", 0},
		{"too old", settlement{ev: ev, outcome: OutcomeTooOld, needless: true, check: sessionCheck{now: now}, maxAge: time.Second}, "skipped:too-old", 0},
		{"too old at the gateway", settlement{ev: ev, sender: SenderGateway, outcome: OutcomeTooOld}, "skipped:too-old", 0},
		{"renewed or ended, over now", settlement{ev: ev, outcome: OutcomeStale, needless: true, check: sessionCheck{renewed: now, now: now}}, "skipped:renewed-or-ended", 0},
		{"duplicate: an earlier send delivered it", settlement{ev: ev, sender: SenderGateway, outcome: OutcomeDuplicate}, "sent:duplicate", 0},
		{"rejected", settlement{ev: ev, outcome: OutcomeRejected, reason: "410 Gone", code: 410}, "dead-lettered:rejected", 410},
		{"invalid", settlement{outcome: OutcomeInvalid, reason: strings.Repeat("x", 1000)}, "dead-lettered:invalid", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.s.entries()
			if k := timeline.Kinds(got); k != tt.want {
				t.Fatalf("entries %s, want %s", k, tt.want)
			}
			e := got[0]
			if e.Code != tt.code || len(e.Detail) > maxDetail+len("…") {
				t.Errorf("code %d, detail of %d bytes; want %d, at most %d", e.Code, len(e.Detail), tt.code, maxDetail)
			}
			if tt.s.outcome != OutcomeInvalid && (e.Event != "e1" || e.Stage != ev.Stage) {
				t.Errorf("entry of event %q stage %d, want e1, %d", e.Event, e.Stage, ev.Stage)
			}
			if tt.s.sent.Conns > 0 && e.Conns != tt.s.sent.Conns {
				t.Errorf("conns %d, want %d", e.Conns, tt.s.sent.Conns)
			}
		})
	}
}
