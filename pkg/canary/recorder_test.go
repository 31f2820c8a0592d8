package canary

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/stillthere/stillthere/pkg/promise"
)

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }

// testPromise is a checker's config of one stage and a second of slack.
var testPromise = promise.Config{Slack: time.Second, InFlight: 100 * time.Millisecond, Match: time.Second}

// ping records an answered ping of uid sent at sent, granted ttl.
func ping(r *recorder, uid string, sent, ttl time.Duration) {
	r.signal(promise.Signal{UID: uid, Kind: promise.Ping, Sent: at(sent), Outcome: promise.Answered, Deadline: at(sent + ttl)})
}

func guide(r *recorder, uid, id string, stage int, deadline, arrived time.Duration) {
	r.delivery(promise.Delivery{UID: uid, ID: id, Stage: stage, Deadline: at(deadline), At: at(arrived), Sink: sink})
}

func byClass(vs []promise.Verdict) map[promise.Class]int {
	out := map[promise.Class]int{}
	for _, v := range vs {
		out[v.Class]++
	}
	return out
}

// TestJudgeCountsOnce: a stage is counted once, when its bound and the
// settle time are past, and never again; a stage not due yet is not
// counted; an ended cycle is judged for the last time and dropped.
func TestJudgeCountsOnce(t *testing.T) {
	r := newRecorder()
	const settle = 500 * time.Millisecond
	// The leaver: pings at 0 and 1s (TTL 3s), silent from 4s; its guide
	// comes at 4.2s. The stayer pings every second and gets nothing.
	ping(r, "leaver", 0, 3*time.Second)
	ping(r, "leaver", time.Second, 3*time.Second)
	for i := range 10 {
		ping(r, "stayer", time.Duration(i)*time.Second, 3*time.Second)
	}

	// Before the deadline: nothing to count.
	if vs := r.judge(testPromise, at(3*time.Second), settle); len(vs) != 0 {
		t.Fatalf("at 3s: %v, want nothing", vs)
	}
	guide(r, "leaver", "g1", 1, 4*time.Second, 4200*time.Millisecond)
	// Delivered, but its bound (5s) and the settle time are not past: a
	// repeat may still come.
	if vs := r.judge(testPromise, at(5*time.Second), settle); len(vs) != 0 {
		t.Fatalf("at 5s: %v, want nothing before the bound and settle", vs)
	}
	vs := r.judge(testPromise, at(5600*time.Millisecond), settle)
	if got := byClass(vs); len(vs) != 1 || got[promise.OK] != 1 || vs[0].UID != "leaver" {
		t.Fatalf("at 5.6s: %v, want the leaver's stage ok", vs)
	}
	if vs[0].Lateness != 200*time.Millisecond {
		t.Errorf("lateness %v, want 200ms", vs[0].Lateness)
	}
	for _, now := range []time.Duration{6 * time.Second, 9 * time.Second} {
		if vs := r.judge(testPromise, at(now), settle); len(vs) != 0 {
			t.Fatalf("at %v: %v, want nothing counted twice", now, vs)
		}
	}
	r.end("leaver", at(9*time.Second))
	if vs := r.judge(testPromise, at(10*time.Second), settle); len(vs) != 0 {
		t.Fatalf("leaver ended: %v, want nothing counted twice", vs)
	}
	if _, ok := r.users["leaver"]; ok {
		t.Error("the ended leaver's history is still held")
	}
	if _, ok := r.users["stayer"]; !ok {
		t.Error("the stayer's running history was dropped")
	}
}

// TestJudgeLost: a stage never delivered is lost once its bound and the
// settle time passed, counted once, with the history still running.
func TestJudgeLost(t *testing.T) {
	r := newRecorder()
	ping(r, "u", 0, 2*time.Second)
	if vs := r.judge(testPromise, at(3200*time.Millisecond), 500*time.Millisecond); len(vs) != 0 {
		t.Fatalf("within the settle time: %v, want nothing", vs)
	}
	vs := r.judge(testPromise, at(3600*time.Millisecond), 500*time.Millisecond)
	if got := byClass(vs); len(vs) != 1 || got[promise.Lost] != 1 {
		t.Fatalf("past the bound and settle: %v, want one lost", vs)
	}
	if vs := r.judge(testPromise, at(time.Minute), 500*time.Millisecond); len(vs) != 0 {
		t.Fatalf("later: %v, want the lost stage not counted again", vs)
	}
}

// TestJudgeStayerGuided: a guide to a stayer is false, however it comes:
// for a deadline it never let pass (a stray), or before its deadline.
func TestJudgeStayerGuided(t *testing.T) {
	r := newRecorder()
	for i := range 10 {
		ping(r, "stayer", time.Duration(i)*time.Second, 3*time.Second)
	}
	guide(r, "stayer", "g1", 1, 2*time.Second, 5*time.Second) // names a deadline a later ping moved
	vs := r.judge(testPromise, at(8*time.Second), 500*time.Millisecond)
	if got := byClass(vs); len(vs) != 1 || got[promise.False] != 1 {
		t.Fatalf("%v, want one false", vs)
	}
	if vs[0].Class.Failure() != true {
		t.Error("false is no failure")
	}
}

// TestJudgeEndedDropsPending: what is still pending when a cycle ends is
// not counted, and the history goes.
func TestJudgeEndedDropsPending(t *testing.T) {
	r := newRecorder()
	ping(r, "u", 0, 2*time.Second)
	r.end("u", at(2500*time.Millisecond)) // before the bound: pending
	if vs := r.judge(testPromise, at(time.Minute), time.Second); len(vs) != 0 {
		t.Fatalf("%v, want nothing: the stage was pending when the cycle ended", vs)
	}
	if r.size() != 0 {
		t.Fatalf("%d histories held, want none", r.size())
	}
}

// TestCount: each verdict counts once in its class; the lateness of
// stages delivered ok or late is observed.
func TestCount(t *testing.T) {
	initSeries()
	ok0 := testutil.ToFloat64(stagesTotal.WithLabelValues("ok"))
	lost0 := testutil.ToFloat64(stagesTotal.WithLabelValues("lost"))
	observed0 := observed(t)
	count([]promise.Verdict{
		{Class: promise.OK, Delivered: true, Lateness: 300 * time.Millisecond},
		{Class: promise.OK}, // rightly not delivered
		{Class: promise.Lost},
	})
	if got := testutil.ToFloat64(stagesTotal.WithLabelValues("ok")) - ok0; got != 2 {
		t.Errorf("ok moved by %v, want 2", got)
	}
	if got := testutil.ToFloat64(stagesTotal.WithLabelValues("lost")) - lost0; got != 1 {
		t.Errorf("lost moved by %v, want 1", got)
	}
	if got := observed(t) - observed0; got != 1 {
		t.Errorf("lateness observed %v times, want 1", got)
	}
	// Every class exists from the start, so that rates over it are
	// defined.
	if n := testutil.CollectAndCount(stagesTotal); n != len(classes) {
		t.Errorf("%d stage series, want %d", n, len(classes))
	}
}

// observed is how many latenesses the histogram holds.
func observed(t *testing.T) uint64 {
	t.Helper()
	var m dto.Metric
	if err := lateness.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount()
}
