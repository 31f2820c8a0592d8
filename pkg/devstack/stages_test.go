package devstack

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/stillthere/stillthere/pkg/chatsim"
	"github.com/stillthere/stillthere/pkg/frame"
	"github.com/stillthere/stillthere/pkg/guide"
	"github.com/stillthere/stillthere/pkg/policy"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// The stages of these tests: the default segment reminds at the deadline
// and closes stageClose later; vip reminds, and again stageVIP later,
// and never closes.
const (
	stageClose = 3 * time.Second
	stageVIP   = 2 * time.Second
	closeText  = "We closed this chat."
)

// stagePolicy is the tests' timeout policy.
func stagePolicy() *policy.Policy {
	return &policy.Policy{
		DefaultTTL: faultTTL,
		Jitter:     faultJitter,
		SegmentStages: map[string][]policy.Stage{
			"default": {
				{Action: timeoutevent.ActionRemind},
				{After: stageClose, Action: timeoutevent.ActionClose, Text: closeText},
			},
			"vip": {
				{Action: timeoutevent.ActionRemind, Text: "Anything else?"},
				{After: stageVIP, Action: timeoutevent.ActionRemind, Text: "We are here when you need us."},
			},
			// app: remind, tell the platform, then close.
			"app": {
				{Action: timeoutevent.ActionRemind, Text: "Still there?"},
				{After: stageVIP, Action: timeoutevent.ActionNotify},
				{After: stageVIP, Action: timeoutevent.ActionClose, Text: closeText},
			},
		},
	}
}

// seen is what one connection got: its guides, when, and how it ended.
type seen struct {
	guides []chatsim.Frame
	close  int // close code; 0 while open
}

// watchConn reads c's frames until it closes or until, and returns what
// it got.
func watchConn(c *chatsim.Conn, until time.Time) seen {
	var s seen
	for {
		f, err := c.Next(time.Until(until))
		switch {
		case err != nil:
			s.close = c.CloseCode()
			return s
		case f.Type == "guide":
			s.guides = append(s.guides, f)
		}
	}
}

// stagesOf checks a connection's guides against stages (their texts, ""
// for any) and the delays between them.
func stagesOf(t *testing.T, who string, s seen, texts []string, afters []time.Duration) {
	t.Helper()
	if len(s.guides) != len(texts) {
		t.Fatalf("%s: %d guides %+v, want %d stages", who, len(s.guides), s.guides, len(texts))
	}
	for i, g := range s.guides {
		if g.Stage != i+1 || (texts[i] != "" && g.Text != texts[i]) || g.DeadlineMS != s.guides[0].DeadlineMS {
			t.Fatalf("%s guide %d: %+v, want stage %d %q of one silence", who, i, g, i+1, texts[i])
		}
		if i > 0 {
			// Each stage its delay after the one before, give or take a
			// sweep and a push; under a second late at most.
			if gap := s.guides[i].At.Sub(s.guides[i-1].At); gap < afters[i]-300*time.Millisecond || gap > afters[i]+time.Second {
				t.Errorf("%s: stage %d came %v after stage %d, want %v", who, i+1, gap, i, afters[i])
			}
		}
	}
}

// TestStagesEndToEnd: the stages through the whole pipeline, real Redis,
// the in-process Kafka, two gateways, the consumer pushing to them.
func TestStagesEndToEnd(t *testing.T) {
	p := newPipelineRig(t, pipelineOptions{Gateways: 2, Sender: guide.SenderGateway, Policy: stagePolicy()})
	run, wait := concurrently(t)
	horizon := func() time.Time { return time.Now().Add(faultTTL + faultJitter + stageClose + 4*time.Second) }

	// A silent user gets the reminder, then the close stage, then 4000.
	run("silent", func(t *testing.T) {
		c := p.dialUser("silent", 0)
		pingConn(t, c)
		s := watchConn(c, horizon())
		stagesOf(t, "silent", s, []string{"", closeText}, []time.Duration{0, stageClose})
		if !s.guides[1].Final || s.guides[0].Final || s.close != frame.CloseInactive {
			t.Fatalf("final %v/%v, close %d; want only the close stage final, then %d", s.guides[0].Final, s.guides[1].Final, s.close, frame.CloseInactive)
		}
	})
	// Two devices on two gateways: each stage on both, both closed.
	run("two devices", func(t *testing.T) {
		a, b := p.dialUser("duo", 0), p.dialUser("duo", 1)
		pingConn(t, a)
		pingConn(t, b)
		var sa, sb seen
		var both sync.WaitGroup
		both.Add(2)
		go func() { defer both.Done(); sa = watchConn(a, horizon()) }()
		go func() { defer both.Done(); sb = watchConn(b, horizon()) }()
		both.Wait()
		for who, s := range map[string]seen{"duo/a": sa, "duo/b": sb} {
			stagesOf(t, who, s, []string{"", closeText}, []time.Duration{0, stageClose})
			if s.close != frame.CloseInactive {
				t.Fatalf("%s: close %d, want %d", who, s.close, frame.CloseInactive)
			}
		}
	})
	// Another segment follows its own stages: two reminders, no close.
	run("vip", func(t *testing.T) {
		c := p.dialSegment("vera", "vip", 1)
		pingConn(t, c)
		s := watchConn(c, horizon())
		stagesOf(t, "vip", s, []string{"Anything else?", "We are here when you need us."}, []time.Duration{0, stageVIP})
		if s.close != 0 || s.guides[1].Final {
			t.Fatalf("vip: close %d, final %v; want the connection open, no final stage", s.close, s.guides[1].Final)
		}
	})
	// A notify stage between a reminder and a close: the user sees the
	// reminder and the close, nothing of the notify; the platform hears of
	// it once, in order between them, not final (a stage follows).
	run("notify", func(t *testing.T) {
		c := p.dialSegment("nora", "app", 0)
		pingConn(t, c)
		s := watchConn(c, time.Now().Add(faultTTL+faultJitter+2*stageVIP+4*time.Second))
		if len(s.guides) != 2 || s.guides[0].Stage != 1 || s.guides[1].Stage != 3 || !s.guides[1].Final || s.close != frame.CloseInactive {
			t.Fatalf("nora saw %+v, close %d; want stage 1, then the close stage 3, then %d", s.guides, s.close, frame.CloseInactive)
		}
		hooked := p.hook.Guides("nora")
		if len(hooked) != 1 {
			t.Fatalf("the platform got %+v, want the notify stage once", hooked)
		}
		n := hooked[0]
		if n.Stage != 2 || n.Action != timeoutevent.ActionNotify || n.Final || n.Reason != "" || n.Text != "" || n.Deadline.UnixMilli() != s.guides[0].DeadlineMS {
			t.Errorf("notify %+v, want stage 2 of the same silence, not final", n)
		}
		if gap := n.At.Sub(s.guides[0].At); gap < stageVIP-300*time.Millisecond || gap > stageVIP+time.Second {
			t.Errorf("notify %v after the reminder, want %v", gap, stageVIP)
		}
		if !n.At.Before(s.guides[1].At) {
			t.Errorf("notify at %v, after the close at %v", n.At, s.guides[1].At)
		}
	})
	// A user who pings between the stages gets no close; their next
	// silence starts at stage 1. A second silence in the first one's
	// minute would wait for the minute's end (the minute rule), so they
	// stay until it is over.
	run("back", func(t *testing.T) {
		c := p.dialUser("back", 0)
		pingConn(t, c)
		first, err := c.Next(faultTTL + faultJitter + 3*time.Second)
		if err != nil || first.Type != "guide" || first.Stage != 1 {
			t.Fatalf("first guide: %+v, %v", first, err)
		}
		windowEnd := time.UnixMilli((first.DeadlineMS/60_000 + 1) * 60_000)
		for time.Now().Before(windowEnd.Add(500 * time.Millisecond)) {
			pingConn(t, c) // fails on anything but a pong: no stage 2 comes
			pace(faultTTL / 2)
		}
		s := watchConn(c, horizon())
		stagesOf(t, "back", s, []string{"", closeText}, []time.Duration{0, stageClose})
		if s.guides[0].DeadlineMS <= first.DeadlineMS || s.close != frame.CloseInactive {
			t.Fatalf("next silence: %+v, close %d; want a new silence from stage 1, closed", s.guides, s.close)
		}
	})
	wait()
}

// TestStagesAcrossRestartAndKafkaOutage: a listener restart between
// stages, and Kafka refusing every produce between stages, lose and
// double nothing: every user gets each stage once.
func TestStagesAcrossRestartAndKafkaOutage(t *testing.T) {
	p := newPipelineRig(t, pipelineOptions{Gateways: 1, Sender: guide.SenderGateway, Policy: stagePolicy()})
	const n = 6
	conns := make([]*chatsim.Conn, n)
	for i := range conns {
		conns[i] = p.dialUser(fmt.Sprintf("u%d", i), 0)
		pingConn(t, conns[i])
	}
	results := make([]seen, n)
	var wg sync.WaitGroup
	until := time.Now().Add(faultTTL + faultJitter + stageClose + 20*time.Second)
	for i, c := range conns {
		wg.Add(1)
		go func() { defer wg.Done(); results[i] = watchConn(c, until) }()
	}
	// Between the stages (every user's first stage on the topic): the
	// listener restarts, then Kafka refuses every produce for 2s (the
	// listener spools, then replays).
	waitCond(t, faultTTL+faultJitter+20*time.Second, "every user's first stage on the topic", func() bool {
		evs := p.events()
		for i := range n {
			if len(evs[fmt.Sprintf("u%d", i)]) == 0 {
				return false
			}
		}
		return true
	})
	if err := p.restartListener(); err != nil {
		t.Fatal(err)
	}
	outage := p.kafka.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: p.topic, Err: kerr.NotEnoughReplicas, Count: -1})
	time.Sleep(2 * time.Second) // real time: the Kafka outage lasts this long
	outage.Remove()
	wg.Wait()
	for i, s := range results {
		who := fmt.Sprintf("u%d", i)
		if len(s.guides) != 2 || s.guides[0].Stage != 1 || s.guides[1].Stage != 2 || !s.guides[1].Final || s.close != frame.CloseInactive {
			t.Errorf("%s: guides %+v, close %d; want stage 1, then the close stage once, then %d", who, s.guides, s.close, frame.CloseInactive)
		}
	}
}

// concurrently runs t's subtests side by side: run starts one, wait waits
// for all. Unlike t.Parallel, they share the parent's rig while it lives.
func concurrently(t *testing.T) (run func(name string, f func(t *testing.T)), wait func()) {
	var wg sync.WaitGroup
	return func(name string, f func(t *testing.T)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t.Run(name, f)
		}()
	}, wg.Wait
}
