// Package promise checks a history against stillthere's promise: one
// guide per silence, on time, never to someone who is still there,
// nothing lost.
//
// A History is what the users did (their pings and activity, each with
// the outcome its sender saw), what they got (every guide, notify and
// close a device or a webhook saw) and when the faults were. Check
// derives every silence from it and classifies each stage of each, as
// Jepsen's checkers classify operations: ok, late, lost, false,
// duplicated, disordered, indeterminate (it depends on a signal whose
// outcome is unknown: counted apart, never a failure) and spam (a guide
// to a user who kept trying to reach us through a fault). Check is pure:
// the fault-schedule suite and the canary record histories and hand them
// to it.
package promise

import "time"

// Outcome is what the sender of a signal learnt of it.
type Outcome uint8

const (
	// Answered: the service took it, and said which deadline it set.
	Answered Outcome = iota + 1
	// Refused: the service answered that it could not take it (Redis
	// unavailable, say): nothing was renewed, yet the user was there.
	Refused
	// NoAnswer: no answer came (the connection was cut, the sender timed
	// out): it may or may not have taken effect.
	NoAnswer
)

func (o Outcome) String() string {
	switch o {
	case Answered:
		return "answered"
	case Refused:
		return "refused"
	case NoAnswer:
		return "no answer"
	}
	return "outcome(?)"
}

// Kind is what a signal says of the conversation.
type Kind uint8

const (
	// Ping is a ping frame from any of the user's devices, or an
	// `active` event from the platform: the user is there. Its deadline
	// extends the session's, never shortens it.
	Ping Kind = iota + 1
	// TurnToUser is a turn to the user: we spoke, the user's clock runs
	// from now. Its deadline replaces the session's.
	TurnToUser
	// TurnToUs is a turn to us: the user waits for us, and no silence
	// counts until the next turn to the user, or until its deadline
	// (max_ms), when it has one.
	TurnToUs
	// End ends the conversation: no silence counts after it until the
	// user's next signal.
	End
)

// Signal is one thing a user, or the platform for them, sent.
type Signal struct {
	UID     string
	Kind    Kind
	Sent    time.Time
	Outcome Outcome
	// Deadline is when the session lapses if nothing follows, as this
	// signal sets it: for an answered ping the deadline it was granted;
	// for one without an answer, the one it would have earned. Zero for
	// a TurnToUs without max_ms (it holds the clock) and for an End.
	Deadline time.Time
	// Answered is when its answer came (answered signals); zero:
	// unknown, taken as Sent. A guide delivered after it (and the
	// in-flight slack) went to a user known to be back.
	Answered time.Time
}

// known is when the service's answer told the sender the signal had
// landed.
func (s *Signal) known() time.Time {
	if s.Answered.IsZero() {
		return s.Sent
	}
	return s.Answered
}

// Delivery is one guide, notify or close that a sink saw.
type Delivery struct {
	UID string
	ID  string
	// Stage is the silence's stage it is for, from 1; Deadline the
	// deadline it names (the silence's first, by the service's clock).
	Stage    int
	Deadline time.Time
	At       time.Time
	// Sent is when the sender first tried it (a webhook that failed
	// takes a later try); zero: At. A guide first tried before its user
	// was known back was no mistake, however late it arrived.
	Sent time.Time
	// Sink is the device or webhook that saw it. Idempotent sinks (a
	// webhook that collapses repeats by their Idempotency-Key) may see
	// an id again without the user seeing it twice.
	Sink       string
	Idempotent bool
}

// Fault is one fault window of the run, by its kind ("redis-pause",
// "cut gateway-redis", ...). Grace is how long past its end the stages it
// met may wait more; zero: Config.Grace.
type Fault struct {
	Kind       string
	Start, End time.Time
	Grace      time.Duration
}

// History is what a run recorded. End is when it stopped recording: a
// stage whose bound is later than that is pending, not judged.
type History struct {
	Signals    []Signal
	Deliveries []Delivery
	Faults     []Fault
	End        time.Time
}

// Config is what the service promised the run.
type Config struct {
	// Slack is how late past its due time a stage may come when nothing
	// is wrong: detection and delivery.
	Slack time.Duration
	// InFlight is how close to a deadline a signal may be sent and still
	// land on either side of it: a silence it races is judged neither
	// way.
	InFlight time.Duration
	// Stale is how long after its user was known back a guide already on
	// its way (its session checked just before the return landed) may
	// still arrive; zero: InFlight.
	Stale time.Duration
	// Grace is how long past a blind interval (a fault) the silences that
	// met it may wait more.
	Grace time.Duration
	// Match is how far apart a delivery's named deadline and a silence's
	// may be and still be the same silence: the service's clock and the
	// recorder's differ.
	Match time.Duration
	// Delays are the later stages' delays: stage k+1 falls due Delays[k-1]
	// after stage k. None: one stage.
	Delays []time.Duration
	// Window is the dedup window of the minute rule (a second silence of
	// a user and stage within one window may wait for its end); 0: none.
	Window time.Duration
}
