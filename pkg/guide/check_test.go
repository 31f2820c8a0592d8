package guide

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// TestNeedlessReadsRedisClock: an event's age is its deadline's distance
// from Redis's clock, as the session check read it, whatever this host's
// clock says. Each case runs in a synctest bubble whose clock is set off
// from Redis's by localSkew, so that a verdict taken from the local clock
// differs from the right one.
func TestNeedlessReadsRedisClock(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redistest.Client(t, srv)
	ks, err := session.NewKeyspace(redistest.Prefix(t))
	if err != nil {
		t.Fatal(err)
	}
	c := &Consumer{rdb: rdb, keyspace: ks}
	ctx := context.Background()
	if err := rdb.Set(ctx, ks.SessionKey("back"), session.DefaultSegment, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}

	const maxAge = 5 * time.Minute
	tests := []struct {
		name      string
		uid       string
		age       time.Duration // by Redis's clock
		localSkew time.Duration // this host's clock minus Redis's
		want      Outcome
	}{
		{"fresh, local clock an hour ahead", "gone", time.Second, time.Hour, ""},
		{"at max age, local clock an hour ahead", "gone", maxAge, time.Hour, ""},
		{"too old, local clock an hour behind", "gone", maxAge + time.Minute, -time.Hour, OutcomeTooOld},
		{"back, local clock an hour ahead", "back", time.Second, time.Hour, OutcomeStale},
		{"back but too old, local clock an hour behind", "back", maxAge + time.Second, -time.Hour, OutcomeTooOld},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			redisNow, err := rdb.Time(ctx).Result()
			if err != nil {
				t.Fatal(err)
			}
			check, err := c.checkSession(ctx, tt.uid)
			if err != nil {
				t.Fatal(err)
			}
			if d := check.now.Sub(redisNow.Truncate(time.Millisecond)); d < 0 || d > time.Second {
				t.Fatalf("check read Redis's clock as %v, TIME said %v", check.now, redisNow)
			}
			if check.live != (tt.uid == "back") {
				t.Fatalf("check of %s: live %v", tt.uid, check.live)
			}
			deadline := check.now.Add(-tt.age)
			ev := timeoutevent.New(tt.uid, session.DefaultSegment, deadline, deadline, timeoutevent.SourceSweep)

			synctest.Test(t, func(t *testing.T) {
				time.Sleep(time.Until(check.now.Add(tt.localSkew))) // set the bubble's clock
				if localOld := time.Since(ev.Deadline()) > maxAge; localOld == (tt.want == OutcomeTooOld) {
					t.Fatal("the local clock gives the same age verdict: the case tells nothing")
				}
				if got := needless(ev, check, maxAge); got != tt.want {
					t.Errorf("needless = %q, want %q", got, tt.want)
				}
			})
		})
	}
}

// skewRedis is a hook that puts Redis's clock, as the session check
// reads it, off from this host's by the given amount: on single commands
// and in pipelines, where the consumer sends its checks.
type skewRedis struct {
	by time.Duration
	ks session.Keyspace
}

func (s skewRedis) DialHook(next redis.DialHook) redis.DialHook { return next }

func (s skewRedis) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		s.skew(cmd)
		return err
	}
}

func (s skewRedis) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			s.skew(cmd)
		}
		return err
	}
}

// isCheck tells the session check's script (EVAL or EVALSHA) by its
// keys: users' session and renewal keys in pairs, and no other.
func (s skewRedis) isCheck(args []any) bool {
	if len(args) < 5 {
		return false
	}
	n, ok := args[2].(int)
	if !ok || n < 2 || n%2 != 0 || len(args) < 3+n {
		return false
	}
	for i := 3; i < 3+n; i += 2 {
		session, _ := args[i].(string)
		renewed, _ := args[i+1].(string)
		uid, err := s.ks.ParseSessionKey(session)
		if err != nil || renewed != s.ks.RenewedKey(uid) {
			return false
		}
	}
	return true
}

// skew moves Redis's clock in each user's answer of a check by s.by.
func (s skewRedis) skew(c redis.Cmder) {
	cmd, ok := c.(*redis.Cmd)
	if !ok || cmd.Err() != nil || !s.isCheck(cmd.Args()) {
		return
	}
	checks, ok := cmd.Val().([]any)
	if !ok {
		return
	}
	out := make([]any, len(checks))
	for i, c := range checks {
		out[i] = c
		if v, ok := c.([]any); ok && len(v) == 3 {
			if ms, ok := v[1].(int64); ok {
				out[i] = []any{v[0], ms + s.by.Milliseconds(), v[2]}
			}
		}
	}
	cmd.SetVal(out)
}

// TestRedisClockDecidesAge: with Redis's clock an hour behind the
// consumer's, an event fresh by Redis's clock is delivered although the
// consumer's clock makes it an hour old, and one too old by Redis's clock
// is dropped.
func TestRedisClockDecidesAge(t *testing.T) {
	e := newEnv(t)
	const skew = -time.Hour
	now, err := e.rdb.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	redisNow := now.Add(skew).Truncate(time.Millisecond)
	old0, delivered0 := guidesSettled(t, OutcomeTooOld), guidesSettled(t, OutcomeDelivered)

	event := func(uid string, deadline time.Time) timeoutevent.Event {
		ev := timeoutevent.New(uid, session.DefaultSegment, deadline, deadline, timeoutevent.SourceSweep)
		b, err := ev.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		e.produceRaw(0, uid, b)
		return ev
	}
	tooOld := event("too-old", redisNow.Add(-e.cfg.GuideMaxAge-time.Minute))
	fresh := event("fresh", redisNow.Add(-time.Second))
	e.start(e.cfg, func(c *Consumer) { c.rdb.AddHook(skewRedis{by: skew, ks: c.keyspace}) })

	e.waitCommittedToEnd(e.cfg.Group)
	if !e.gw.Shown(fresh.ID) {
		t.Error("event fresh by Redis's clock was not delivered")
	}
	if n := e.gw.Attempts(tooOld.ID); n != 0 {
		t.Errorf("event too old by Redis's clock pushed %d times", n)
	}
	if d := guidesSettled(t, OutcomeDelivered) - delivered0; d != 1 {
		t.Errorf("delivered outcomes: %v, want 1", d)
	}
	if d := guidesSettled(t, OutcomeTooOld) - old0; d != 1 {
		t.Errorf("too_old outcomes: %v, want 1", d)
	}
}

// TestNeedlessNotify: a notify stage is never too old, however late: the
// platform's servers are told that the user went away, which stays true
// while they stay away; one whose user came back is stale as any.
func TestNeedlessNotify(t *testing.T) {
	now := time.UnixMilli(1_795_255_600_123)
	d := now.Add(-time.Hour)
	notify := timeoutevent.New("u", session.DefaultSegment, d, d, timeoutevent.SourceSweep).AtStage(2, d.Add(time.Minute), timeoutevent.ActionNotify, "", true)
	remind := notify.AtStage(2, d.Add(time.Minute), timeoutevent.ActionRemind, "Still there?", true)
	away := sessionCheck{now: now}
	back := sessionCheck{now: now, live: true}
	for _, tt := range []struct {
		name string
		ev   timeoutevent.Event
		s    sessionCheck
		want Outcome
	}{
		{"notify an hour late", notify, away, ""},
		{"reminder an hour late", remind, away, OutcomeTooOld},
		{"notify of a user who came back", notify, back, OutcomeStale},
	} {
		if got := needless(tt.ev, tt.s, 5*time.Minute); got != tt.want {
			t.Errorf("%s: %q, want %q", tt.name, got, tt.want)
		}
	}
}
