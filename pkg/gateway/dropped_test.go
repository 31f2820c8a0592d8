package gateway

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
	"github.com/stillthere/stillthere/pkg/session"
)

// TestResyncAfterQuietDataLoss: Redis loses its data so quickly that no
// renewal or heartbeat fails (a restart without persistence within a
// heartbeat). The next heartbeat finds the instance unknown to Redis, and
// the gateway writes every session back: that of a connected user who has
// gone quiet, and that of a user whose connection dropped while their
// grant runs. A user who closed normally is not restored.
func TestResyncAfterQuietDataLoss(t *testing.T) {
	srv := redistest.Start(t)
	var logs lockedBuffer
	tg := startGatewayLogged(t, []string{srv.Addr}, redistest.Prefix(t), slog.New(slog.NewTextHandler(&logs, nil)),
		func(c *Config) { c.HeartbeatInterval = 200 * time.Millisecond })
	ctx := context.Background()
	ks := tg.store.Keyspace()
	direct := redistest.Client(t, srv)

	quiet := tg.dial(t, "quiet")
	pingPong(t, quiet)
	dropping := tg.dial(t, "dropping")
	pingPong(t, dropping)
	dropping.UnderlyingConn().Close() // no close frame: an abnormal end
	leaving := tg.dial(t, "leaving")
	pingPong(t, leaving)
	leaving.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
	leaving.ReadMessage() // the gateway's close frame, then EOF
	waitUntil(t, "the normal close to end the session", func() bool {
		_, err := direct.ZScore(ctx, ks.IndexKey(session.Bucket("leaving")), "leaving").Result()
		return err != nil
	})
	deadline := func(uid string) (float64, error) {
		return direct.ZScore(ctx, ks.IndexKey(session.Bucket(uid)), uid).Result()
	}
	before := map[string]float64{}
	for _, uid := range []string{"quiet", "dropping"} {
		d, err := deadline(uid)
		if err != nil {
			t.Fatalf("%s has no deadline before the loss: %v", uid, err)
		}
		before[uid] = d
	}
	waitUntil(t, "the dropped connection to be released", func() bool { return len(tg.hub.lookup("dropping")) == 0 })
	if err := direct.FlushAll(ctx).Err(); err != nil { // Redis restarted empty
		t.Fatal(err)
	}
	waitUntil(t, "a resync", func() bool { return strings.Contains(logs.String(), `msg="resynced sessions"`) })
	for uid, was := range before {
		after, err := deadline(uid)
		if err != nil {
			t.Errorf("%s's deadline not restored: %v", uid, err)
			continue
		}
		if d := after - was; d < -2 || d > 50 {
			t.Errorf("%s's deadline restored as %v, was %v", uid, after, was)
		}
	}
	if d, err := deadline("leaving"); err == nil {
		t.Errorf("the user who closed normally got a deadline back: %v", d)
	}
}
