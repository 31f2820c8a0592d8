package gateway

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/policy"
	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
	"github.com/stillthere/stillthere/pkg/session"
)

// TestAttack25GuidedThenDataLossGuidedAgain: a connected user pings once
// and goes silent. Its deadline passes while Redis is in reach, with its
// data, and the listener guides the silence (emulated: the due entry is
// taken and settled, as the listener does once the guide is produced).
// Then Redis restarts empty, between two heartbeats. The next heartbeat
// finds the data lost, and the outage's start is taken to be the last
// heartbeat that got through, sent before the deadline; so the grant is
// handed over as lapsed, Redis knows nothing of the user, and the silence
// is restored due just past now: the listener guides it a second time,
// under a new id (a new deadline), which no dedup can catch.
//
// Promise: one guide per silence, nothing sent twice.
func TestAttack25GuidedThenDataLossGuidedAgain(t *testing.T) {
	srv := redistest.Start(t)
	var logs lockedBuffer
	// Heartbeats far apart, so that the guide and the restart fall
	// between two of them on a busy machine: the window is one interval
	// wide at any setting (a second by default).
	tg := startGatewayLogged(t, []string{srv.Addr}, redistest.Prefix(t), slog.New(slog.NewTextHandler(&logs, nil)),
		func(c *Config) { c.HeartbeatInterval = 5 * time.Second })
	ctx := context.Background()
	ks := tg.store.Keyspace()
	direct := redistest.Client(t, srv)
	err := policy.NewStore(direct, ks).Save(ctx, policy.Policy{DefaultTTL: 10 * time.Second, Segments: map[string]time.Duration{"short": time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the policy is in force", func() bool { return tg.policy.Current().TTL("short") == time.Second })

	// Start just after a heartbeat got through: the next is 5s away.
	beatAt := func() string { v, _ := direct.HGet(ctx, ks.AliveKey(), tg.instance).Result(); return v }
	first := beatAt()
	waitUntil(t, "a heartbeat", func() bool { return beatAt() != first })
	beatMS, _ := strconv.ParseInt(strings.SplitN(beatAt(), ":", 2)[0], 10, 64)

	silent := tg.dialSegment(t, "silent", "short")
	pingPong(t, silent)
	ms, err := direct.ZScore(ctx, ks.IndexKey(session.Bucket("silent")), "silent").Result()
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.UnixMilli(int64(ms))

	// The listener guides the silence: Redis reports it due, the guide is
	// produced, and the entry is settled (a single stage: removed).
	var guided []session.Expired
	waitUntil(t, "the silence due", func() bool {
		es, _, err := tg.store.Due(ctx, 10)
		if err != nil {
			return false
		}
		for _, e := range es {
			if e.UID == "silent" {
				guided = append(guided, e)
			}
		}
		return len(guided) > 0
	})
	if err := tg.store.Settle(ctx, guided); err != nil {
		t.Fatal(err)
	}
	if n, _ := direct.ZCard(ctx, ks.IndexKey(session.Bucket("silent"))).Result(); n != 0 {
		t.Fatalf("index still holds %d entries after the guide was settled", n)
	}
	if b := beatAt(); b == "" || !strings.HasPrefix(b, strconv.FormatInt(beatMS, 10)) {
		t.Skipf("a heartbeat got through after the guide (%q, was %d): the window closed on this machine", b, beatMS)
	}

	// Redis restarts without its data, between two heartbeats.
	if err := direct.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	restarted := time.Now()
	waitUntil(t, "a resync after the data loss", func() bool {
		return strings.Contains(logs.String(), "lost this instance's heartbeat") && strings.Contains(logs.String(), `msg="resynced sessions"`)
	})
	if got, err := direct.ZScore(ctx, ks.IndexKey(session.Bucket("silent")), "silent").Result(); err == nil {
		t.Errorf("silent: its silence (deadline %v) was guided at %v, before Redis restarted empty at %v; "+
			"the resync restored it, due %v: it is guided again", deadline.Format("15:04:05.000"),
			guided[0].Detected.Format("15:04:05.000"), restarted.Format("15:04:05.000"), time.UnixMilli(int64(got)).Format("15:04:05.000"))
	}
}
