package gateway

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/policy"
	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
	"github.com/stillthere/stillthere/pkg/session"
)

// TestAttackActRulesEndToEnd: an event of no segment, posted to the
// endpoint and applied by the real store, is granted what the policy
// says of the segment the user's session is in: its TTL (listed or the
// default) with a jitter under the policy's, and its clock (its own, the
// default segment's, or presence). The policy's rules travel to the
// script; were they mistranslated (a segment listed only by its clock
// given the wrong TTL, an unlisted one the wrong clock), a user would
// be guided hours early, or parked for a day.
func TestAttackActRulesEndToEnd(t *testing.T) {
	srv := redistest.Start(t)
	for name, p := range map[string]policy.Policy{
		"clock of its own": {DefaultTTL: time.Hour, Jitter: time.Minute, Segments: map[string]time.Duration{"vip": 3 * time.Hour},
			Clocks: map[string]session.Clock{"slow": session.ClockTurn}},
		"the default's clock for the unlisted": {DefaultTTL: time.Hour, Jitter: time.Minute, Segments: map[string]time.Duration{"vip": 3 * time.Hour, "default": 2 * time.Hour},
			Clocks: map[string]session.Clock{"default": session.ClockTurn, "vip": session.ClockPresence}},
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			ks, err := session.NewKeyspace(redistest.Prefix(t))
			if err != nil {
				t.Fatal(err)
			}
			rdb := redistest.Client(t, srv)
			store := session.NewStore(rdb, ks)
			in := map[string]string{"v": "vip", "s": "slow", "o": "other", "d": "default", "n": ""}
			for uid, seg := range in {
				if seg == "" {
					continue
				}
				if _, err := store.Renew(ctx, uid, seg, time.Minute, session.ClockPresence); err != nil {
					t.Fatal(err)
				}
			}
			var body []string
			for uid := range in {
				body = append(body, fmt.Sprintf(`{"uid":%q,"kind":"active"}`, uid))
			}
			before, err := rdb.Time(ctx).Result()
			if err != nil {
				t.Fatal(err)
			}
			w := postActivity(newActivityHandler(store, p), events(body...), nil)
			if w.Code != http.StatusOK {
				t.Fatalf("%d %s", w.Code, w.Body)
			}
			after, err := rdb.Time(ctx).Result()
			if err != nil {
				t.Fatal(err)
			}
			for uid, seg := range in {
				if seg == "" {
					seg = "default"
				}
				ttl := p.TTL(seg)
				if p.Clock(seg) == session.ClockTurn {
					ttl += session.MaxTurnHold // parked until a first turn
				}
				ms, err := rdb.ZScore(ctx, ks.IndexKey(session.Bucket(uid)), uid).Result()
				if err != nil {
					t.Fatalf("%s: %v", uid, err)
				}
				got := time.UnixMilli(int64(ms))
				lo, hi := before.Add(ttl).Add(-time.Millisecond), after.Add(ttl+p.Jitter)
				if got.Before(lo) || got.After(hi) {
					t.Errorf("%s in %s: deadline %v from now, want %v (TTL %v, clock %s) plus a jitter under %v",
						uid, seg, got.Sub(before), ttl, p.TTL(seg), p.Clock(seg), p.Jitter)
				}
			}
		})
	}
}
