package policy

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"strings"
	"time"

	"github.com/stillthere/stillthere/pkg/config"
	"github.com/stillthere/stillthere/pkg/redisconn"
)

const usage = `usage:
  gateway policy show
  gateway policy set [-default 60s] [-jitter 5s] [-segment name=ttl]... [-remove name]...

Shows or changes the per-segment session timeout policy in Redis. Every
gateway picks a change up within seconds. "set" starts from the stored
policy (or, when none is stored, from STILLTHERE_SESSION_TTL and
STILLTHERE_SESSION_JITTER) and validates the result before writing it,
refusing a TTL under twice the gateways' STILLTHERE_RENEW_GRANULARITY
(-renew-granularity, default 1s, as the gateway's). Redis is found through the usual STILLTHERE_REDIS_* and STILLTHERE_KEY_PREFIX
settings, or their flags.`

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
	var fallback Policy
	b.Duration(&fallback.DefaultTTL, "session-ttl", 60*time.Second, "TTL when no policy is stored")
	b.Duration(&fallback.Jitter, "session-jitter", 5*time.Second, "jitter when no policy is stored")
	// The gateways' setting, read the same way: run in a gateway's
	// container, the command holds a policy to that gateway's bound.
	var granularity time.Duration
	b.Duration(&granularity, "renew-granularity", time.Second, "the gateways' renewal granularity: every TTL must be at least twice it")
	var defaultTTL, jitter time.Duration
	var set, remove []string
	if verb == "set" {
		fs.DurationVar(&defaultTTL, "default", 0, "TTL of segments not listed")
		fs.DurationVar(&jitter, "jitter", -1, "extra TTL, uniform in [0, jitter)")
		fs.Func("segment", "name=ttl: the TTL of one segment (repeatable)", func(s string) error {
			set = append(set, s)
			return nil
		})
		fs.Func("remove", "name: drop a segment's override (repeatable)", func(s string) error {
			remove = append(remove, s)
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
		p, err = fallback, nil
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
	fmt.Fprintln(out, "saved; gateways pick it up within seconds")
	return show(out, p, true, granularity)
}

func show(out io.Writer, p Policy, stored bool, granularity time.Duration) error {
	if !stored {
		// Gateways that read one before keep it (see Watcher).
		fmt.Fprintln(out, "no policy stored; the gateways' configured TTL and jitter apply, except in gateways that read a policy before, which keep it:")
	} else if err := p.CheckGranularity(granularity); err != nil {
		fmt.Fprintf(out, "gateways with renew-granularity %v do not apply this policy, and keep the one they had: %v\n", granularity, err)
	}
	b, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(out, "%s\n", b)
	return err
}
