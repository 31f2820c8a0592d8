package gateway

import (
	"context"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/push"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// TestAttack4CloseStageGuideToHalfOpenLost: the user's only connection is
// half-open (the phone lost its network without a FIN) when the close
// stage is pushed. Every other guide waits for the client's proof and,
// unproven, goes on to the user's next connection; the close stage's guide
// is written, answered delivered, ends the session, and is gone: the user
// who reconnects is never told their chat was closed, though a user
// connected nowhere at that moment finds it in their inbox. Nothing
// proves the close stage's guide reached anyone.
//
// Not fixed by queueing the guide for proof and keeping it in the inbox
// when unproven: the 4000 close counts as the user's normal close, whose
// end is recorded as their last renewal, so the kept guide is stale on
// arrival (handOn's LastRenewed check, and the inbox take's).
//
// Failure line:
//
//	attack4_close_stage_half_open_test.go:47: read: read tcp ...: i/o timeout
func TestAttack4CloseStageGuideToHalfOpenLost(t *testing.T) {
	tg := startGateway(t, func(c *Config) {
		c.WriteTimeout = 2 * time.Second // the longest a guide waits for its proof
		c.IdleTimeout = time.Hour        // only a missing proof, or the close, ends the old connection
	})
	ks := tg.store.Keyspace()
	ctx := context.Background()

	ws, p := tg.dialThrough(t, "mara")
	pingPong(t, ws)
	p.Blackhole() // the network drops every byte; nobody sends a FIN

	req := stagePush("mara", redisNowMS(t, tg.rdb), 2, timeoutevent.ActionClose)
	tg.mustPush(t, req, push.Delivered)
	waitUntil(t, "the half-open connection ends", func() bool { return tg.hub.count("mara") == 0 })

	// The user's phone finds a network again and reconnects.
	back := tg.dial(t, "mara")
	readStage(t, back, req)
	if n := tg.rdb.LLen(ctx, ks.InboxKey("mara")).Val(); n != 0 {
		t.Logf("inbox holds %d entries", n)
	}
}
