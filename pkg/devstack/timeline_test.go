package devstack

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/frame"
	"github.com/stillthere/stillthere/pkg/guide"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeline"
)

// timelineOf runs "gateway timeline -json uid" against the rig's Redis
// and returns the entries it printed; also its table, which must name
// each recorded entry's kind.
func (p *pipelineRig) timelineOf(t *testing.T, uid string) []timeline.Entry {
	t.Helper()
	ctx := context.Background()
	var js, table bytes.Buffer
	if err := timeline.Command(ctx, []string{"-json", uid}, p.env(nil), &js); err != nil {
		t.Fatalf("gateway timeline -json %s: %v", uid, err)
	}
	var a timeline.Answer
	if err := json.Unmarshal(js.Bytes(), &a); err != nil || a.UID != uid {
		t.Fatalf("gateway timeline -json %s printed %q: %v", uid, js.String(), err)
	}
	if err := timeline.Command(ctx, []string{"-utc", uid}, p.env(nil), &table); err != nil {
		t.Fatalf("gateway timeline %s: %v", uid, err)
	}
	for _, e := range a.Entries {
		// A Current entry is read from the user's state, which may have
		// moved on between the two reads (the deadline it names found
		// due, on a busy host): only recorded ones are in both.
		if !e.Current && !strings.Contains(table.String(), string(e.Kind)) {
			t.Errorf("the table of %s does not name %s:\n%s", uid, e.Kind, table.String())
		}
	}
	return a.Entries
}

// steps is the entries' kind:rule, with the stage where there is one.
func steps(es []timeline.Entry) []string {
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = string(e.Kind) + ":" + e.Rule
		if e.Stage > 0 {
			out[i] += "@" + strconv.Itoa(e.Stage)
		}
	}
	return out
}

// inOrder reports whether want appears in got in this order, other steps
// between them allowed.
func inOrder(got, want []string) bool {
	i := 0
	for _, g := range got {
		if i < len(want) && g == want[i] {
			i++
		}
	}
	return i == len(want)
}

// waitSteps waits until uid's timeline, as the command prints it, holds
// want in order.
func (p *pipelineRig) waitSteps(t *testing.T, uid string, want ...string) []timeline.Entry {
	t.Helper()
	var es []timeline.Entry
	ok := waitFor(20*time.Second, func() bool {
		es = p.timelineOf(t, uid)
		return inOrder(steps(es), want)
	})
	if !ok {
		t.Fatalf("%s's timeline %q, want %q in this order", uid, steps(es), want)
	}
	return es
}

// TestTimelineEndToEnd: the whole pipeline writes one user's timeline,
// each service its own decisions, and "gateway timeline" prints it in
// order: a user reminded and then closed for inactivity, and a user
// whose lapse a blind interval held and who came back before its
// release, and so was never guided.
func TestTimelineEndToEnd(t *testing.T) {
	p := newPipelineRig(t, pipelineOptions{Gateways: 1, Sender: guide.SenderGateway, Policy: stagePolicy()})
	run, wait := concurrently(t)
	run("reminded, then closed", func(t *testing.T) {
		c := p.dialUser("tl-ed", 0)
		pingConn(t, c)
		s := watchConn(c, time.Now().Add(faultTTL+faultJitter+stageClose+6*time.Second))
		if len(s.guides) != 2 || s.close != frame.CloseInactive {
			t.Fatalf("tl-ed saw %+v, close %d; want the reminder and the close stage, then 4000", s.guides, s.close)
		}
		// Each service's own entries in the order it made them; across
		// services the order is Redis's stamps', within a batch's trip.
		es := p.waitSteps(t, "tl-ed", "lapse:@1", "produced:@1", "lapse:@2", "produced:@2")
		p.waitSteps(t, "tl-ed", "start:started", "closed:inactive@2", "end:session-ended")
		p.waitSteps(t, "tl-ed", "sent:delivered@1", "sent:delivered@2")
		if got := steps(es); !inOrder(got, []string{"start:started", "lapse:@1", "sent:delivered@1", "lapse:@2"}) {
			t.Errorf("tl-ed's timeline %q: want the start, the first stage's lapse and delivery, then the second stage's lapse", got)
		}
		for _, e := range es {
			if e.Kind == timeline.KindProduced && e.Stage == 2 && !strings.Contains(e.Detail, "close stage, the last") {
				t.Errorf("stage 2 produced %+v, want it said to be the last, a close", e)
			}
		}
	})
	run("held, came back, never guided", func(t *testing.T) {
		ctx := context.Background()
		now, err := p.redisNow()
		if err != nil {
			t.Fatal(err)
		}
		store := session.NewStore(p.client(), p.keyspace())
		// A failover just now, for 3s: a deadline within the grace after
		// it is held to the grace's end, 4s after the user's deadline, room
		// for a busy machine to see the hold and ping before it.
		blind := 3 * time.Second
		if err := store.RecordBlind(ctx, session.BlindInterval{Start: now, End: now.Add(blind), Reason: session.BlindFailover}); err != nil {
			t.Fatal(err)
		}
		c := p.dialUser("tl-flo", 0)
		pingConn(t, c)
		p.waitSteps(t, "tl-flo", "start:started", "lapse:@1", "held:blind@1")
		pingConn(t, c) // back, before the hold's release
		es := p.waitSteps(t, "tl-flo", "start:started", "lapse:@1", "held:blind@1", "rechecked:", "stale:renewed")
		for _, e := range es {
			if e.Kind == timeline.KindProduced || e.Kind == timeline.KindSent {
				t.Errorf("tl-flo came back while held, yet the timeline has %s: %q", e.Kind, steps(es))
			}
			if e.Kind == timeline.KindHeld && e.Detail != "Redis failed over" {
				t.Errorf("held %+v, want the failover named", e)
			}
		}
		if err := c.Leave(answerWait); err != nil {
			t.Fatal(err)
		}
		// Past the hold's release, nothing produced for that silence.
		held := es[slices.IndexFunc(es, func(e timeline.Entry) bool { return e.Kind == timeline.KindHeld })]
		p.waitRedisPast(now.Add(blind + faultGrace + time.Second))
		for _, ev := range p.events()["tl-flo"] {
			if ev.DeadlineMS == held.Deadline {
				t.Errorf("tl-flo was guided for the silence it came back from while held: %+v", ev)
			}
		}
	})
	wait()
}
