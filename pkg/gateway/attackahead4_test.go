package gateway

import (
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/push"
	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
	"github.com/stillthere/stillthere/pkg/tcpproxy"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// Attacks on keeping guides ahead of their live delivery, fourth round:
// the offers of the inbox the third round's fixes added (a handover's
// entries released as its connection ends, a held guide superseded), and
// what they still leave behind.

// TestAttackAhead4ReleaseOnOtherInstanceLeavesReconnectWithout is the
// third round's lease attack with the two devices on two gateway
// instances (one Redis, one prefix). Device A is live on instance one and
// is pushed guide g: kept ahead, queued on A, whose client reads nothing
// yet. Device B connects on instance two, and its connect is handed g's
// entry from the inbox: leased to B, queued on B, unread. A's network
// goes: A's hand-on routes g, and B (which has it) counts as delivered.
// A's device reconnects on instance one (A2), silent: its connect finds g
// leased to B and is handed nothing. Then B's network goes before it
// proved g: B's handover releases the lease, and the fix offers the
// inbox to the user's connections on instance two only, where there are
// none. Nothing offers it to A2: A2 stays connected, its user silent, and
// is never handed g, which waits for a connect that may not come.
func TestAttackAhead4ReleaseOnOtherInstanceLeavesReconnectWithout(t *testing.T) {
	srv := redistest.Start(t)
	prefix := redistest.Prefix(t)
	long := func(c *Config) {
		// No connection is cut off for want of proof meanwhile: each
		// ends when the test ends it.
		c.WriteTimeout = 30 * time.Second
		// The route refresh offers the inbox to a connected user's
		// connections here: a guide left in it waits no longer than this.
		c.routeRefreshEvery = time.Second
	}
	one := startGatewayOn(t, []string{srv.Addr}, prefix, long)
	two := startGatewayOn(t, []string{srv.Addr}, prefix, long)
	uid := "aa4-xlease"

	wsA := one.dial(t, uid)
	pingPong(t, wsA) // the user's last renewal, before the deadline
	g := push.Request{ID: "g", UID: uid, Text: "Still there?", DeadlineMS: redisNowMS(t, one.rdb), Stage: 1}
	if res := one.mustPush(t, g, push.Delivered); res.Connections != 1 {
		t.Fatalf("delivered to %d connections, want 1", res.Connections)
	}
	wsB := two.dial(t, uid) // its client reads nothing: no proof
	waitUntil(t, "B's connect leases g's entry", func() bool { return one.aaLeases(uid) == 1 })

	wsA.NetConn().Close() // A's network is gone before it proved g
	waitUntil(t, "A ends", func() bool { return one.hub.count(uid) == 0 })
	one.aa3HandedOn(t, uid, g.ID)

	// A's device reconnects on instance one; its connect's take is done
	// once the handler reaches its test hook.
	setup := make(chan struct{}, 1)
	one.testSetup = func() {
		select {
		case setup <- struct{}{}:
		default:
		}
	}
	wsA2 := one.dial(t, uid)
	select {
	case <-setup:
	case <-time.After(10 * time.Second):
		t.Fatal("A2's connect never got past its inbox take")
	}
	got := aa3Guides(wsA2) // A2's client reads (and answers pings), and says nothing

	wsB.NetConn().Close() // B's network is gone before it proved g
	waitUntil(t, "B ends and releases its lease", func() bool { return two.hub.count(uid) == 0 && one.aaLeases(uid) == 0 })

	handed := waitFor(patience, func() bool {
		select {
		case id := <-got:
			return id == g.ID
		default:
			return false
		}
	})
	if !handed {
		t.Errorf("A2, connected and silent on instance one, was never handed g (inbox %v, leases %d): B's handover on instance two leased the entry kept ahead and released it unproven, offering it only to instance two's connections; g waits for a connect that may not come",
			one.aaInboxIDs(t, uid), one.aaLeases(uid))
	}
}

// TestAttackAhead4KilledHandoverLeaseLeavesOtherDeviceWithout: a user
// connected nowhere has guide g kept in their inbox. Device B connects on
// instance one, and its connect leases g's entry and queues it; B's
// client reads nothing yet. Device A connects on instance two meanwhile,
// silent, and finds g leased: it is handed nothing. Then instance one is
// killed (its Redis cut, as a SIGKILL leaves it), before B proved g: no
// handover settles, and the lease only runs out. The entry is there (the
// keep ahead's promise: a dead gateway loses nothing), but nothing offers
// it to A when the lease runs out: A stays connected, its user silent,
// and is never handed g, which waits for a connect that may not come.
func TestAttackAhead4KilledHandoverLeaseLeavesOtherDeviceWithout(t *testing.T) {
	srv := redistest.Start(t)
	prefix := redistest.Prefix(t)
	cut, err := tcpproxy.Start(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cut.Close() })
	dying := startGatewayOn(t, []string{cut.Addr()}, prefix, func(c *Config) {
		// A short lease (two write timeouts and a margin): its chunk is
		// one guide. B's proof is not cut off before the kill.
		c.SendQueue = 2
		c.WriteTimeout = 3 * time.Second
	})
	other := startGatewayOn(t, []string{srv.Addr}, prefix, func(c *Config) {
		c.WriteTimeout = 30 * time.Second // A is cut off for nothing
		// The route refresh offers the inbox to a connected user's
		// connections here: a guide left in it waits no longer than this.
		c.routeRefreshEvery = time.Second
	})
	ctx := context.Background()
	uid := "aa4-killed"
	ks := other.store.Keyspace()

	g := push.Request{ID: "g", UID: uid, Text: "Still there?", DeadlineMS: redisNowMS(t, other.rdb), Stage: 1}
	other.mustPush(t, g, push.Queued) // connected nowhere: kept

	wsB := dying.dial(t, uid) // its client reads nothing: no proof
	waitUntil(t, "B's connect leases g's entry", func() bool { return other.aaLeases(uid) == 1 })
	until, err := strconv.ParseInt(other.rdb.HGet(ctx, ks.InboxLeaseKey(uid), g.ID).Val(), 10, 64)
	if err != nil {
		t.Fatalf("g's lease: %v", err)
	}

	setup := make(chan struct{}, 1)
	other.testSetup = func() {
		select {
		case setup <- struct{}{}:
		default:
		}
	}
	wsA := other.dial(t, uid)
	select {
	case <-setup:
	case <-time.After(10 * time.Second):
		t.Fatal("A's connect never got past its inbox take")
	}
	got := aa3Guides(wsA) // A's client reads (and answers pings), and says nothing

	// Instance one dies before B proved g: its Redis is gone, and so is
	// B's connection.
	cut.Cut()
	dying.run.Tolerate()
	wsB.NetConn().Close()

	// The lease runs out by Redis's clock: real time must pass.
	waitUntil(t, "g's lease runs out", func() bool { return redisNowMS(t, other.rdb) > until })
	handed := waitFor(patience, func() bool {
		select {
		case id := <-got:
			return id == g.ID
		default:
			return false
		}
	})
	if !handed {
		t.Errorf("A, connected and silent on instance two, was never handed g (inbox %v): the handover on the killed instance leased it, the lease ran out, and nothing offered it to A; g waits for a connect that may not come",
			other.aaInboxIDs(t, uid))
	}
}

// TestAttackAhead4CloseAppliedOnOtherInstanceNeverTold is the third
// round's supersede attack with the two devices on two instances. Device
// H holds its guides until its first ping, on instance one; device B is
// live on instance two. A silence's close stage c is pushed: kept ahead,
// held by H, written to B, whose close is applied (4000); B's client has
// not proven it yet. H's first ping says the user was active just now:
// H's held copy is superseded, and c's entry kept ahead leaves the inbox
// (not settled: the fix). Then B's client is gone before proving c: B's
// hand-on keeps it in the inbox marked closed, and its keep offers the
// inbox to instance two's connections, of which there are none. H,
// connected and silent since its ping (which came before the keep), is
// never handed the close applied on B; on one instance it is (the third
// round's fix). The user on H is never told the chat was closed, while
// their session is over on every device.
func TestAttackAhead4CloseAppliedOnOtherInstanceNeverTold(t *testing.T) {
	srv := redistest.Start(t)
	prefix := redistest.Prefix(t)
	cfg := func(c *Config) {
		c.firstPingWaitFor = time.Minute
		// B lingers, its close applied, until the test ends it.
		c.WriteTimeout = 30 * time.Second
		// The route refresh offers the inbox to a connected user's
		// connections here: a guide left in it waits no longer than this.
		c.routeRefreshEvery = time.Second
	}
	one := startGatewayOn(t, []string{srv.Addr}, prefix, cfg)
	two := startGatewayOn(t, []string{srv.Addr}, prefix, cfg)
	uid := "aa4-xclose"
	wsH := one.dialFirstPing(t, uid)
	wsB := two.dial(t, uid)
	waitUntil(t, "both instances in the user's route", func() bool {
		return one.rdb.HLen(context.Background(), one.store.Keyspace().RouteKey(uid)).Val() == 2
	})
	c := stagePush(uid, redisNowMS(t, one.rdb), 2, timeoutevent.ActionClose)
	if res := one.mustPush(t, c, push.Delivered); res.Connections != 2 {
		t.Fatalf("delivered to %d connections, want 2", res.Connections)
	}
	readStage(t, wsB, c) // written: B's close is applied; no proof yet

	pingSaying(t, wsH, 0) // the user was active just now, on H
	var before []string
	for {
		m := readJSON(t, wsH)
		if m["type"] == "pong" {
			break
		}
		if m["type"] == "guide" {
			before = append(before, m["id"].(string))
		}
	}
	if slices.Contains(before, c.ID) {
		t.Fatalf("H was handed %v: its word did not supersede the close stage %s", before, c.ID)
	}
	waitUntil(t, "H's supersede takes c's entry out", func() bool {
		return !slices.Contains(one.aaInboxIDs(t, uid), c.ID)
	})

	got := aa3Guides(wsH) // H's client reads (and answers pings), and says nothing
	wsB.NetConn().Close() // B's client is gone before it proves c
	// Once kept closed, the entry may be handed to H (a route refresh's
	// offer) and proven, and so leave the inbox, between two looks.
	handed := false
	took := func() bool {
		select {
		case id := <-got:
			handed = handed || id == c.ID
		default:
		}
		return handed
	}
	if !waitFor(patience, func() bool {
		return two.hub.count(uid) == 0 && (took() || slices.Contains(one.aaInboxIDs(t, uid), c.ID+"(closed)"))
	}) {
		t.Fatalf("B on instance two: %d connections; the close stage %s neither kept closed nor handed to H (inbox %v)",
			two.hub.count(uid), c.ID, one.aaInboxIDs(t, uid))
	}
	handed = handed || waitFor(patience, took)
	if !handed {
		t.Errorf("H, connected and silent on instance one, was never handed the close stage %s applied on B (inbox %v): B's hand-on kept it closed on instance two, whose keep offers the inbox only to its own connections; the user on H is never told the chat was closed",
			c.ID, one.aaInboxIDs(t, uid))
	}
}

// TestAttackAhead4HeldOrderPutsCloseBeforeReminder: device B is live, and
// is pushed a silence's reminder r (stage 1): kept ahead, queued on B,
// whose client reads without answering the proof pings. Device H
// connects holding its guides until its first ping. The silence's close
// stage c is pushed: kept ahead, held by H, written to B (its close is
// applied). B's network goes before it proved either: its hand-on routes
// r, which H holds after c, and keeps c closed. H's first ping says
// nothing of its user. Its handover finds r's entry, the oldest in the
// inbox, and c's, and skips both, H holding live copies (the second
// round's skip); then the held copies go out in the order they came: c
// first, which closes H and drops r behind it. H shows the close stage
// without the reminder before it, which it is never shown. The inbox,
// kept ahead, has them in their order (r, then c): the hold's order
// wins over it. (This fails since the first round's fix too: the hold's
// order is older than the keep ahead, which could have mended it.)
func TestAttackAhead4HeldOrderPutsCloseBeforeReminder(t *testing.T) {
	tg := startGateway(t, func(c *Config) {
		c.firstPingWaitFor = time.Minute
		// B lingers unproven until the test ends it.
		c.WriteTimeout = 30 * time.Second
	})
	uid := "aa4-order"
	wsB := tg.dial(t, uid)
	pingPong(t, wsB) // the user's last renewal, before the deadline
	// B's client reads its frames but answers no ping: nothing is proven.
	wsB.SetPingHandler(func(string) error { return nil })
	deadline := redisNowMS(t, tg.rdb)
	r := stagePush(uid, deadline, 1, timeoutevent.ActionRemind)
	if res := tg.mustPush(t, r, push.Delivered); res.Connections != 1 {
		t.Fatalf("delivered to %d connections, want 1", res.Connections)
	}
	readStage(t, wsB, r)

	wsH := tg.dialFirstPing(t, uid)
	c := stagePush(uid, deadline, 2, timeoutevent.ActionClose)
	if res := tg.mustPush(t, c, push.Delivered); res.Connections != 2 {
		t.Fatalf("delivered to %d connections, want 2", res.Connections)
	}
	readStage(t, wsB, c) // written: B's close is applied; no proof

	wsB.NetConn().Close() // B's network is gone before it proved either
	waitUntil(t, "B ends", func() bool { return tg.hub.count(uid) == 1 })
	tg.aa3HandedOn(t, uid, r.ID)
	tg.aa3HandedOn(t, uid, c.ID)

	pingSaying(t, wsH, -1) // H's first ping, saying nothing of its user
	var shown []string
	wsH.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		_, b, err := wsH.ReadMessage()
		if err != nil {
			break // closed (4000 after the close stage), or the deadline
		}
		var m map[string]any
		if json.Unmarshal(b, &m) == nil && m["type"] == "guide" {
			shown = append(shown, m["id"].(string))
		}
	}
	if !slices.Equal(shown, []string{r.ID, c.ID}) {
		t.Errorf("H was shown %v, want the reminder %s and then the close stage %s: its handover skipped both inbox entries for the copies it held, and those went out in the order they came, the close stage first (inbox %v)",
			shown, r.ID, c.ID, tg.aaInboxIDs(t, uid))
	}
}

// TestAttackAhead4SkippedChunkLeavesLaterEntries: device H, the user's
// only one, holds its guides until its first ping; its send queue holds
// two frames, so an inbox chunk is one guide, and so is its hold. Guides
// x1 and x2 are pushed: kept ahead, held by H (its hold is full then).
// Guide y is pushed: H's full hold refuses it, and it is kept in the
// inbox, behind x1 and x2, for H's hold to end with. H's first ping says
// nothing of its user: its handover takes the first chunk, x1, skips it
// (H holds it live), and stops, having queued nothing (the second
// round's fix); the held copies go out. Nothing hands H y, the one guide
// it holds no copy of: H stays connected, and y waits in the inbox for
// a connect that may not come.
func TestAttackAhead4SkippedChunkLeavesLaterEntries(t *testing.T) {
	tg := startGateway(t, func(c *Config) {
		c.firstPingWaitFor = time.Minute
		c.SendQueue = 2
		c.WriteTimeout = 30 * time.Second
		// The route refresh offers the inbox to a connected user's
		// connections here: a guide left in it waits no longer than this.
		c.routeRefreshEvery = time.Second
	})
	uid := "aa4-chunk"
	wsH := tg.dialFirstPing(t, uid)
	now := redisNowMS(t, tg.rdb)
	x1 := push.Request{ID: "x1", UID: uid, Text: "Still there?", DeadlineMS: now - 2000, Stage: 1}
	x2 := push.Request{ID: "x2", UID: uid, Text: "Still there?", DeadlineMS: now - 1000, Stage: 1}
	// y's deadline is after H's first ping, whose renewal would make a y
	// of an earlier deadline stale (its user pinged after it) for a take
	// that a starved host runs after that renewal lands.
	y := push.Request{ID: "y", UID: uid, Text: "Still there?", DeadlineMS: now + 60_000, Stage: 1}
	tg.mustPush(t, x1, push.Delivered)
	tg.mustPush(t, x2, push.Delivered)
	tg.mustPush(t, y, push.Queued) // H's hold is full
	if ids := tg.aaInboxIDs(t, uid); !slices.Equal(ids, []string{"x1", "x2", "y"}) {
		t.Fatalf("inbox %v, want [x1 x2 y]", ids)
	}

	pingSaying(t, wsH, -1) // H's first ping, saying nothing of its user
	got := aa3Guides(wsH)  // H reads (and answers pings), and says nothing
	var shown []string
	waitFor(patience, func() bool {
		select {
		case id := <-got:
			shown = append(shown, id)
		default:
		}
		return len(shown) == 3
	})
	if !slices.Equal(shown, []string{"x1", "x2", "y"}) {
		t.Errorf("H was shown %v, want [x1 x2 y] (inbox %v): its handover took a first chunk of a guide it held live, skipped it, and stopped; y, kept behind it while H's hold was full, is never handed to H while it stays connected",
			shown, tg.aaInboxIDs(t, uid))
	}
}
