package main

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/chatsim"
	"github.com/stillthere/stillthere/pkg/frame"
	"github.com/stillthere/stillthere/pkg/promise"
)

var t0 = time.UnixMilli(1_800_000_000_000)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

func TestPingSignal(t *testing.T) {
	ttl := 4 * time.Second
	for _, tc := range []struct {
		name string
		a    chatsim.Answer
		err  error
		want promise.Signal
	}{
		{"pong with its deadline", chatsim.Answer{Sent: at(0), At: at(30), TTL: ttl, Deadline: at(4010)}, nil,
			promise.Signal{UID: "u", Kind: promise.Ping, Sent: at(0), Outcome: promise.Answered, Answered: at(30), Deadline: at(4010)}},
		{"pong of an older gateway, no deadline", chatsim.Answer{Sent: at(0), At: at(30), TTL: ttl}, nil,
			promise.Signal{UID: "u", Kind: promise.Ping, Sent: at(0), Outcome: promise.Answered, Answered: at(30), Deadline: at(4000)}},
		{"store unavailable", chatsim.Answer{Sent: at(0), At: at(30), Unavailable: true}, nil,
			promise.Signal{UID: "u", Kind: promise.Ping, Sent: at(0), Outcome: promise.Refused, Deadline: at(4000)}},
		{"no answer in time", chatsim.Answer{}, chatsim.ErrNoAnswer,
			promise.Signal{UID: "u", Kind: promise.Ping, Sent: at(0), Outcome: promise.NoAnswer, Deadline: at(4000)}},
		{"connection gone", chatsim.Answer{}, chatsim.ErrGone,
			promise.Signal{UID: "u", Kind: promise.Ping, Sent: at(0), Outcome: promise.NoAnswer, Deadline: at(4000)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := pingSignal("u", at(0), tc.a, tc.err, ttl); got != tc.want {
				t.Fatalf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
	if got, want := unreachedSignal("u", at(5), ttl), (promise.Signal{UID: "u", Kind: promise.Ping, Sent: at(5), Outcome: promise.Refused, Deadline: at(4005)}); got != want {
		t.Fatalf("unreached: got %+v, want %+v", got, want)
	}
}

func TestActivitySignal(t *testing.T) {
	ttl := 4 * time.Second
	sent := at(0).Add(700 * time.Microsecond) // at_ms is sent to the millisecond
	for _, tc := range []struct {
		name   string
		ev     activity
		status int
		err    error
		want   promise.Signal
	}{
		{"active applied", activity{kind: promise.Ping}, http.StatusOK, nil,
			promise.Signal{UID: "u", Kind: promise.Ping, Sent: sent, Outcome: promise.Answered, Answered: at(20), Deadline: at(4000)}},
		{"turn to the user applied", activity{kind: promise.TurnToUser}, http.StatusOK, nil,
			promise.Signal{UID: "u", Kind: promise.TurnToUser, Sent: sent, Outcome: promise.Answered, Answered: at(20), Deadline: at(4000)}},
		{"turn to us: the clock runs after max_ms", activity{kind: promise.TurnToUs, hold: 3 * time.Second}, http.StatusOK, nil,
			promise.Signal{UID: "u", Kind: promise.TurnToUs, Sent: sent, Outcome: promise.Answered, Answered: at(20), Deadline: at(7000)}},
		{"503: Redis out of reach", activity{kind: promise.Ping}, http.StatusServiceUnavailable, nil,
			promise.Signal{UID: "u", Kind: promise.Ping, Sent: sent, Outcome: promise.Refused, Deadline: at(4000)}},
		{"no answer", activity{kind: promise.TurnToUser}, 0, errors.New("timeout"),
			promise.Signal{UID: "u", Kind: promise.TurnToUser, Sent: sent, Outcome: promise.NoAnswer, Deadline: at(4000)}},
		{"a proxy's 502", activity{kind: promise.Ping}, http.StatusBadGateway, nil,
			promise.Signal{UID: "u", Kind: promise.Ping, Sent: sent, Outcome: promise.NoAnswer, Deadline: at(4000)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := activitySignal("u", tc.ev, sent, tc.status, tc.err, at(20), ttl); got != tc.want {
				t.Fatalf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestGuideDelivery(t *testing.T) {
	f := chatsim.Frame{Type: frame.TypeGuide, ID: "g1", DeadlineMS: at(4000).UnixMilli(), Stage: 2, Final: true, At: at(7100)}
	got, err := guideDelivery("u", "u/dev1", f)
	want := promise.Delivery{UID: "u", ID: "g1", Stage: 2, Deadline: at(4000), At: at(7100), Sink: "u/dev1", Idempotent: true}
	if err != nil || got != want {
		t.Fatalf("got %+v, %v; want %+v", got, err, want)
	}
	f.Stage = 0 // a sender that names no stage: the first
	if got, _ := guideDelivery("u", "u/dev1", f); got.Stage != 1 {
		t.Fatalf("no stage: got stage %d, want 1", got.Stage)
	}
	for _, bad := range []chatsim.Frame{
		{Type: frame.TypePong},
		{Type: frame.TypeGuide, DeadlineMS: 1},
		{Type: frame.TypeGuide, ID: "g"},
	} {
		if _, err := guideDelivery("u", "s", bad); err == nil {
			t.Errorf("%+v: no error", bad)
		}
	}
}

// A recorded run, turned into signals and checked: the checker sees what
// the users did.
func TestRecordedHistoryChecks(t *testing.T) {
	ttl := 4 * time.Second
	rec := &recorder{}
	// A user pings twice, falls silent, gets a reminder and the close.
	rec.signal(pingSignal("u", at(0), chatsim.Answer{Sent: at(0), At: at(10), TTL: ttl, Deadline: at(4000)}, nil, ttl))
	rec.signal(pingSignal("u", at(1000), chatsim.Answer{Sent: at(1000), At: at(1010), TTL: ttl, Deadline: at(5000)}, nil, ttl))
	for stage, ms := range map[int]int{1: 5100, 2: 8150} {
		d, _ := guideDelivery("u", "u/dev0", chatsim.Frame{Type: frame.TypeGuide, ID: "g" + string(rune('0'+stage)), DeadlineMS: at(5000).UnixMilli(), Stage: stage, At: at(ms)})
		rec.delivery(d)
	}
	// An activity user waits for us (no silence counts), is told it is
	// their turn, stays a while, then falls silent at 13 s and gets no
	// guide: lost. The hold gave no silence of its own.
	rec.signal(activitySignal("a", activity{kind: promise.TurnToUs, hold: 20 * time.Second}, at(0), 200, nil, at(5), ttl))
	rec.signal(activitySignal("a", activity{kind: promise.TurnToUser}, at(3000), 200, nil, at(3005), ttl))
	rec.signal(activitySignal("a", activity{kind: promise.Ping}, at(6000), 200, nil, at(6005), ttl))
	rec.signal(activitySignal("a", activity{kind: promise.Ping}, at(9000), 200, nil, at(9005), ttl))
	h := rec.history(at(20000))
	vs := promise.Check(promise.Config{Slack: time.Second, InFlight: 100 * time.Millisecond, Match: 100 * time.Millisecond, Delays: []time.Duration{3 * time.Second}}, h)
	var got []string
	for _, v := range vs {
		got = append(got, v.UID+":"+string(v.Class))
	}
	want := "a:lost u:ok u:ok"
	if strings.Join(got, " ") != want || !vs[0].Deadline.Equal(at(13000)) {
		t.Fatalf("verdicts %v, want %s: %+v", got, want, vs)
	}
}
