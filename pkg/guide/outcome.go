package guide

import (
	"strings"

	"github.com/stillthere/stillthere/pkg/push"
)

// Outcome is how a timeout event was settled, the label of
// stillthere_consumer_guides_total. Those a gateway answers are its push
// statuses.
type Outcome string

// Outcomes, in the order the metric's help names them.
const (
	OutcomeDelivered = Outcome(push.Delivered) // shown to the user
	OutcomeDuplicate = Outcome(push.Duplicate) // shown before: the downstream deduped it
	OutcomeQueued    = Outcome(push.Queued)    // the user had no connection: kept for their next connect
	OutcomeStale     = Outcome(push.Stale)     // the user came back before the guide went out
	OutcomeTooOld    = Outcome(push.TooOld)    // the deadline is older than guide-max-age: dropped
	OutcomeRejected  = Outcome("rejected")     // the downstream refused this guide for good: dead-lettered
	OutcomeInvalid   = Outcome("invalid")      // not a timeout event this build reads: dead-lettered
)

// outcomes is every Outcome, in the order of the constants.
var outcomes = []Outcome{
	OutcomeDelivered, OutcomeDuplicate, OutcomeQueued, OutcomeStale, OutcomeTooOld, OutcomeRejected, OutcomeInvalid,
}

// sent reports whether the downstream took the guide: shown to the user,
// or kept for their next connect.
func (o Outcome) sent() bool { return o == OutcomeDelivered || o == OutcomeQueued }

// outcomeList names every outcome, for the metric's help.
func outcomeList() string {
	names := make([]string, len(outcomes))
	for i, o := range outcomes {
		names[i] = string(o)
	}
	return strings.Join(names, ", ")
}
