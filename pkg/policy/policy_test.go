package policy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
	"github.com/stillthere/stillthere/pkg/session"
)

func TestValidate(t *testing.T) {
	ok := Policy{DefaultTTL: time.Minute, Jitter: 5 * time.Second, Segments: map[string]time.Duration{"new": 30 * time.Second, "vip": 3 * time.Minute}}
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid policy: %v", err)
	}
	tests := []struct {
		name string
		p    Policy
		want string
	}{
		{"default too short", Policy{DefaultTTL: 500 * time.Millisecond}, "default TTL"},
		{"default too long", Policy{DefaultTTL: 48 * time.Hour}, "default TTL"},
		{"negative jitter", Policy{DefaultTTL: time.Minute, Jitter: -1}, "jitter"},
		{"jitter over half the shortest", Policy{DefaultTTL: time.Minute, Jitter: 20 * time.Second, Segments: map[string]time.Duration{"new": 30 * time.Second}}, "jitter"},
		{"bad segment name", Policy{DefaultTTL: time.Minute, Segments: map[string]time.Duration{"v i p": time.Minute}}, `segment "v i p"`},
		{"segment TTL too short", Policy{DefaultTTL: time.Minute, Segments: map[string]time.Duration{"x": 0}}, "segment x TTL"},
		{"sub-millisecond", Policy{DefaultTTL: time.Minute + time.Microsecond}, "whole milliseconds"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.p.Validate(); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Validate = %v, want an error about %q", err, tt.want)
			}
		})
	}
	if got := ok.TTL("vip"); got != 3*time.Minute {
		t.Errorf("TTL(vip) = %v", got)
	}
	if got := ok.TTL("unknown"); got != time.Minute {
		t.Errorf("TTL(unknown) = %v, want the default", got)
	}
}

func TestCheckGranularity(t *testing.T) {
	tests := []struct {
		name        string
		p           Policy
		granularity time.Duration
		want        []string // substrings of the error; nil means none
	}{
		{"every ping renews", Policy{DefaultTTL: time.Second}, 0, nil},
		{"twice the granularity", Policy{DefaultTTL: 2 * time.Second, Segments: map[string]time.Duration{"vip": 2 * time.Second}}, time.Second, nil},
		{"a smaller granularity", Policy{DefaultTTL: time.Minute, Segments: map[string]time.Duration{"new": time.Second}}, 500 * time.Millisecond, nil},
		{"default under twice", Policy{DefaultTTL: 1999 * time.Millisecond}, time.Second,
			[]string{"default TTL 1.999s", "renewal granularity 1s", "at least 2s"}},
		{"segment under twice", Policy{DefaultTTL: time.Minute, Segments: map[string]time.Duration{"vip": 1500 * time.Millisecond}}, time.Second,
			[]string{"segment vip TTL 1.5s", "renewal granularity 1s", "at least 2s"}},
		{"segment below the granularity", Policy{DefaultTTL: time.Minute, Segments: map[string]time.Duration{"vip": 3 * time.Second}}, 5 * time.Second,
			[]string{"segment vip TTL 3s", "renewal granularity 5s", "at least 10s"}},
		{"first of two in name order", Policy{DefaultTTL: time.Minute, Segments: map[string]time.Duration{"b": time.Second, "a": time.Second}}, time.Second,
			[]string{"segment a TTL"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.p.CheckGranularity(tt.granularity)
			if tt.want == nil {
				if err != nil {
					t.Fatalf("CheckGranularity(%v) = %v, want nil", tt.granularity, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("CheckGranularity(%v) = nil, want an error naming %q", tt.granularity, tt.want)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("CheckGranularity(%v) = %v, want it to name %q", tt.granularity, err, w)
				}
			}
		})
	}
}

func TestJSON(t *testing.T) {
	p := Policy{DefaultTTL: time.Minute, Jitter: 5 * time.Second, Segments: map[string]time.Duration{"vip": 3 * time.Minute}}
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != `{"default_ttl":"1m0s","jitter":"5s","segments":{"vip":"3m0s"}}` {
		t.Fatalf("Marshal = %s", b)
	}
	var back Policy
	if err := json.Unmarshal(b, &back); err != nil || back.String() != p.String() {
		t.Fatalf("round trip = %v, %v", back, err)
	}
	for _, bad := range []string{
		`{"default_ttl":"60","jitter":"5s"}`,
		`{"default_ttl":"60s","jitter":"5s","extra":1}`,
		`{"default_ttl":"60s","jitter":"5s","segments":{"vip":"x"}}`,
		`{"default_ttl":"0s","jitter":"0s"}`,
		`[]`,
	} {
		if err := json.Unmarshal([]byte(bad), &back); err == nil {
			t.Errorf("Unmarshal(%s) accepted", bad)
		}
	}
}

func FuzzUnmarshal(f *testing.F) {
	f.Add([]byte(`{"default_ttl":"60s","jitter":"5s","segments":{"vip":"180s"}}`))
	f.Add([]byte(`{"default_ttl":"1s","jitter":"0s"}`))
	f.Add([]byte(`{"default_ttl":"60s","jitter":"5s","stages":{"default":[{"action":"remind"},{"after":"3m0s","action":"close","text":"Closed."}],"vip":[{"text":"a"},{"after":"1s","text":"b"}]}}`))
	f.Add([]byte(`{"default_ttl":"60s","jitter":"5s","stages":{"x":[{"after":"0s","action":"close","text":"\u00e9"}]}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var p Policy
		if err := json.Unmarshal(b, &p); err != nil {
			return
		}
		if err := p.Validate(); err != nil {
			t.Fatalf("decoded an invalid policy: %v", err)
		}
		out, _ := json.Marshal(p)
		var again Policy
		if err := json.Unmarshal(out, &again); err != nil || again.String() != p.String() || !again.Equal(p) {
			t.Fatalf("re-decode of %s: %v %v", out, again, err)
		}
	})
}

func newStore(t *testing.T) (*Store, map[string]string) {
	srv := redistest.Start(t)
	prefix := redistest.Prefix(t)
	ks, _ := session.NewKeyspace(prefix)
	env := map[string]string{"STILLTHERE_REDIS_ADDRS": srv.Addr, "STILLTHERE_KEY_PREFIX": prefix}
	return NewStore(redistest.Client(t, srv), ks), env
}

func TestWatcherPicksUpChanges(t *testing.T) {
	store, _ := newStore(t)
	ctx := context.Background()
	fallback := Policy{DefaultTTL: time.Minute, Jitter: time.Second}
	w := NewWatcher(store, fallback, 20*time.Millisecond, time.Second, slog.New(slog.NewTextHandler(io.Discard, nil)))
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { w.Run(wctx); close(done) }()
	defer func() { cancel(); <-done }()

	if got := w.Current(); got.String() != fallback.String() {
		t.Fatalf("no policy stored: Current = %v, want the fallback", got)
	}
	next := Policy{DefaultTTL: 2 * time.Minute, Segments: map[string]time.Duration{"new": 30 * time.Second}}
	if err := store.Save(ctx, next); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return w.Current().TTL("new") == 30*time.Second })
	// A corrupt policy in Redis leaves the last good one in force.
	store.rdb.Set(ctx, store.key, "garbage", 0)
	polled(t, store, 2)
	if w.Current().TTL("new") != 30*time.Second {
		t.Fatal("a corrupt stored policy replaced the good one")
	}
}

func TestWatcherKeepsPolicyWhenKeyVanishes(t *testing.T) {
	store, _ := newStore(t)
	ctx := context.Background()
	fallback := Policy{DefaultTTL: time.Minute, Jitter: time.Second}
	var logs lockedBuffer
	w := NewWatcher(store, fallback, 10*time.Millisecond, time.Second, slog.New(slog.NewTextHandler(&logs, nil)))
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { w.Run(wctx); close(done) }()
	defer func() { cancel(); <-done }()

	stored := Policy{DefaultTTL: 2 * time.Minute, Segments: map[string]time.Duration{"vip": 3 * time.Minute}}
	if err := store.Save(ctx, stored); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return w.Current().String() == stored.String() })

	// Redis loses the key, as a restart without its data would.
	for round := 1; round <= 2; round++ {
		if err := store.rdb.Del(ctx, store.key).Err(); err != nil {
			t.Fatal(err)
		}
		polled(t, store, 5)
		if got := w.Current(); got.String() != stored.String() {
			t.Fatalf("round %d: key gone: Current = %v, want the last known %v", round, got, stored)
		}
		if n := strings.Count(logs.String(), "timeout policy missing from Redis; keeping the last known one"); n != round {
			t.Fatalf("round %d: %d warnings, want one per vanishing:\n%s", round, n, logs.String())
		}
		// Stored again: picked up, and a later vanishing warns again.
		stored.DefaultTTL += time.Minute
		if err := store.Save(ctx, stored); err != nil {
			t.Fatal(err)
		}
		waitFor(t, func() bool { return w.Current().String() == stored.String() })
	}

	// A watcher that never loaded a policy uses its fallback.
	store.rdb.Del(ctx, store.key)
	fresh := NewWatcher(store, fallback, time.Second, time.Second, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := fresh.Refresh(ctx); err != nil || fresh.Current().String() != fallback.String() {
		t.Fatalf("nothing ever stored: Current = %v, %v; want the fallback", fresh.Current(), err)
	}
}

// TestWatcherRefusesTTLUnderGranularity: a stored policy with a TTL under
// twice the gateway's renewal granularity, stored by another tool or by
// a gateway with a smaller granularity, is not applied: the policy in
// force stays, with one warning per refused policy.
func TestWatcherRefusesTTLUnderGranularity(t *testing.T) {
	store, _ := newStore(t)
	ctx := context.Background()
	fallback := Policy{DefaultTTL: time.Minute, Jitter: time.Second}
	var logs lockedBuffer
	w := NewWatcher(store, fallback, 10*time.Millisecond, time.Second, slog.New(slog.NewTextHandler(&logs, nil)))
	warnings := func() int { return strings.Count(logs.String(), "timeout policy in Redis not applied") }

	// Before anything was applied, the fallback stays.
	tooShort := Policy{DefaultTTL: time.Minute, Segments: map[string]time.Duration{"vip": 1500 * time.Millisecond}}
	if err := store.Save(ctx, tooShort); err != nil { // Save knows no granularity
		t.Fatal(err)
	}
	for range 3 {
		if err := w.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := w.Current(); got.String() != fallback.String() {
		t.Fatalf("a policy too short for the granularity stored first: Current = %v, want the fallback %v", got, fallback)
	}
	if n := warnings(); n != 1 {
		t.Fatalf("%d warnings after three refreshes, want 1:\n%s", n, logs.String())
	}
	for _, want := range []string{"vip=1.5s", "segment vip TTL 1.5s", "renewal granularity 1s"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the warning does not name %q:\n%s", want, logs.String())
		}
	}

	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { w.Run(wctx); close(done) }()
	defer func() { cancel(); <-done }()

	good := Policy{DefaultTTL: 2 * time.Minute, Segments: map[string]time.Duration{"vip": 3 * time.Minute}}
	for round, bad := range []Policy{
		tooShort,
		{DefaultTTL: time.Minute, Segments: map[string]time.Duration{"vip": 1200 * time.Millisecond}},
		{DefaultTTL: 1500 * time.Millisecond},
	} {
		if err := store.Save(ctx, good); err != nil {
			t.Fatal(err)
		}
		waitFor(t, func() bool { return w.Current().String() == good.String() })
		before := warnings()
		if err := store.Save(ctx, bad); err != nil {
			t.Fatal(err)
		}
		polled(t, store, 5)
		if got := w.Current(); got.String() != good.String() {
			t.Fatalf("round %d: %v stored: Current = %v, want the last good %v", round, bad, got, good)
		}
		if n := warnings() - before; n != 1 {
			t.Fatalf("round %d: %d warnings, want one per refused policy:\n%s", round, n, logs.String())
		}
		good.DefaultTTL += time.Minute
	}
}

// lockedBuffer is a log sink that the test reads while the watcher logs.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// waitFor polls cond until it holds, and fails the test after 5 s
// without it.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
	}
}

// polled waits until the watcher has loaded the stored policy n more
// times, by the GETs Redis counts: each poll starts once the one before
// is through, so n-1 of them saw the store as it is now. A check that
// something did not happen is made after the polls that would have done
// it, however slow the machine.
func polled(t *testing.T, store *Store, n int) {
	t.Helper()
	from := gets(t, store)
	waitFor(t, func() bool { return gets(t, store) >= from+n })
}

// gets is how many GETs the store's Redis has served.
func gets(t *testing.T, store *Store) int {
	t.Helper()
	info, err := store.rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_get:calls="); ok {
			n, err := strconv.Atoi(v[:strings.IndexByte(v, ',')])
			if err != nil {
				t.Fatalf("commandstats line %q: %v", line, err)
			}
			return n
		}
	}
	return 0
}

func TestCommand(t *testing.T) {
	store, env := newStore(t)
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	ctx := context.Background()
	run := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := Command(ctx, args, lookup, &out)
		return out.String(), err
	}

	out, err := run("show")
	if err != nil || !strings.Contains(out, "no policy stored") || !strings.Contains(out, `"default_ttl": "1m0s"`) {
		t.Fatalf("show with none stored: %q, %v", out, err)
	}
	if _, err := run("set", "-segment", "new=30s", "-segment", "vip=180s"); err != nil {
		t.Fatal(err)
	}
	p, err := store.Load(ctx)
	if err != nil || p.TTL("vip") != 180*time.Second || p.TTL("new") != 30*time.Second || p.DefaultTTL != time.Minute || p.Jitter != 5*time.Second {
		t.Fatalf("stored %v, %v", p, err)
	}
	if _, err := run("set", "-default", "90s", "-remove", "new"); err != nil {
		t.Fatal(err)
	}
	if p, _ := store.Load(ctx); p.DefaultTTL != 90*time.Second || p.TTL("new") != 90*time.Second {
		t.Fatalf("after -default and -remove: %v", p)
	}

	bad := []struct {
		args []string
		want string
	}{
		{[]string{"set", "-segment", "vip"}, "want name=ttl"},
		{[]string{"set", "-segment", "vip=soon"}, "not a duration"},
		{[]string{"set", "-segment", "vip=100ms"}, "segment vip TTL"},
		{[]string{"set", "-segment", "v:ip=60s"}, `segment "v:ip"`},
		{[]string{"set", "-jitter", "80s"}, "jitter"},
		{[]string{"set", "-jitter", "0s", "-segment", "vip=1500ms"}, "segment vip TTL 1.5s: below twice the gateway's renewal granularity 1s"},
		{[]string{"set", "-jitter", "0s", "-default", "1999ms"}, "default TTL 1.999s: below twice the gateway's renewal granularity 1s"},
		{[]string{"set", "-jitter", "0s", "-renew-granularity", "5s", "-segment", "vip=8s"}, "segment vip TTL 8s: below twice the gateway's renewal granularity 5s"},
		{[]string{"set", "-renew-granularity", "-1s", "-segment", "vip=8s"}, "renew-granularity: -1s"},
		{[]string{"set", "-remove", "nope"}, "no such segment"},
		{[]string{"delete"}, "usage"},
		{[]string{}, "usage"},
	}
	for _, tt := range bad {
		before, _ := store.Load(ctx)
		if _, err := run(tt.args...); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q: %v, want an error about %q", tt.args, err, tt.want)
		}
		if after, _ := store.Load(ctx); after.String() != before.String() {
			t.Errorf("%q changed the policy to %v", tt.args, after)
		}
	}
	if _, err := store.Load(ctx); errors.Is(err, ErrNone) {
		t.Fatal("policy vanished")
	}

	// The bound is the gateways' setting: with theirs at 500ms, 1s TTLs do.
	env["STILLTHERE_RENEW_GRANULARITY"] = "500ms"
	if _, err := run("set", "-jitter", "0s", "-segment", "fast=1s"); err != nil {
		t.Fatalf("1s TTL with a 500ms granularity: %v", err)
	}
	if p, _ := store.Load(ctx); p.TTL("fast") != time.Second {
		t.Fatalf("after setting fast=1s: %v", p)
	}
	// Shown to a gateway with the default 1s, it says it is not applied.
	delete(env, "STILLTHERE_RENEW_GRANULARITY")
	if out, err := run("show"); err != nil || !strings.Contains(out, "gateways with renew-granularity 1s do not apply this policy") || !strings.Contains(out, "segment fast TTL 1s") {
		t.Fatalf("show of a policy too short for 1s: %q, %v", out, err)
	}
}

// TestRules: the rules the store resolves an activity event's segment
// by give every segment the TTL and clock the policy does: listed by TTL,
// by clock, by both, the default segment listed or not, and one unknown.
func TestRules(t *testing.T) {
	names := []string{"vip", "slow", "both", "default", "unknown", ""}
	for name, p := range map[string]Policy{
		"ttls and clocks": {DefaultTTL: 10 * time.Second, Segments: map[string]time.Duration{"vip": 30 * time.Second, "both": 40 * time.Second},
			Clocks: map[string]session.Clock{"slow": session.ClockTurn, "both": session.ClockPresence}},
		"default listed": {DefaultTTL: 10 * time.Second, Segments: map[string]time.Duration{"default": 20 * time.Second},
			Clocks: map[string]session.Clock{"default": session.ClockTurn, "vip": session.ClockPresence}},
		"nothing listed": {DefaultTTL: 10 * time.Second},
	} {
		t.Run(name, func(t *testing.T) {
			r := p.Rules()
			for _, seg := range names {
				want := session.SegmentRule{TTL: p.TTL(seg), Clock: p.Clock(seg)}
				if seg == "" {
					// The store reads no segment as the default segment.
					want = session.SegmentRule{TTL: p.TTL("default"), Clock: p.Clock("default")}
				}
				if got := r.Of(seg); got != want {
					t.Errorf("segment %q: rule %+v, want %+v", seg, got, want)
				}
			}
		})
	}
}
