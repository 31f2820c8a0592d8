package timeline

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/session"
)

// TestAttack28LastGrantTwoDevices: a user on two gateways. The laptop's
// grant on gw-a (a TTL with more jitter) sets the deadline; the phone's
// later renewal on gw-b asks for an earlier one, so the deadline stays
// gw-a's, and Redis keeps both instances (the via: gw-a's grant, then
// gw-b, the last to renew). View's granted: last shows the deadline gw-a
// set, at gw-b's renewal, by gw-b alone: a reader is told gw-b's renewal
// set a deadline it did not, and the instance whose outage holds that
// deadline (the gateway-dead rule counts both) is not named.
func TestAttack28LastGrantTwoDevices(t *testing.T) {
	store, _ := newStore(t)
	ctx := context.Background()
	renewer := func(inst string) *session.Renewer {
		r := session.NewRenewer(store, session.RenewerConfig{Instance: inst})
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); r.Run(rctx) }()
		t.Cleanup(func() { cancel(); <-done })
		return r
	}
	gwA, gwB := renewer("gw-a"), renewer("gw-b")
	const uid = "a28-two"

	dA, err := gwA.Renew(ctx, uid, "default", 65*time.Second, session.ClockPresence)
	if err != nil {
		t.Fatal(err)
	}
	dB, err := gwB.Renew(ctx, uid, "default", 60*time.Second, session.ClockPresence)
	if err != nil {
		t.Fatal(err)
	}
	g, err := store.LastGrant(ctx, uid)
	if err != nil || !g.Deadline.Equal(dA) || !dB.Before(dA) || !slices.Equal(g.Vias, []string{"gw-a", "gw-b"}) {
		t.Fatalf("LastGrant %+v, %v; want gw-a's deadline %v kept over gw-b's own %v, vias gw-a then gw-b (the premise: Redis knows whose grant the deadline is)",
			g, err, dA, dB)
	}

	got, err := View(ctx, store, uid, 0)
	if err != nil || len(got) != 1 || got[0].Rule != RuleLast {
		t.Fatalf("View: %+v, %v; want the last grant alone", got, err)
	}
	e := got[0]
	if e.Deadline != dA.UnixMilli() {
		t.Fatalf("granted: last deadline %d, want the pending %d", e.Deadline, dA.UnixMilli())
	}
	if e.Instance == "gw-b" {
		t.Errorf("granted: last by %s with deadline %v: that is gw-a's grant (gw-b's renewal asked for %v); the entry names neither gw-a nor that the deadline is another instance's (detail %q)",
			e.Instance, dA.Format("15:04:05.000"), dB.Format("15:04:05.000"), e.Detail)
	}
}

// TestAttack28LastGrantSpooled: Kafka out of reach, the listener spools a
// silence's first stage and settles it with its next stage waiting for
// the replay (session.AfterReplay). Nothing has reached any consumer, let
// alone the user; View's granted: last says the silence was guided, with
// stage 2 due next.
func TestAttack28LastGrantSpooled(t *testing.T) {
	store, _ := newStore(t)
	ctx := context.Background()
	const uid = "a28-spooled"
	due := lapsed(t, store, uid)
	due[0].NextDue = session.AfterReplay // spooled: its next stage waits for the replay
	if err := store.Settle(ctx, due); err != nil {
		t.Fatal(err)
	}
	got, err := View(ctx, store, uid, 0)
	if err != nil || len(got) != 1 || got[0].Rule != RuleLast {
		t.Fatalf("View: %+v, %v; want the last grant alone", got, err)
	}
	if e := got[0]; strings.Contains(e.Detail, "guided") {
		t.Errorf("granted: last (stage %d due next, detail %q) while stage 1 is only in a listener's spool: nobody was guided yet", e.Stage, e.Detail)
	}
}
