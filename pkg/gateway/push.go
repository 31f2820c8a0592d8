package gateway

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stillthere/stillthere/pkg/frame"
	"github.com/stillthere/stillthere/pkg/push"
	"github.com/stillthere/stillthere/pkg/session"
)

// The push flow, in the order a guide takes it. The contract itself (the
// request, the statuses, the limits, the secret) is package push.
//
//  1. servePush checks the secret and the request.
//  2. claim: one script (session.Store.ClaimPush) moves the guide's state
//     for this user (Keyspace.DeliveredKey) from nothing to claimed, or answers
//     duplicate (done before), retry (claimed by a push still under way:
//     its outcome is not known, so it is not a duplicate) or stale (the
//     user renewed after the guide's deadline).
//  3. route: keep the guide in the user's inbox ahead of its delivery, so
//     that it outlives this process until a connection proves it got it
//     (ahead.go); hand it to this instance's connections of the user,
//     and publish it on the sharded Pub/Sub channel of every other
//     instance in the user's route key. An instance that published to
//     nobody is dropped from the route only when its heartbeat says it is
//     dead; a live one (resubscribing) is tried again, and if the guide
//     reached nobody the push answers retry.
//  4. keep: a user connected nowhere keeps the guide in their inbox, unless
//     a connection registered since the route was read, in which case
//     routing starts over.
//  5. the claim becomes the outcome, kept for a day, or is released when
//     the guide went nowhere, so that a retry can push it.
//
// The claim judges the silence once; a guide late on its way to a
// connection is judged again (see late.go).
//
// Each instance takes guides others route to it on its channel (listen),
// and hands a connecting user their inbox (handOverInbox).

const (
	// claimTTL bounds how long a push of one id can hold it: a claim
	// whose gateway died lapses, and the id can be pushed again.
	claimTTL = 30 * time.Second
	// pushTimeout bounds one push's work, well within claimTTL, so no
	// claim lapses under a push still running.
	pushTimeout = 10 * time.Second
	// pushedTTL is how long an id's outcome is remembered.
	pushedTTL = 24 * time.Hour
	// pushRetryAfter is the Retry-After of a retry answer.
	pushRetryAfter = time.Second
	// publishRetries and publishRetryWait bound how long a push waits for
	// a live instance to listen again (it subscribes again at once, see
	// channel.go).
	publishRetries   = 5
	publishRetryWait = 200 * time.Millisecond
	// reroutes bounds how often a push starts over because connections
	// registered while it routed.
	reroutes = 3
	// recheckAge is how old a guide's last judgement (push.Request's
	// CheckedMS) may be when a connection takes it; older, it is judged
	// again. Well within the half second a signal racing a deadline may
	// take to land either way: a guide that passes goes out before a
	// return it missed could be told apart from that race.
	recheckAge = 500 * time.Millisecond
)

var (
	errClaimed   = errors.New("another push of this guide is under way")
	errUnreached = errors.New("no subscriber on the channel of a live instance holding the user")
	errLateBeat  = errors.New("an instance holding the user missed its heartbeat: the user's pings may wait unread in it")
	// errUnwrittenPing refuses a close stage's decision while a connection
	// of the user here holds a ping Redis may not have (unwrittenHere).
	errUnwrittenPing = errors.New("a connection of the user here pinged where Redis could not hear it, and no resync has written that back yet")
)

func (g *Gateway) servePush(w http.ResponseWriter, r *http.Request) {
	if !push.Authorized(r, g.cfg.PushSecret) {
		metricPushes.WithLabelValues("rejected").Inc()
		push.WriteUnauthorized(w)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, push.MaxBodyBytes))
	if err != nil {
		metricPushes.WithLabelValues("invalid").Inc()
		push.WriteRejected(w, "body: "+err.Error())
		return
	}
	req, err := push.ParseRequest(body)
	if err != nil {
		metricPushes.WithLabelValues("invalid").Inc()
		push.WriteRejected(w, err.Error())
		return
	}
	// Not cut short by the consumer hanging up: a push under way finishes
	// and records its outcome, which the consumer's retry then finds.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), pushTimeout)
	defer cancel()
	res, err := g.push(ctx, req)
	switch {
	case errors.Is(err, errClaimed):
		metricPushes.WithLabelValues(string(push.Retry)).Inc()
		push.WriteRetry(w, http.StatusConflict, pushRetryAfter, "guide "+req.ID+" is being pushed; its outcome is not known yet")
	case errors.Is(err, errLateBeat), errors.Is(err, errUnwrittenPing):
		// This user's, not the gateway failing: a 409, which a consumer
		// retries without counting it against its breaker.
		metricPushes.WithLabelValues(string(push.Retry)).Inc()
		push.WriteRetry(w, http.StatusConflict, pushRetryAfter, "guide "+req.ID+": "+err.Error())
	case err != nil:
		metricPushes.WithLabelValues(string(push.Retry)).Inc()
		g.pushLog.Fail(fmt.Errorf("guide %s: %w", req.ID, err))
		push.WriteRetry(w, http.StatusServiceUnavailable, pushRetryAfter, "push unavailable, retry")
	default:
		g.pushLog.OK()
		metricPushes.WithLabelValues(string(res.Status)).Inc()
		push.WriteSettled(w, res.Status, res.Connections)
	}
}

// push delivers a guide once per user and id (see the flow above).
func (g *Gateway) push(ctx context.Context, req push.Request) (push.Response, error) {
	token := newToken()
	// Taken before the claim: its judgement is at least this fresh.
	req.CheckedMS = g.redisNowMS()
	state, err := g.store.ClaimPush(ctx, req.UID, req.ID, token, claimTTL, req.DeadlineMS)
	if err != nil {
		return push.Response{}, fmt.Errorf("claim guide id: %w", err)
	}
	switch state {
	case session.PushBusy:
		return push.Response{}, errClaimed
	case session.PushDone:
		return push.Response{Status: push.Duplicate}, nil
	case session.PushStale:
		return push.Response{Status: push.Stale}, nil
	}
	res, err := g.route(ctx, req)
	outcome := ""
	if err == nil {
		outcome = string(res.Status)
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.cfg.WriteTimeout)
	defer cancel()
	serr := g.store.SettlePush(sctx, req.UID, req.ID, token, outcome, pushedTTL)
	if err != nil {
		if serr != nil {
			// The claim lapses after claimTTL; retries meanwhile hear retry.
			return push.Response{}, fmt.Errorf("%w; and release the claim: %v", err, serr)
		}
		return push.Response{}, err
	}
	if serr != nil {
		// What went out stays out, and the consumer is told so; only a
		// resend after the claim lapses could show it again.
		g.pushLog.Fail(fmt.Errorf("guide %s %s, but recording that failed: %w", req.ID, res.Status, serr))
	}
	return res, nil
}

// route hands a claimed guide to the user's connections wherever they
// are, or keeps it in their inbox.
func (g *Gateway) route(ctx context.Context, req push.Request) (push.Response, error) {
	routeKey := g.store.Keyspace().RouteKey(req.UID)
	payload, err := json.Marshal(req)
	if err != nil {
		return push.Response{}, err
	}
	for range reroutes {
		routes, err := g.rdb.HGetAll(ctx, routeKey).Result()
		if err != nil {
			return push.Response{}, fmt.Errorf("look up %q's route: %w", req.UID, err)
		}
		if err := g.routeAwake(ctx, routes); err != nil {
			return push.Response{}, err
		}
		ahead := false
		if len(routes) > 0 || len(g.hub.lookup(req.UID)) > 0 {
			// Kept before any connection takes it, so that it outlives
			// this process (see ahead.go).
			if ahead, err = g.keepAhead(ctx, req, payload); err != nil {
				return push.Response{}, err
			}
		}
		// Nothing took it yet: judged again. A close stage's close may
		// have been decided already (applied, by a late reminder that
		// went out with it), and is only cancelled here: not over, it is
		// left to the first connection about to write it (commitClose).
		if over, err := g.closeOver(ctx, req); err != nil {
			return push.Response{}, err
		} else if over {
			g.markCameBack(ctx, req.UID, []push.Request{req}, "a close stage the user came back before any connection wrote: not sent")
			return push.Response{Status: push.Stale}, nil
		}
		if checked := req.CheckedMS; !req.Final && g.cameBack(ctx, &req) {
			g.markCameBack(ctx, req.UID, []push.Request{req}, "the user renewed after its deadline while its push was under way: not sent")
			return push.Response{Status: push.Stale}, nil
		} else if req.CheckedMS != checked {
			if payload, err = json.Marshal(req); err != nil {
				return push.Response{}, err
			}
		}
		n, superseded, cancelled, undecided := g.deliverLocal(ctx, req)
		if cancelled {
			// A close stage's, decided for every connection: none writes
			// it, here or where it would be routed.
			g.markCameBack(ctx, req.UID, []push.Request{req}, "a close stage the user came back before any connection wrote: not sent")
			return push.Response{Status: push.Stale}, nil
		}
		remote, err := g.deliverElsewhere(ctx, req.UID, payload, routes)
		if undecided != nil {
			// Refused here for want of its close's decision, by devices
			// there and silent, whoever else took it: kept, it would be
			// offered to them as the inbox's copy, which closes nothing,
			// and taken elsewhere, its proof there takes its entry out of
			// the inbox. The consumer pushes it again, and a decision then
			// closes them; a connection that took it already adds nothing
			// for the copy (see hasGuide).
			if n+remote == 0 && ahead {
				g.dropAhead(ctx, req)
			}
			return push.Response{}, errors.Join(undecided, err)
		}
		if n+remote > 0 {
			if err != nil {
				g.log.Warn("guide delivered, but not to every instance holding the user", "uid", req.UID, "guide_id", req.ID, "err", err)
			}
			return push.Response{Status: push.Delivered, Connections: n + remote}, nil
		}
		if err != nil {
			if ahead {
				// Nobody took it, and the caller is told to try again: a
				// consumer pushes it again; nothing else owes it.
				g.dropAhead(ctx, req)
			}
			return push.Response{}, err
		}
		if superseded > 0 {
			// The user's only connections are here, and their client
			// says they were present after the deadline: the silence was
			// one the network made, and is over (see present.go).
			g.markSuperseded(ctx, req.UID, []push.Request{req})
			return push.Response{Status: push.Stale}, nil
		}
		status, err := g.keep(ctx, req, payload, routes, true, false)
		if err != nil || status != "" {
			return push.Response{Status: status}, err
		}
		// A connection registered since the route was read: route again.
	}
	return push.Response{}, fmt.Errorf("route of %q kept changing", req.UID)
}

// routeAwake refuses a push (409) while another instance in the user's
// route has missed a heartbeat, and is not dead yet (lateBeat): paused, it
// holds the user's pings unread, and the user may be answering through it
// right now. The consumer tries again; by then the instance answered (the
// pings it held renewed the session, and the claim finds the guide
// stale), or its lease ran out (dead: its route entry is dropped, and the
// guide goes to the user's other connections or inbox). A push waits so
// at most a lease, and only for the users of a paused instance: the
// consumer does not count a 409 against its breaker.
func (g *Gateway) routeAwake(ctx context.Context, routes map[string]string) error {
	var others []string
	for inst := range routes {
		if inst != g.instance {
			others = append(others, inst)
		}
	}
	if len(others) == 0 {
		return nil
	}
	now, insts, err := g.store.InstancesOf(ctx, others)
	if err != nil {
		return err
	}
	for _, name := range others {
		if i, ok := insts[name]; ok && lateBeat(i, now) {
			return fmt.Errorf("%w: %s, last at %s", errLateBeat, name, i.Last.UTC().Format(time.RFC3339Nano))
		}
	}
	return nil
}

// deliverLocal hands a guide to uid's connections on this instance, and
// returns how many took it, and how many dropped it as superseded (their
// client said the user was present after its deadline). Each that took it
// keeps it until the client proves it got it, and hands it on if it ends
// first (see proof.go); one holding its guides holds it, unsent, until
// its first frame (see present.go). A close stage's guide closes each
// connection that took it once written to it (see inactive.go), unless
// its close was cancelled: then no connection takes it (cancelled). Its
// close is decided once for them all (closeDecision); undecided (Redis
// failing), none takes it, and undecided is the error.
func (g *Gateway) deliverLocal(ctx context.Context, req push.Request) (taken, superseded int, cancelled bool, undecided error) {
	var d closeDecision // a close stage's, once for all of them
	for _, c := range g.hub.lookup(req.UID) {
		switch c.enqueueGuide(ctx, req, &d) {
		case guideTaken:
			taken++
		case guideSuperseded:
			superseded++
		case guideCancelled:
			cancelled = true
		}
	}
	return taken, superseded, cancelled, d.err
}

// deliverElsewhere publishes a guide to the other instances in uid's
// route, and returns how many took it. A channel with no subscriber
// belongs to a dead instance, which is dropped from the route, or to a
// live one resubscribing, which is tried again for a while: one publish
// that reached nobody says nothing about an instance's connections.
func (g *Gateway) deliverElsewhere(ctx context.Context, uid string, payload []byte, routes map[string]string) (int, error) {
	ks := g.store.Keyspace()
	targets := make([]string, 0, len(routes))
	for inst := range routes {
		if inst != g.instance {
			targets = append(targets, inst)
		}
	}
	slices.Sort(targets)
	n := 0
	for attempt := 0; len(targets) > 0; attempt++ {
		var missed []string
		for _, inst := range targets {
			got, err := g.rdb.SPublish(ctx, ks.InstanceChannel(inst), payload).Result()
			if err != nil {
				return n, fmt.Errorf("route guide to %s: %w", inst, err)
			}
			if got > 0 {
				n++
				continue
			}
			// Dropped only as far as written before it was seen dead: an
			// instance back since keeps what it wrote again, and is tried
			// again, as a live one is.
			if dead, ok := g.deadInstance(inst); ok {
				dropped, kept, err := g.store.DropDeadRoutes(ctx, uid, []session.DeadInstance{dead})
				metricRoutesPruned.Add(float64(dropped))
				if err == nil && kept == 0 {
					continue
				}
			}
			missed = append(missed, inst)
		}
		targets = missed
		if len(targets) == 0 {
			break
		}
		if attempt == publishRetries {
			return n, fmt.Errorf("%w: %v", errUnreached, targets)
		}
		// A late slot map sends SPUBLISH to a node that no longer masters
		// the channel's slot; a replica answers it, counting only its own
		// subscribers. The next try goes where the cluster names now.
		g.reloadSlots(ctx)
		select {
		case <-ctx.Done():
			return n, ctx.Err()
		case <-time.After(publishRetryWait):
		}
	}
	return n, nil
}

// keepReq stores a guide in its user's inbox, whoever is connected; with
// closed, marked as a close stage's guide whose close was applied (see
// proof.go).
func (g *Gateway) keepReq(ctx context.Context, req push.Request, closed bool) (push.Status, error) {
	payload, err := json.Marshal(req)
	if err != nil {
		return "", err
	}
	return g.keep(ctx, req, payload, nil, false, closed)
}

// keep stores a guide in uid's inbox. With check, it refuses (status "")
// when a connection registered since routes was read. With closed, the
// entry is a close stage's guide whose close was applied.
func (g *Gateway) keep(ctx context.Context, req push.Request, payload []byte, routes map[string]string, check, closed bool) (push.Status, error) {
	// The max age counts as inboxAgeFrom says. The entry keeps its
	// deadline for the staleness check.
	n, err := g.store.KeepGuide(ctx, req.UID, session.Keep{Entry: payload, MaxAge: g.cfg.guideMaxAge(), From: inboxAgeFrom(req, closed),
		Cap: g.cfg.InboxSize, TTL: g.cfg.InboxTTL, Closed: closed, CheckRoute: check, Routes: routes})
	if err != nil {
		return "", fmt.Errorf("keep guide %s for %q: %w", req.ID, req.UID, err)
	}
	switch n {
	case session.KeptQueued, session.KeptAlready:
		// A connection of the user here may have registered since the
		// caller found none: its connect took the inbox as it was at its
		// route write, before this. Without a route check (a hold's
		// guides given back, a guide routed in, one handed on), or with
		// one that a drop and a reconnect here leave at the same count,
		// nothing else hands it this guide until its next connect.
		g.offerInbox(context.WithoutCancel(ctx), req.UID)
		return push.Queued, nil
	case session.KeptTooOld:
		return push.TooOld, nil
	case session.KeptSettled:
		// A connection of the user proved it got it (or it was found
		// superseded or stale) since it was kept ahead.
		return push.Duplicate, nil
	}
	return "", nil
}

// routedIn delivers a guide another instance routed here.
func (g *Gateway) routedIn(ctx context.Context, payload string) {
	var req push.Request
	if err := json.Unmarshal([]byte(payload), &req); err != nil || req.Validate() != nil {
		g.log.Warn("bad routed guide", "err", err)
		return
	}
	// Judged again if late, as far as it may be once routed (see late.go).
	if g.cameBackRouted(ctx, &req) {
		g.markCameBack(ctx, req.UID, []push.Request{req}, "routed here after the user renewed past its deadline: not sent")
		return
	}
	n, superseded, cancelled, undecided := g.deliverLocal(ctx, req)
	if cancelled {
		g.markCameBack(ctx, req.UID, []push.Request{req}, "a close stage routed here, the user having come back before any connection wrote it: not sent")
		return
	}
	if undecided != nil {
		// Its publisher counted this instance as delivered: kept, the
		// inbox's copy would be offered to the devices that refused it,
		// closing none of them. Tried again for a while instead, off the
		// channel's reader.
		g.redeliverUndecided(ctx, req, []byte(payload))
		return
	}
	if n > 0 {
		metricPushes.WithLabelValues("routed_in").Inc()
		return
	}
	if superseded > 0 {
		g.markSuperseded(ctx, req.UID, []push.Request{req})
		return
	}
	kctx, cancel := context.WithTimeout(ctx, g.cfg.WriteTimeout)
	defer cancel()
	status, err := g.keep(kctx, req, []byte(payload), nil, false, false)
	if err != nil {
		g.pushLog.Fail(err)
		g.timeline.Record(req.UID, lostEntry(req, "routed here after the user's connections ended, and not kept: "+err.Error()))
		return
	}
	if status == push.TooOld {
		g.timeline.Record(req.UID, skippedEntry(req, ruleTooOld, "routed here after the user's connections ended: too old for the inbox"))
		return
	}
	// The push counted this instance as delivered: the user's
	// connections here ended as it was routed.
	if e, ok := sentEntry(req, status, 0, "routed here after the user's connections ended: kept for the next connect"); ok {
		g.timeline.Record(req.UID, e)
	}
}

// redeliverUndecided's waits double from undecidedWait up to
// undecidedMaxWait.
const (
	undecidedWait    = 100 * time.Millisecond
	undecidedMaxWait = 2 * time.Second
)

// redeliverUndecided delivers again, on a goroutine of its own, a close
// stage routed here that this instance's connections refused for want of
// its close's decision (Redis failing), until a delivery decides it, the
// user's connections here have ended, its max age has passed, or the
// gateway stops; then it is kept, as a routed copy that nobody here took
// is. Not a number of tries: its publisher counted this instance as
// delivered, and while a connection that was there when the chat closed
// is open here, only a live copy closes it (the inbox's copy, offered
// once Redis is back, tells it and closes nothing). An outage longer than
// STILLTHERE_SHED_AFTER ends the connections (1013), and the loop with
// them.
func (g *Gateway) redeliverUndecided(ctx context.Context, req push.Request, payload []byte) {
	keep := func() {
		kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.cfg.WriteTimeout)
		defer cancel()
		if _, err := g.keep(kctx, req, payload, nil, false, false); err != nil {
			g.pushLog.Fail(err)
			g.timeline.Record(req.UID, lostEntry(req, "routed here, its close undecided, and not kept: "+err.Error()))
		}
	}
	if !g.track(1) {
		keep()
		return
	}
	go func() {
		defer g.conns.Done()
		wait := undecidedWait
		giveUp := time.Now().Add(g.cfg.guideMaxAge())
		for time.Now().Before(giveUp) {
			select {
			case <-ctx.Done():
				keep()
				return
			case <-time.After(wait):
			}
			wait = min(2*wait, undecidedMaxWait)
			n, superseded, cancelled, undecided := g.deliverLocal(ctx, req)
			switch {
			case undecided != nil:
				continue
			case cancelled:
				g.markCameBack(ctx, req.UID, []push.Request{req}, "a close stage routed here, the user having come back before any connection wrote it: not sent")
			case n > 0:
				metricPushes.WithLabelValues("routed_in").Inc()
			case superseded > 0:
				g.markSuperseded(ctx, req.UID, []push.Request{req})
			default:
				keep() // its connections here ended meanwhile
			}
			return
		}
		keep()
	}()
}

// inboxChunk is how many inbox guides wait in a connection's send queue at
// once: half of it, so that a handover never fills the queue it shares
// with pongs, and a large inbox never cuts its client off.
func (g *Gateway) inboxChunk() int { return max(1, g.cfg.SendQueue/2) }

// inboxLease is how long a connection may take to write one chunk of
// inbox guides and have them proven before another connection of the
// user may take them too: each frame's write timeout, the last one's wait
// for proof (cut off after a write timeout too), and a margin.
func (g *Gateway) inboxLease() time.Duration {
	return time.Duration(g.inboxChunk()+1)*g.cfg.WriteTimeout + 5*time.Second
}

// takeInbox leases up to inboxChunk of c's user's inbox entries, oldest
// first, leaving them in the inbox. It judges them against the client's
// word p, the present-until time c knows, and when c opened, and returns
// the entries it dropped as superseded, and the present-until time now
// known.
func (g *Gateway) takeInbox(ctx context.Context, c *conn, p presence) (items, superseded []string, presentUntil int64, err error) {
	uid := c.uid
	w := session.TakeWord{AgoMS: p.agoMS, TTLMS: p.ttlMS, KnownMS: c.presentUntil(), OpenedMS: c.openedMS}
	t, err := g.store.TakeInbox(ctx, uid, g.inboxChunk(), g.inboxLease(), w)
	if err != nil {
		return nil, nil, 0, fmt.Errorf("take %q's inbox: %w", uid, err)
	}
	metricPushes.WithLabelValues("inbox_stale").Add(float64(len(t.Stale)))
	metricPushes.WithLabelValues("inbox_expired").Add(float64(len(t.Expired)))
	metricPushes.WithLabelValues("inbox_superseded").Add(float64(len(t.Superseded)))
	for _, raw := range t.Stale {
		g.recordDropped(uid, raw, ruleCameBack, "dropped from the inbox: the user renewed after its deadline")
	}
	for _, raw := range t.Expired {
		g.recordDropped(uid, raw, ruleTooOld, "dropped from the inbox: it expired before the user connected")
	}
	return t.Items, t.Superseded, t.PresentUntil, nil
}

// handOverInbox queues a connecting user's first inbox guides on c,
// oldest first, before anything else. Those whose silence the client's
// word p (or what c knew before) says the user was present for are
// dropped, and their silences marked stale. It returns the rest of the
// handover, for a goroutine of its own, or nil when there is none: each
// guide leaves the inbox once the client proved it got it (see proof.go),
// and the next ones are queued then, so a connection that drops first,
// or never reads, leaves them for the next connect.
func (g *Gateway) handOverInbox(ctx context.Context, c *conn, p presence) *handover {
	items, superseded, presentUntil, err := g.takeInbox(ctx, c, p)
	if err != nil {
		g.routeLog.Fail(err)
		return nil
	}
	if presentUntil > 0 {
		c.setPresentUntil(presentUntil)
	}
	g.markSuperseded(ctx, c.uid, parseEntries(superseded))
	if len(items) == 0 {
		return nil
	}
	h := &handover{g: g, c: c, taken: len(items)}
	h.queue(ctx, items)
	return h
}

// goRun runs the rest of h on a goroutine of its own; h may be nil.
func (h *handover) goRun(ctx context.Context) {
	if h != nil && h.g.track(1) {
		go func() {
			defer h.g.conns.Done()
			h.run(ctx)
		}()
	}
}

// handover is one connection's inbox handover.
type handover struct {
	g       *Gateway
	c       *conn
	written chan string       // entries of the chunk the client proved it got
	queued  map[string]string // entries of the chunk on the connection: entry -> guide id
	// live are the ids of entries the connection has a live copy of:
	// leased until the handover ends, so that each take goes past them;
	// liveClosed those of them whose close was applied elsewhere, id ->
	// entry (see handClosed).
	live       []string
	liveClosed map[string]string
	taken      int // entries the last take leased
}

// queue puts a chunk of entries on the connection, each reporting on
// written once proven received. Entries that do not parse leave the
// inbox at once; those the connection did not take are released; those
// it has a live copy of stay leased to it until the handover ends.
func (h *handover) queue(ctx context.Context, items []string) {
	written := make(chan string, len(items))
	h.written = written
	h.queued = make(map[string]string, len(items))
	var bad, unsent []string
	for _, raw := range items {
		req, ok := parseEntry(raw)
		if !ok {
			bad = append(bad, raw)
			continue
		}
		if h.c.sentGuide(req.ID) || h.c.holdsGuide(req.ID) {
			// Kept ahead of a live copy this connection was sent, whose
			// proof takes it out, or holds and sends once its hold ends
			// (after this handover): an inbox copy first would close
			// nothing, and the live close stage would then be dropped as
			// a copy. (A held copy the client's word supersedes offers
			// the inbox again, for a close applied elsewhere: see
			// endBegun.)
			h.live = append(h.live, req.ID)
			if entryClosed(raw) {
				if h.liveClosed == nil {
					h.liveClosed = make(map[string]string)
				}
				h.liveClosed[req.ID] = raw
			}
			continue
		}
		// A close stage's guide too closes nothing here: the user is
		// back, on this connection. Its close is decided as a
		// connection about to write it decides it (commitClose), unless
		// it was applied already: cancelled, the entry leaves the
		// inbox unshown; undecided (Redis failing), it stays.
		var appliedAt int64
		if req.Final && !entryClosed(raw) {
			applied, at, err := h.g.commitClose(ctx, req)
			if err != nil {
				unsent = append(unsent, req.ID)
				continue
			}
			if !applied {
				bad = append(bad, raw)
				continue
			}
			appliedAt = at
		}
		b := frame.Guide(req.ID, req.Text, req.DeadlineMS, req.Stage, req.Final)
		p := &guideProof{id: req.ID, proven: func() { written <- raw }, there: h.there(ctx, req, raw, appliedAt)}
		if len(unsent) > 0 || !h.c.enqueueProven(b, p, nil) {
			unsent = append(unsent, req.ID)
			continue
		}
		h.queued[raw] = req.ID
	}
	if len(bad) > 0 || len(unsent) > 0 {
		h.settle(ctx, nil, bad, unsent)
	}
}

// handClosed queues on the connection the entry of a close applied
// elsewhere that the handover left to the connection's held copy of id,
// which the client's word has just superseded: the chat was closed, and
// the user is told, whatever their client says of them since. Leased to
// the connection since its hold ended, the entry is not judged again by
// a take that would find it stale by the first ping's renewal. Called
// before run, from the hold's end, before its frames are answered.
func (h *handover) handClosed(id string) {
	raw, ok := h.liveClosed[id]
	if !ok {
		return
	}
	delete(h.liveClosed, id)
	h.live = slices.DeleteFunc(h.live, func(l string) bool { return l == id })
	req, _ := parseEntry(raw)
	b := frame.Guide(req.ID, req.Text, req.DeadlineMS, req.Stage, req.Final)
	written := h.written
	// Not there: a live copy that comes later is superseded by the
	// client's word, as the held one was, and closes nothing.
	if !h.c.enqueueProven(b, &guideProof{id: req.ID, proven: func() { written <- raw }}, nil) {
		// Released when the handover ends, for the user's next connect.
		h.live = append(h.live, id)
		return
	}
	h.queued[raw] = req.ID
}

// entryClosed reports whether an inbox entry is a close stage's guide
// whose close was applied.
func entryClosed(raw string) bool {
	var e struct {
		ClosedMS int64 `json:"closed_ms"`
	}
	return json.Unmarshal([]byte(raw), &e) == nil && e.ClosedMS > 0
}

// there reports whether the connection was there when a close stage's
// entry raw was applied (the chat closed), so that a live copy reaching
// it after this inbox copy still closes it (see closesAfterCopy): open
// since before the close was applied, whatever take handed it (an offer
// of the inbox, a later chunk's, or its connect's own, when the connect
// and the push cross: its route write after the keep ahead, its take
// before the live copy). By Redis's clock, as the connection's openedMS
// is, though only estimated: early by the reply's way back at most, so a
// close applied in that moment before the connection opened counts as
// applied after, as it does for a live copy that comes first (see
// closeDecision.openedAfter). Else it is the user come back, whom the
// inbox copy told, and closes nothing. When the close was applied is
// read from Redis (see Store.CloseAppliedAt). When the read fails, the
// copy counts as there: a live copy that follows decides for itself, as
// it does when it comes first (its decision brings the time, and spares
// a connection opened after it), so the outcome does not hang on which
// copy came first. kept_ms is no stand-in
// then: a connection may open between the keep ahead and the apply,
// just as a connect crosses the push. Not kept at all (a close decided
// by a gateway before it kept the time), the entry's kept_ms stands in:
// such a close was kept ahead of its live copy just before it was applied.
// appliedAt is the time as this take's own decision brought it (0: read
// here).
func (h *handover) there(ctx context.Context, req push.Request, raw string, appliedAt int64) bool {
	if !req.Final {
		return false
	}
	if appliedAt > 0 {
		// Known already: this take decided the close.
		return appliedAt >= h.c.openedMS
	}
	at, read := h.g.closeAppliedAt(ctx, req)
	if !read {
		return true
	}
	if at == 0 {
		var e struct {
			KeptMS int64 `json:"kept_ms"`
		}
		if json.Unmarshal([]byte(raw), &e) != nil {
			return false
		}
		at = e.KeptMS
	}
	return at >= h.c.openedMS
}

// run waits for each chunk to be proven, removes it from the inbox, and
// queues the next, until the inbox is empty or the connection ends.
func (h *handover) run(ctx context.Context) {
	taken := h.taken
	defer func() {
		if len(h.live) > 0 {
			h.settle(ctx, nil, nil, h.live)
		}
	}()
	chunk := h.g.inboxChunk()
	for {
		done := h.wait()
		var unsent []string
		for raw, id := range h.queued {
			if !slices.Contains(done, raw) {
				unsent = append(unsent, id)
			}
		}
		if err := h.settle(ctx, done, nil, unsent); err != nil {
			// Taking the inbox again would return the written ones.
			return
		}
		metricPushes.WithLabelValues("from_inbox").Add(float64(len(done)))
		h.recordHandedOver(done)
		if len(unsent) > 0 || taken < chunk {
			return
		}
		items, superseded, _, err := h.g.takeInbox(ctx, h.c, noPresence)
		h.g.markSuperseded(ctx, h.c.uid, parseEntries(superseded))
		if err != nil {
			h.g.routeLog.Fail(err)
			return
		}
		if len(items) == 0 {
			return
		}
		taken = len(items)
		h.liveClosed = nil
		h.queue(ctx, items)
	}
}

// recordHandedOver records the inbox guides the connection proved it got
// in their user's timeline: the push kept them, and this is where they
// reached the user.
func (h *handover) recordHandedOver(done []string) {
	if h.g.timeline == nil {
		return
	}
	for _, raw := range done {
		req, ok := parseEntry(raw)
		if !ok {
			continue
		}
		if e, ok := sentEntry(req, push.Delivered, 1, "handed over from the inbox on a connect"); ok {
			h.g.timeline.Record(h.c.uid, e)
		}
	}
}

// wait returns the entries of the current chunk the client proved it got:
// all of them, or those proven before the connection ended.
func (h *handover) wait() []string {
	done := make([]string, 0, len(h.queued))
	finished := h.c.finishedCh()
	for len(done) < len(h.queued) {
		select {
		case raw := <-h.written:
			done = append(done, raw)
		case <-finished:
			// It has finished: every proof was reported.
			for {
				select {
				case raw := <-h.written:
					done = append(done, raw)
				default:
					return done
				}
			}
		}
	}
	return done
}

// settle removes the entries the connection proved it got from the
// inbox, with their leases, and marks them settled, so that a copy still
// on its way (held by another connection and given back) does not put
// one back behind a later stage; removes entries that do not parse; and
// releases the leases of guides the connection did not write.
func (h *handover) settle(ctx context.Context, proven, bad []string, release []string) error {
	ctx, cancel := context.WithTimeout(ctx, h.g.cfg.WriteTimeout)
	defer cancel()
	var errs []error
	if len(proven) > 0 {
		drops := make([]session.InboxDrop, 0, len(proven))
		for _, e := range proven {
			if id, ok := h.queued[e]; ok {
				drops = append(drops, session.InboxDrop{UID: h.c.uid, ID: id})
			}
		}
		if _, err := h.g.store.DropFromInboxes(ctx, drops, session.DropHow{Settled: h.g.settledFor()}); err != nil {
			errs = append(errs, err)
		}
	}
	if len(release) > 0 && h.c.isClosed() {
		// Released as the connection ended: a connection of the user
		// here that found them leased (a reconnect) is offered them.
		defer h.g.offerInbox(context.WithoutCancel(ctx), h.c.uid)
	}
	if len(bad) > 0 || len(release) > 0 {
		ks := h.g.store.Keyspace()
		inbox, leases := ks.InboxKey(h.c.uid), ks.InboxLeaseKey(h.c.uid)
		_, err := h.g.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, e := range bad {
				p.LRem(ctx, inbox, 1, e)
			}
			if len(release) > 0 {
				p.HDel(ctx, leases, release...)
			}
			return nil
		})
		if err != nil {
			errs = append(errs, err)
		}
	}
	err := errors.Join(errs...)
	if err != nil {
		h.g.routeLog.Fail(fmt.Errorf("settle %d handed-over guides of %q's inbox: %w", len(proven)+len(bad)+len(release), h.c.uid, err))
	}
	return err
}

// newToken names one push's claim.
func newToken() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
