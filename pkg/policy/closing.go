package policy

import (
	"fmt"
	"time"

	"github.com/stillthere/stillthere/pkg/config"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
	"github.com/stillthere/stillthere/pkg/userid"
)

// Defaults of the close stage while no policy is stored.
const (
	// DefaultCloseAfter closes a chat 3 minutes after its reminder: every
	// chat product we know of ends an unanswered chat in minutes, and a
	// reminder with no end holds the user's connection, and an agent's
	// conversation, open forever.
	DefaultCloseAfter = 3 * time.Minute
	// DefaultCloseText is the close stage's text.
	DefaultCloseText = "We haven't heard from you for a while, so we've closed this chat. Write to us again any time."
)

// Closing is the settings that shape the default segment's stages while
// no policy is stored: a reminder at the deadline with the consumer's
// text, then, unless After is 0, a close stage After later. Gateways and
// expiry listeners read the same two settings, so that both hold the same
// policy until one is stored; a stored policy replaces them, as it
// replaces the gateways' session-ttl.
type Closing struct {
	// After is the delay from the reminder to the close stage; 0 means
	// no close stage. Default DefaultCloseAfter.
	After time.Duration
	// Text is the close stage's text. Default DefaultCloseText.
	Text string
}

// Bind registers close-after and close-text on b.
func (c *Closing) Bind(b *config.Binder) {
	d := DefaultClosing()
	b.Duration(&c.After, "close-after", d.After, "delay from the first guide to the close stage, when no timeout policy is stored; 0: no close stage")
	b.String(&c.Text, "close-text", d.Text, "text of the close stage, when no timeout policy is stored")
}

// Validate names the first bad setting.
func (c Closing) Validate() error {
	switch {
	case c.After != 0 && (c.After < MinStageAfter || c.After > MaxStageAfter):
		return fmt.Errorf("close-after: %v, want 0 (no close stage) or between %v and %v", c.After, MinStageAfter, MaxStageAfter)
	case c.After%time.Millisecond != 0:
		return fmt.Errorf("close-after: %v, want whole milliseconds", c.After)
	case c.After != 0 && c.Text == "":
		return fmt.Errorf("close-text: empty, want the text of the close stage (close-after is %v)", c.After)
	}
	if err := checkText(c.Text); err != nil {
		return fmt.Errorf("close-text: %w", err)
	}
	return nil
}

// Stages are the default segment's stages these settings give.
func (c Closing) Stages() []Stage {
	if c.After == 0 {
		return []Stage{remind}
	}
	return []Stage{remind, {After: c.After, Action: timeoutevent.ActionClose, Text: c.Text}}
}

// Fallback is the policy in force while none is stored: ttl and jitter
// for every segment (the gateway's session-ttl and session-jitter; an
// expiry listener, which grants no TTL, passes 0 for both), and the
// stages closing gives, for every segment.
func Fallback(ttl, jitter time.Duration, closing Closing) Policy {
	p := Policy{DefaultTTL: ttl, Jitter: jitter}
	if closing.After != 0 {
		p.SegmentStages = map[string][]Stage{userid.DefaultSegment: closing.Stages()}
	}
	return p
}
