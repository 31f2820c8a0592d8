package timeline

import (
	"fmt"
	"time"

	"github.com/stillthere/stillthere/pkg/config"
	"github.com/stillthere/stillthere/pkg/session"
)

// Settings are every service's timeline settings.
type Settings struct {
	// Off turns recording off: the service appends nothing (reading still
	// works).
	Off bool
	// Bounds of every timeline: at most Entries, none older than Keep.
	Bounds session.TimelineBounds
}

// Bind binds the settings to b: timeline-off, timeline-entries,
// timeline-keep.
func (s *Settings) Bind(b *config.Binder) {
	b.Bool(&s.Off, "timeline-off", false, "record no decisions in users' timelines")
	b.Int(&s.Bounds.Entries, "timeline-entries", DefaultEntries, "most entries a user's timeline keeps (the oldest go)")
	b.Duration(&s.Bounds.Keep, "timeline-keep", DefaultKeep, "how long a user's timeline keeps an entry")
}

// Validate checks the bounds.
func (s Settings) Validate() error {
	switch {
	case s.Bounds.Entries < 1 || s.Bounds.Entries > 10000:
		return fmt.Errorf("timeline-entries: %d, want 1 to 10000", s.Bounds.Entries)
	case s.Bounds.Keep < time.Minute || s.Bounds.Keep > 30*24*time.Hour:
		return fmt.Errorf("timeline-keep: %v, want 1m to 720h", s.Bounds.Keep)
	}
	return nil
}

// Recorder returns the Recorder of a service with these settings, or nil
// (which records nothing) when recording is off.
func (s Settings) Recorder(store *session.Store, cfg Config) *Recorder {
	if s.Off {
		return nil
	}
	cfg.Bounds = s.Bounds
	return NewRecorder(store, cfg)
}

// HoldNotes say that a service's renewals and ends record, in their own
// scripts, a hold they cancel on a user's timeout, within these bounds
// (see session.HoldNotes): the hold's recheck (KindRechecked), then the
// lapse stale by RuleRenewed or RuleEnded, each InScript. None when
// recording is off.
func (s Settings) HoldNotes(service, instance string) session.HoldNotes {
	if s.Off {
		return session.HoldNotes{}
	}
	return session.HoldNotes{Bounds: s.Bounds.OrDefault(), Service: service, Instance: instance}
}
