package gateway

import (
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/stillthere/stillthere/pkg/push"
)

// Attacks on keeping guides ahead of their live delivery, second round:
// each test looks for a guide lost, sent twice on one connection, or a
// close stage's promise broken by the keep ahead, the drops and settled
// marks that proofs and supersedes make, or the fixes of the first round.

// aa2DropsDone returns once every inbox drop a proof asked for before it
// was called has been made: the drops of proofs go to Redis in order, on
// one goroutine (aheadDrops), so once a later proof's drop is seen, the
// earlier ones are done. The later proof is another user's guide.
func aa2DropsDone(t *testing.T, tg *testGateway, uid string) {
	t.Helper()
	ws := tg.dial(t, uid)
	req := push.Request{ID: uid + "-barrier", UID: uid, Text: "Still there?", DeadlineMS: redisNowMS(t, tg.rdb), Stage: 1}
	tg.mustPush(t, req, push.Delivered)
	readGuide(t, ws, req.ID)
	pingPong(t, ws) // reading on answers the gateway's ping: proof
	waitUntil(t, "the barrier guide's proof takes it out of the inbox", func() bool { return len(tg.aaInboxIDs(t, uid)) == 0 })
}

// aa2ProofSeq is the proof sequence number of the first guide of id that
// uid's one connection here waits proof of, pushed (live) or not.
func (tg *testGateway) aa2ProofSeq(t *testing.T, uid, id string, live bool) uint64 {
	t.Helper()
	cs := tg.hub.lookup(uid)
	if len(cs) != 1 {
		t.Fatalf("%d connections of %s here, want 1", len(cs), uid)
	}
	c := cs[0]
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range c.unproven() {
		if p.id == id && (p.req != nil) == live {
			return p.seq
		}
	}
	t.Fatalf("no unproven copy of %s (live %v) on %s's connection", id, live, uid)
	return 0
}

// TestAttackAhead2AckAfterPongProvesUnreadGuide: device A is live, device
// H holds its guides until its first ping. Guides g1 and g2 are pushed:
// kept ahead, queued on A, held by H. H ends before its first frame and
// gives them back, which offers the inbox to A: A is queued the inbox
// copies of g1 and g2 after its live ones (g1, g2, g1', g2'). A's client
// gets g1 and the ping after it, which its WebSocket stack answers at
// once (a browser does so on its own, before the page has handled g1's
// message): the pong proves g1. The page then acks g1, and the client
// dies before g2 arrives. (Now A is not queued the inbox copies, and an
// ack of an id proven here proves no more.) The first round's fix made an
// ack prove "the first copy of its id", but it looked only among the
// copies not proven yet: the live g1 is proven, so the ack takes g1' and proves everything
// queued before it, the live g2 included. g2, which no client read, is
// taken out of the inbox and marked settled, and the next connect is not
// handed it: lost.
func TestAttackAhead2AckAfterPongProvesUnreadGuide(t *testing.T) {
	tg := startGateway(t, func(c *Config) { c.firstPingWaitFor = time.Minute })
	uid := "aa2-ackpong"
	wsA := tg.dial(t, uid)
	wsH := tg.dialFirstPing(t, uid)
	waitUntil(t, "both connections in the hub", func() bool { return tg.hub.count(uid) == 2 })
	now := redisNowMS(t, tg.rdb)
	g1 := push.Request{ID: "g1", UID: uid, Text: "Still there?", DeadlineMS: now, Stage: 1}
	g2 := push.Request{ID: "g2", UID: uid, Text: "Still there?", DeadlineMS: now + 1, Stage: 1}
	tg.mustPush(t, g1, push.Delivered)
	tg.mustPush(t, g2, push.Delivered)

	wsH.Close() // H ends before its first frame: its held copies go back
	waitUntil(t, "H ends", func() bool { return tg.hub.count(uid) == 1 })
	// Since the fix, A is not queued inbox copies of guides it was sent
	// live (a bounded look: the give-back's offer comes within it).
	if waitFor(2*time.Second, func() bool { return tg.aaUnproven(uid) > 2 }) {
		t.Errorf("A was queued inbox copies of the guides it has live: %d waiting for proof", tg.aaUnproven(uid))
	}

	readGuide(t, wsA, g1.ID)
	// The client's stack answers the ping that follows the live g1.
	seq := tg.aa2ProofSeq(t, uid, g1.ID, true)
	if err := wsA.WriteControl(websocket.PongMessage, []byte(proofPingPrefix+strconv.FormatUint(seq, 10)), time.Now().Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the pong proves the live g1", func() bool { return tg.aaUnproven(uid) == 1 })
	aaAck(t, wsA, g1.ID)  // the page acks the g1 it showed: it proves no more
	wsA.NetConn().Close() // the client dies before g2 arrives
	waitUntil(t, "A ends and releases its leases", func() bool { return tg.hub.count(uid) == 0 && tg.aaLeases(uid) == 0 })
	aa2DropsDone(t, tg, uid+"-other")

	inbox := tg.aaInboxIDs(t, uid)
	got := aaGuidesBeforePong(t, tg.dial(t, uid))
	if !slices.Contains(got, g2.ID) {
		t.Errorf("the next connect was handed %v (inbox %v): g2, which no client read, is lost; A's ack of g1, after the pong had proven the live g1, proved the inbox copy g1' and the live g2 queued before it", got, inbox)
	}
}

// TestAttackAhead2SupersedeDropsAppliedClose: device H holds its guides
// until its first ping; device B is live. A silence's close stage c is
// pushed: kept ahead, held by H, written to B, whose close is applied
// (4000). B's client never proves it (its network is gone), and B ends:
// c is kept in the inbox marked closed, for the user's next connect or a
// connection they made meanwhile, "unless they pinged after it was kept
// there; their client's active_ago_ms does not drop it" (protocol.md).
// H's first ping then says the user was active just now. The inbox
// handover leaves c's closed entry to H's held live copy (the first
// round's fix), which H's word supersedes; and the supersede takes c out
// of the inbox and marks it settled, the closed entry with it. H is
// handed nothing, the inbox is empty: the user is never told the chat
// was closed on B. Before the keep ahead, H was handed the closed entry.
// (After the fix, the handover left the entry to H's held copy, leased,
// and a later take found it stale by H's first ping's renewal: H must be
// handed it at its hold's end, before that ping's pong.)
func TestAttackAhead2SupersedeDropsAppliedClose(t *testing.T) {
	uid := "aa2-supclose"
	tg, wsH, c := aaCloseAppliedOnB(t, uid)

	pingSaying(t, wsH, 0) // the user was active just now, on H
	var got []string
	for {
		m := readJSON(t, wsH)
		if m["type"] == "pong" {
			break
		}
		if m["type"] == "guide" {
			got = append(got, m["id"].(string))
		}
	}
	// Told on H at its hold's end, before its ping's answer: left in the
	// inbox instead, the entry was stale by that ping's renewal at the
	// next take (a route refresh's offer), and so lost.
	if !slices.Contains(got, c.ID) {
		t.Errorf("H was handed %v before its pong, and the inbox holds %v: the close stage %s, whose close was applied on B, was not told on H; H's word of activity superseded its held copy, and the closed entry was left for a later take, which finds it stale by H's ping",
			got, tg.aaInboxIDs(t, uid), c.ID)
	}
}

// TestAttackAhead2HeldPastChunkSentTwice: device H holds its guides until
// its first ping, and four guides (an inbox chunk, half the send queue)
// are pushed: each kept ahead, and held. The first round's fix hands H no
// inbox copy of a guide it holds: the handover at the hold's end leaves
// the four entries to the held live copies. But the chunk was full, so
// the handover takes the inbox again once the hold is over, finds the
// same four entries (unproven yet: the live copies were just queued) and
// queues them on H too: each guide goes out twice on one connection.
func TestAttackAhead2HeldPastChunkSentTwice(t *testing.T) {
	tg := startGateway(t, func(c *Config) {
		c.firstPingWaitFor = time.Minute
		// A client that reads nothing for a while is not cut off meanwhile.
		c.WriteTimeout = 30 * time.Second
	}) // SendQueue 8: chunk 4
	uid := "aa2-chunk"
	wsH := tg.dialFirstPing(t, uid)
	now := redisNowMS(t, tg.rdb)
	var ids []string
	for i := range tg.inboxChunk() {
		req := push.Request{ID: "h" + strconv.Itoa(i), UID: uid, Text: "Still there?", DeadlineMS: now + int64(i), Stage: 1}
		tg.mustPush(t, req, push.Delivered) // held by H
		ids = append(ids, req.ID)
	}
	pingSaying(t, wsH, -1) // no word: nothing superseded, the hold ends
	// H's client reads nothing yet (so proves nothing): whatever the
	// handover does after the hold is done with the entries as they are.
	twice := waitFor(3*time.Second, func() bool { return tg.aaUnproven(uid) > len(ids) })
	pingSaying(t, wsH, -1)
	var got []string
	for pongs := 0; pongs < 2; {
		m := readJSON(t, wsH)
		switch m["type"] {
		case "pong":
			pongs++
		case "guide":
			got = append(got, m["id"].(string))
		}
	}
	for _, id := range ids {
		if n := aa2Count(got, id); n != 1 {
			t.Errorf("H got guide %s %d times (frames %v, more unproven than pushed: %v): the inbox copy kept ahead was handed over after the live copy it held", id, n, got, twice)
		}
	}
}

func aa2Count(s []string, v string) int {
	n := 0
	for _, x := range s {
		if x == v {
			n++
		}
	}
	return n
}
