package activityfeed

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
	"github.com/stillthere/stillthere/pkg/session"
)

// TestCommand: show prints each partition's watermark, or that no feed
// ran; forget deletes it; bad arguments get the usage.
func TestCommand(t *testing.T) {
	srv := redistest.Start(t)
	prefix := redistest.Prefix(t)
	env := func(k string) (string, bool) {
		v, ok := map[string]string{"STILLTHERE_REDIS_ADDRS": srv.Addr, "STILLTHERE_KEY_PREFIX": prefix}[k]
		return v, ok
	}
	run := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := Command(context.Background(), args, env, &out)
		return out.String(), err
	}
	for _, bad := range [][]string{nil, {"drop"}, {"show", "extra"}} {
		if _, err := run(bad...); err == nil {
			t.Errorf("%q: want an error", bad)
		}
	}
	if out, err := run("show"); err != nil || !strings.Contains(out, "no activity feed has run") {
		t.Fatalf("show before any feed: %q, %v", out, err)
	}
	ks, err := session.NewKeyspace(prefix)
	if err != nil {
		t.Fatal(err)
	}
	store := session.NewStore(redistest.Client(t, srv), ks)
	// A member started and never stamped (Kafka down since its start):
	// every deadline is held; forget releases it.
	if err := store.ActivityFeedStarting(context.Background()); err != nil {
		t.Fatal(err)
	}
	if out, err := run("show"); err != nil || !strings.Contains(out, "has not stamped") {
		t.Fatalf("show of a feed that never stamped: %q, %v", out, err)
	}
	if _, err := run("forget"); err != nil {
		t.Fatal(err)
	}
	if out, err := run("show"); err != nil || !strings.Contains(out, "no activity feed has run") {
		t.Fatalf("show after forgetting a feed that never stamped: %q, %v", out, err)
	}
	now, err := store.ActivityClock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	st := session.FeedStamp{Gap: time.Second, Topic: DefaultTopic, Partitions: 2, CaughtUp: map[int32]time.Time{0: now, 1: now.Add(-time.Second)}}
	if _, err := store.ActivityCaughtUp(context.Background(), st); err != nil {
		t.Fatal(err)
	}
	out, err := run("show")
	if err != nil || !strings.Contains(out, "partition 0:") || !strings.Contains(out, "partition 1:") {
		t.Fatalf("show: %q, %v", out, err)
	}
	if _, err := run("forget"); err != nil {
		t.Fatal(err)
	}
	if out, err := run("show"); err != nil || !strings.Contains(out, "no activity feed has run") {
		t.Fatalf("show after forget: %q, %v", out, err)
	}
}
