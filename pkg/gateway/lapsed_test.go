package gateway

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stillthere/stillthere/pkg/policy"
	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/tcpproxy"
)

// heartbeatSentPast waits until a heartbeat of tg sent after at got
// through: two processed after it, one after the other (the loop sends
// the next once the last is answered).
func heartbeatSentPast(t *testing.T, direct redis.Cmdable, tg *testGateway, at time.Time) {
	t.Helper()
	key := tg.store.Keyspace().AliveKey()
	beatAt := func() time.Time {
		v, _ := direct.HGet(context.Background(), key, tg.instance).Result()
		ms, _ := strconv.ParseInt(strings.SplitN(v, ":", 2)[0], 10, 64)
		return time.UnixMilli(ms)
	}
	var first time.Time
	waitUntil(t, "a heartbeat processed after "+at.Format("15:04:05.000"), func() bool {
		first = beatAt()
		return first.After(at)
	})
	waitUntil(t, "the heartbeat after it", func() bool { return beatAt().After(first) })
}

// TestResyncLapsedAfterDataLoss: Redis goes out of reach and comes back
// empty. A silence that began in the outage (a grant written before it
// that ran out in it, of a connected user and of one whose connection
// dropped) is restored at its own deadline, due at once, so that the listener
// holds it for the grace and guides it once; one that began before the
// outage is not, though Redis knows nothing of it any more: it was
// Redis's to guide, while Redis was in reach.
func TestResyncLapsedAfterDataLoss(t *testing.T) {
	srv := redistest.Start(t)
	proxy, err := tcpproxy.Start(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	var logs lockedBuffer
	tg := startGatewayLogged(t, []string{proxy.Addr()}, redistest.Prefix(t), slog.New(slog.NewTextHandler(&logs, nil)), nil)
	ctx := context.Background()
	ks := tg.store.Keyspace()
	direct := redistest.Client(t, srv)
	err = policy.NewStore(direct, ks).Save(ctx, policy.Policy{DefaultTTL: 10 * time.Second, Segments: map[string]time.Duration{"short": time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the policy is in force", func() bool { return tg.policy.Current().TTL("short") == time.Second })
	score := func(uid string) (time.Time, bool) {
		ms, err := direct.ZScore(ctx, ks.IndexKey(session.Bucket(uid)), uid).Result()
		return time.UnixMilli(int64(ms)), err == nil
	}

	before := tg.dialSegment(t, "before", "short")
	pingPong(t, before)
	beforeDeadline, _ := score("before")
	heartbeatSentPast(t, direct, tg, beforeDeadline)
	late := tg.dialSegment(t, "late", "short")
	lateAt := time.Now()
	pingPong(t, late)
	lateDeadline, _ := score("late")
	dropping := tg.dialSegment(t, "dropping", "short")
	pingPong(t, dropping)
	dropping.UnderlyingConn().Close() // no close frame: an abnormal end
	waitUntil(t, "the dropped connection to be released", func() bool { return len(tg.hub.lookup("dropping")) == 0 })
	lastDeadline, _ := score("dropping")

	proxy.Cut()
	waitUntil(t, "a failed heartbeat", func() bool { return strings.Contains(logs.String(), `msg="heartbeat failing"`) })
	// Real time must pass: the grants run out while Redis is out of reach.
	time.Sleep(time.Until(lastDeadline.Add(100 * time.Millisecond)))
	if err := direct.FlushAll(ctx).Err(); err != nil { // Redis restarted empty
		t.Fatal(err)
	}
	resynced := time.Now()
	proxy.Restore()
	waitUntil(t, "a resync", func() bool { return strings.Contains(logs.String(), `msg="resynced sessions"`) })

	for uid, want := range map[string]time.Time{"late": lateDeadline, "dropping": lastDeadline} {
		got, ok := score(uid)
		// At its own deadline, which its guide names: the gateway's
		// record of the ping's arrival plus the TTL, a moment before
		// Redis's grant of it. The resync sends what is left of the
		// grant, aged when its script is sent, and Redis adds it to its
		// clock when the script runs: later by the write's way there,
		// tens of ms on a busy machine (30 ms seen under -race beside
		// CPU hogs), which makes the deadline that much later, never
		// earlier. Restored at the resync instead would be 100 ms and
		// more late.
		if !ok || got.Before(want.Add(-50*time.Millisecond)) || got.After(want.Add(90*time.Millisecond)) || !got.Before(resynced) {
			t.Errorf("%s: deadline %v (%v), want its own, %v, before the resync at %v", uid, got, ok, want, resynced)
		}
	}
	renewed, err := tg.store.LastRenewed(ctx, "late")
	if err != nil {
		t.Fatal(err)
	}
	if d := renewed.Sub(lateAt); d < -5*time.Millisecond || d > time.Second {
		t.Errorf("late's last renewal %v, want its ping's, at %v", renewed, lateAt)
	}
	if got, ok := score("before"); ok {
		t.Errorf("before: restored, due %v, though its grant ran out at %v, before the outage", got, beforeDeadline)
	}
}

// TestReachOutageStart: the start of the failures no resync has followed
// is the earliest of them, and is forgotten once a resync that began
// after the last of them completes.
func TestReachOutageStart(t *testing.T) {
	r := newReach(2*time.Millisecond, slowFlush, nil)
	if from, _ := r.outage(); !from.IsZero() {
		t.Fatalf("outage from %v before any failure", from)
	}
	lastBeat := time.Now().Add(-5 * time.Second)
	r.lostSince(lastBeat)
	r.flushed(time.Second, errors.New("down")) // began a second ago: later
	from, failures := r.outage()
	if !from.Equal(lastBeat) {
		t.Fatalf("outage from %v, want the earliest, %v", from, lastBeat)
	}
	r.flushed(0, errors.New("down")) // fails again while the resync runs
	r.resynced(failures)
	if got, _ := r.outage(); !got.Equal(lastBeat) {
		t.Fatalf("after a resync that a failure followed: outage from %v, want %v still", got, lastBeat)
	}
	_, failures = r.outage()
	r.resynced(failures)
	if got, _ := r.outage(); !got.IsZero() {
		t.Fatalf("after a resync that followed every failure: outage from %v, want none", got)
	}
}
