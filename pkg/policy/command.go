package policy

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/stillthere/stillthere/pkg/config"
	"github.com/stillthere/stillthere/pkg/redisconn"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/userid"
)

const usage = `usage:
  gateway policy show
  gateway policy set [-default 60s] [-jitter 5s] [-segment name=ttl]... [-remove name]...
                     [-stages 'name=[stage, ...]']... [-clear-stages name]...
                     [-clock name=presence|turn]...

Shows or changes the per-segment timeout policy in Redis: each segment's
session TTL, and the stages of its users' silences. Every gateway and
expiry listener picks a change up within seconds. "set" starts from the
stored policy (or, when none is stored, from STILLTHERE_SESSION_TTL,
STILLTHERE_SESSION_JITTER, STILLTHERE_CLOSE_AFTER and
STILLTHERE_CLOSE_TEXT) and validates the result before writing it,
refusing a TTL under twice the gateways' STILLTHERE_RENEW_GRANULARITY
(-renew-granularity, default 1s, as the gateway's). Bad input leaves the
stored policy as it was. Redis is found through the usual
STILLTHERE_REDIS_* and STILLTHERE_KEY_PREFIX settings, or their flags.

Stages: -stages replaces a segment's whole list with a JSON array of
stages, each {"after": "3m", "action": "remind" or "close", "text": "..."}.
Stage 1 fires at the session's deadline and has no "after"; each later
stage fires its "after" (1s to 24h) after the one before, while the user
stays silent, and needs a text; stage 1's text may be left out for the
guide consumer's text for the segment. "action" defaults to "remind"; a
"close" stage ends the chat, so it is the last, and needs a text. At most
10 stages, texts at most 1024 bytes. For example:

  gateway policy set -stages 'default=[{"text": "Are you still there?"},
    {"after": "3m", "action": "close", "text": "We closed this chat."}]'
  gateway policy set -stages 'vip=[{}, {"after": "5m", "text": "Still with us?"}]'

A segment without stages of its own has the default segment's, and with
none for "default" either, one reminder at the deadline with the
consumer's text. -clear-stages drops a segment's own list; -remove drops
only its TTL.

Clocks: -clock name=presence|turn sets when a segment's silence counts.
On "presence" (the default) it counts from the user's last activity (a
ping, an active event); on "turn" only while it is the user's turn: a
session waits, not counting, until the platform passes the turn to the
user. On both, a turn to us holds the clock until the next turn to the
user. A segment without a clock of its own has the default segment's.`

// Command runs the operator command with args such as ["set", "-segment",
// "vip=180s"], writing its report to out.
func Command(ctx context.Context, args []string, env config.Lookup, out io.Writer) error {
	if len(args) == 0 || (args[0] != "show" && args[0] != "set") {
		fmt.Fprint(out, usage)
		return errors.New("usage: want show or set")
	}
	verb := args[0]
	fs := flag.NewFlagSet("policy "+verb, flag.ContinueOnError)
	fs.SetOutput(out)
	b := config.NewBinder(fs, env)
	var rc redisconn.Config
	rc.Bind(b)
	var ttl, sessionJitter time.Duration
	var closing Closing
	b.Duration(&ttl, "session-ttl", DefaultSessionTTL, "TTL when no policy is stored")
	b.Duration(&sessionJitter, "session-jitter", DefaultSessionJitter, "jitter when no policy is stored")
	closing.Bind(b)
	// The gateways' setting, read the same way: run in a gateway's
	// container, the command holds a policy to that gateway's bound.
	var granularity time.Duration
	b.Duration(&granularity, "renew-granularity", DefaultRenewGranularity, "the gateways' renewal granularity: every TTL must be at least twice it")
	var defaultTTL, jitter time.Duration
	var set, remove, setStages, clearStages, setClocks []string
	if verb == "set" {
		fs.DurationVar(&defaultTTL, "default", 0, "TTL of segments not listed")
		fs.DurationVar(&jitter, "jitter", -1, "extra TTL, uniform in [0, jitter)")
		fs.Func("segment", "name=ttl: the TTL of one segment (repeatable)", func(s string) error {
			set = append(set, s)
			return nil
		})
		fs.Func("remove", "name: drop a segment's TTL override (repeatable)", func(s string) error {
			remove = append(remove, s)
			return nil
		})
		fs.Func("stages", `name=[stage, ...]: the stages of one segment, as a JSON array such as vip=[{"text": "Still there?"}, {"after": "3m", "action": "close", "text": "Closed."}] (repeatable; "gateway policy" alone prints the rules)`, func(s string) error {
			setStages = append(setStages, s)
			return nil
		})
		fs.Func("clear-stages", "name: drop a segment's own stages (repeatable)", func(s string) error {
			clearStages = append(clearStages, s)
			return nil
		})
		fs.Func("clock", "name=presence|turn: when a segment's silence counts (repeatable)", func(s string) error {
			setClocks = append(setClocks, s)
			return nil
		})
	}
	if err := b.Parse(args[1:]); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q\n%s", fs.Args(), usage)
	}
	if granularity < 0 {
		return fmt.Errorf("renew-granularity: %v, want 0 or more", granularity)
	}
	if err := closing.Validate(); err != nil {
		return err
	}
	if err := rc.Validate(); err != nil {
		return err
	}
	rdb, err := redisconn.Open(ctx, rc)
	if err != nil {
		return err
	}
	defer rdb.Close()
	store := NewStore(rdb, rc.Keyspace())

	p, err := store.Load(ctx)
	stored := err == nil
	if errors.Is(err, ErrNone) {
		p, err = Fallback(ttl, sessionJitter, closing), nil
	}
	if err != nil {
		return err
	}
	if verb == "show" {
		return show(out, p, stored, granularity)
	}

	p.Segments = maps.Clone(p.Segments)
	if p.Segments == nil {
		p.Segments = map[string]time.Duration{}
	}
	if defaultTTL != 0 {
		p.DefaultTTL = defaultTTL
	}
	if jitter >= 0 {
		p.Jitter = jitter
	}
	for _, s := range set {
		name, v, ok := strings.Cut(s, "=")
		if !ok {
			return fmt.Errorf("-segment %q: want name=ttl, such as vip=180s", s)
		}
		ttl, err := time.ParseDuration(v)
		if err != nil {
			return fmt.Errorf("-segment %q: %q is not a duration such as 180s", s, v)
		}
		p.Segments[name] = ttl
	}
	for _, name := range remove {
		if _, ok := p.Segments[name]; !ok {
			return fmt.Errorf("-remove %q: no such segment in the policy", name)
		}
		delete(p.Segments, name)
	}
	if len(setStages) > 0 || len(clearStages) > 0 {
		if err := applyStages(&p, setStages, clearStages); err != nil {
			return fmt.Errorf("policy not changed: %w", err)
		}
	}
	if len(setClocks) > 0 {
		if err := applyClocks(&p, setClocks); err != nil {
			return fmt.Errorf("policy not changed: %w", err)
		}
	}
	// Validated first, for the reasons Save gives; then against the
	// gateways' granularity, which Save does not know.
	if err := p.Validate(); err != nil {
		return fmt.Errorf("policy not changed: %w", err)
	}
	if err := p.CheckGranularity(granularity); err != nil {
		return fmt.Errorf("policy not changed: %w", err)
	}
	if err := store.Save(ctx, p); err != nil {
		return fmt.Errorf("policy not changed: %w", err)
	}
	fmt.Fprintln(out, "saved; gateways and expiry listeners pick it up within seconds")
	return show(out, p, true, granularity)
}

func show(out io.Writer, p Policy, stored bool, granularity time.Duration) error {
	if !stored {
		// Gateways that read one before keep it (see Watcher).
		fmt.Fprintln(out, "no policy stored; the configured TTL, jitter and close stage apply, except in services that read a policy before, which keep it:")
	} else if err := p.CheckGranularity(granularity); err != nil {
		fmt.Fprintf(out, "gateways with renew-granularity %v do not apply this policy, and keep the one they had: %v\n", granularity, err)
	}
	b, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "%s\n", b)
	fmt.Fprintln(out, "stages (a ping cancels those not yet sent; the next silence starts at stage 1):")
	for _, name := range slices.Sorted(maps.Keys(p.SegmentStages)) {
		fmt.Fprintf(out, "  %s: %s\n", name, describe(p.Stages(name)))
	}
	if _, ok := p.SegmentStages[userid.DefaultSegment]; ok {
		_, err = fmt.Fprintf(out, "  any other segment: as %s\n", userid.DefaultSegment)
	} else {
		_, err = fmt.Fprintf(out, "  any other segment: %s, with the consumer's text\n", describe(p.Stages(userid.DefaultSegment)))
	}
	if err != nil {
		return err
	}
	fmt.Fprintln(out, "clocks (presence: silence counts from the last activity; turn: only while it is the user's turn; a turn to us holds both):")
	for _, name := range slices.Sorted(maps.Keys(p.Clocks)) {
		fmt.Fprintf(out, "  %s: %s\n", name, p.Clocks[name])
	}
	_, err = fmt.Fprintf(out, "  any other segment: %s\n", p.Clock(userid.DefaultSegment))
	return err
}

// applyClocks sets segments' clocks on p, which the caller validates as
// a whole.
func applyClocks(p *Policy, set []string) error {
	p.Clocks = maps.Clone(p.Clocks)
	if p.Clocks == nil {
		p.Clocks = map[string]session.Clock{}
	}
	for _, s := range set {
		name, v, ok := strings.Cut(s, "=")
		c := session.Clock(v)
		if !ok || c == "" || !c.Valid() {
			return fmt.Errorf("-clock %q: want name=%s or name=%s", shorten(s, 64), session.ClockPresence, session.ClockTurn)
		}
		if !userid.ValidSegment(name) {
			return fmt.Errorf("-clock: segment %q: want 1-64 characters of [A-Za-z0-9._-]", name)
		}
		p.Clocks[name] = c
	}
	return nil
}

// applyStages sets and clears segments' stage lists on p, which the
// caller validates as a whole.
func applyStages(p *Policy, set, clear []string) error {
	p.SegmentStages = maps.Clone(p.SegmentStages)
	if p.SegmentStages == nil {
		p.SegmentStages = map[string][]Stage{}
	}
	for _, s := range set {
		name, list, ok := strings.Cut(s, "=")
		if !ok {
			return fmt.Errorf("-stages %q: want name=[stage, ...], such as default=[{\"text\": \"Still there?\"}]", shorten(s, 64))
		}
		if !userid.ValidSegment(name) {
			return fmt.Errorf("-stages: segment %q: want 1-64 characters of [A-Za-z0-9._-]", name)
		}
		stages, err := ParseStages(name, list)
		if err != nil {
			return fmt.Errorf("-stages: %w", err)
		}
		p.SegmentStages[name] = stages
	}
	for _, name := range clear {
		if _, ok := p.SegmentStages[name]; !ok {
			return fmt.Errorf("-clear-stages %q: the segment has no stages of its own", name)
		}
		delete(p.SegmentStages, name)
	}
	if len(p.SegmentStages) == 0 {
		p.SegmentStages = nil
	}
	return nil
}
