package main

import (
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/stillthere/stillthere/pkg/chatsim"
	"github.com/stillthere/stillthere/pkg/frame"
	"github.com/stillthere/stillthere/pkg/promise"
)

// recorder is the run's history as it happens: every signal with its
// outcome, every guide a device saw, every fault window. Users and faults
// record from their own goroutines.
type recorder struct {
	mu sync.Mutex
	h  promise.History
	// harness counts answers that say the bench itself is wrong (a 4xx
	// from the activity endpoint): the report names them.
	harness []string
}

// signal records s and returns its place, for an answer that comes late.
func (r *recorder) signal(s promise.Signal) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.h.Signals = append(r.h.Signals, s)
	return len(r.h.Signals) - 1
}

// answered replaces the signal at i once its answer came late.
func (r *recorder) answered(i int, s promise.Signal) {
	r.mu.Lock()
	r.h.Signals[i] = s
	r.mu.Unlock()
}

func (r *recorder) delivery(d promise.Delivery) {
	r.mu.Lock()
	r.h.Deliveries = append(r.h.Deliveries, d)
	r.mu.Unlock()
}

func (r *recorder) fault(f promise.Fault) {
	r.mu.Lock()
	r.h.Faults = append(r.h.Faults, f)
	r.mu.Unlock()
}

func (r *recorder) wrong(what string) {
	r.mu.Lock()
	if len(r.harness) < 20 {
		r.harness = append(r.harness, what)
	}
	r.mu.Unlock()
}

// history is a copy of what was recorded, ending at end.
func (r *recorder) history(end time.Time) promise.History {
	r.mu.Lock()
	defer r.mu.Unlock()
	h := promise.History{End: end}
	h.Signals = append(h.Signals, r.h.Signals...)
	h.Deliveries = append(h.Deliveries, r.h.Deliveries...)
	h.Faults = append(h.Faults, r.h.Faults...)
	return h
}

// The signals of the history, from what their senders saw. Each is a
// pure function of the facts, so that a table test reads them.

// pingSignal is a WebSocket ping sent at sent: answered with a pong (its
// deadline, by Redis's clock, or sent plus ttl when the pong named none),
// refused with "session store unavailable", or not answered (err). A
// pong may come after the sender stopped waiting (a renewal the gateway
// wrote once Redis was back, its deadline counted from then): it is
// answered all the same, late.
func pingSignal(uid string, sent time.Time, a chatsim.Answer, err error, ttl time.Duration) promise.Signal {
	s := promise.Signal{UID: uid, Kind: promise.Ping, Sent: sent, Deadline: sent.Add(ttl)}
	switch {
	case err != nil:
		s.Outcome = promise.NoAnswer
	case a.Unavailable:
		s.Outcome = promise.Refused
	default:
		s.Outcome, s.Answered = promise.Answered, a.At
		if !a.Deadline.IsZero() {
			s.Deadline = a.Deadline
		}
	}
	return s
}

// unreachedSignal is a ping the user could not send: none of their
// devices had a connection (the gateways were out of reach). Nothing was
// renewed, and the user was there.
func unreachedSignal(uid string, at time.Time, ttl time.Duration) promise.Signal {
	return promise.Signal{UID: uid, Kind: promise.Ping, Sent: at, Outcome: promise.Refused, Deadline: at.Add(ttl)}
}

// activity is one event an activity user's platform posts.
type activity struct {
	kind promise.Kind // Ping (an "active" event), TurnToUser or TurnToUs
	// hold is a turn to us's max_ms.
	hold time.Duration
}

// activitySignal is one event posted at sent (its at_ms, to the
// millisecond) and what the endpoint answered: status (0 when no answer
// came, err), after its resends: the final answer. A 200 applied it
// (answered is when); a 503 applied nothing (Redis out of reach), nor did
// a try before it; anything else is no answer the bench can read, and
// so is a 503 after a try that went unanswered (err), which may still
// apply it, late, by its at_ms.
func activitySignal(uid string, ev activity, sent time.Time, status int, err error, answered time.Time, ttl time.Duration) promise.Signal {
	at := sent.Truncate(time.Millisecond)
	s := promise.Signal{UID: uid, Kind: ev.kind, Sent: sent, Deadline: at.Add(ttl)}
	if ev.kind == promise.TurnToUs {
		// After max_ms the clock runs as if the turn had passed to the
		// user then.
		s.Deadline = at.Add(ev.hold + ttl)
	}
	switch {
	case err != nil || status == 0:
		s.Outcome = promise.NoAnswer
	case status == http.StatusOK:
		s.Outcome, s.Answered = promise.Answered, answered
	case status == http.StatusServiceUnavailable:
		s.Outcome = promise.Refused
	default:
		s.Outcome = promise.NoAnswer
	}
	return s
}

// guideDelivery is a guide frame a device (sink) read. A device shows a
// guide once per id, as the protocol asks of clients (delivery to a
// connection is at least once): it is an idempotent sink.
func guideDelivery(uid, sink string, f chatsim.Frame) (promise.Delivery, error) {
	if f.Type != frame.TypeGuide {
		return promise.Delivery{}, errors.New("not a guide")
	}
	if f.ID == "" || f.DeadlineMS <= 0 {
		return promise.Delivery{}, errors.New("a guide without an id or a deadline")
	}
	return promise.Delivery{UID: uid, ID: f.ID, Stage: max(f.Stage, 1), Deadline: time.UnixMilli(f.DeadlineMS),
		At: f.At, Sink: sink, Idempotent: true}, nil
}
