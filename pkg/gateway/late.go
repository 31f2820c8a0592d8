package gateway

import (
	"context"
	"fmt"
	"time"

	"github.com/stillthere/stillthere/pkg/push"
)

// A guide is judged once, when its push claims it. One that waits on its
// way to a connection for longer than recheckAge (a gateway paused
// between claim and write, a routed guide read late off the channel, a
// hold) is judged again before a connection takes it (cameBack): its user
// may have come back meanwhile, on any device or through the platform,
// and is not asked whether they are still there.
//
// In the push's own route nothing took the guide yet, and every stage is
// judged again, as a claim made then would: one found over is stale, and
// so are its silence's later stages, whose claims come after and judge the
// same renewal. Once routed (read off the channel, held by a connection)
// another connection may have taken it, and only so far (cameBackRouted):
//
//   - a close stage is not judged so: another connection may have
//     applied its close, and the devices connected then are told (see
//     inactive.go). Whether it is applied is decided once instead, by
//     the first connection about to write it (commitClose), and every
//     other connection, on any instance, follows: cancelled if the user
//     came back by then, and then written nowhere;
//   - a reminder found over goes out all the same once a later stage of
//     its silence was claimed before the user came back, and is being
//     pushed, or went out (delivered, or queued for the next connect),
//     unless its close was cancelled: that stage goes to the devices,
//     and a close must never come before its reminder. Its close, if no
//     connection decided it yet, is decided applied here, so that it
//     goes out after this reminder. Not claimed yet, no later stage will
//     be: its claim judges the renewal this one found; and one found
//     stale or too old went nowhere.
//
// A later stage is found by the ids the listener gives a silence's stages
// (timeoutevent.StageID), which its guide consumer pushes them under.

// cameBack judges req's silence again, as its push's claim did, when the
// last judgement (req.CheckedMS) is older than recheckAge: it reports
// whether the user renewed after the deadline, and otherwise stamps req
// with this judgement. A guide without a deadline is not judged, and a
// failed read judges nothing: the claim's judgement stands.
func (g *Gateway) cameBack(ctx context.Context, req *push.Request) bool {
	now := g.redisNowMS()
	if req.DeadlineMS <= 0 || now-req.CheckedMS <= recheckAge.Milliseconds() {
		return false
	}
	rctx, cancel := context.WithTimeout(ctx, g.cfg.WriteTimeout)
	defer cancel()
	renewed, err := g.store.LastRenewed(rctx, req.UID)
	if err != nil {
		g.log.Debug("judge a late guide again", "uid", req.UID, "guide_id", req.ID, "err", err)
		return false
	}
	if renewed.UnixMilli() > req.DeadlineMS {
		return true
	}
	req.CheckedMS = now
	return false
}

// cameBackRouted is cameBack for a guide another connection may have
// taken already: a close stage is not judged so (commitClose decides it),
// and a reminder found over still goes out once a later stage of its
// silence is being pushed or went out, and its close was not cancelled.
func (g *Gateway) cameBackRouted(ctx context.Context, req *push.Request) bool {
	if req.Final || !g.cameBack(ctx, req) {
		return false
	}
	rctx, cancel := context.WithTimeout(ctx, g.cfg.WriteTimeout)
	defer cancel()
	goes, err := g.store.LaterStageGoes(rctx, req.UID, req.DeadlineMS, max(req.Stage, 1), pushedTTL, string(push.Delivered), string(push.Queued))
	if err != nil {
		g.log.Debug("look for a later stage of a late guide's silence", "uid", req.UID, "guide_id", req.ID, "err", err)
		return false
	}
	return !goes
}

// commitClose decides whether req, a close stage's guide a connection is
// about to write (or an inbox handover to show), is applied
// (session.Store.CommitClose): the first to ask, on any instance, decides
// for all, by whether the user renewed after the deadline. A failed call
// decides nothing, and the guide is not written (err): written, its close
// could be cancelled by the next to ask. A push nobody took for that
// fails, for the consumer to push it again (see route); a routed copy is
// kept for later, as for a connection that refused it. One without a deadline is applied,
// and nothing cancels it: the call only keeps when (see handover.there),
// and a failed one writes it all the same, as before the time was kept;
// an inbox copy of it is then judged by when it was kept. appliedAt is
// when the close was applied, read with the decision (0: not known, see
// session.Store.CommitCloseAt).
func (g *Gateway) commitClose(ctx context.Context, req push.Request) (applied bool, appliedAt int64, err error) {
	cctx, cancel := context.WithTimeout(ctx, g.cfg.WriteTimeout)
	defer cancel()
	if req.DeadlineMS <= 0 {
		applied, appliedAt, err = g.store.ApplyCloseAt(cctx, req.UID, req.ID, pushedTTL)
		if err != nil {
			g.log.Warn("keep when a close stage without a deadline was applied; written all the same", "uid", req.UID, "guide_id", req.ID, "err", err)
			// Applied elsewhere already, its time is read on its own: a
			// connection the user opened after it is spared still.
			appliedAt, _ = g.closeAppliedAt(ctx, req)
			return true, appliedAt, nil
		}
		return applied, appliedAt, nil
	}
	if g.unwrittenHere(cctx, req.UID, req.DeadlineMS) {
		err = fmt.Errorf("decide close stage %s of %q: %w", req.ID, req.UID, errUnwrittenPing)
		g.log.Warn("decide a close stage's close once the resync has written the user's pings back; not written now", "uid", req.UID, "guide_id", req.ID)
		return false, 0, err
	}
	applied, appliedAt, err = g.store.CommitCloseAt(cctx, req.UID, req.ID, req.DeadlineMS, pushedTTL)
	if err != nil {
		g.log.Warn("decide a close stage's close; not written now", "uid", req.UID, "guide_id", req.ID, "err", err)
	}
	return applied, appliedAt, err
}

// unwrittenHere reports whether a connection of uid on this instance
// holds a ping after deadlineMS (a close stage's deadline) that Redis has
// not heard: its renewal unwritten (conn.grant negative) while a resync
// is owed, after an outage that kept this instance's renewals from
// Redis, and Redis's last renewal of the user no later than the
// deadline. A close decided then would be judged by Redis alone, which
// does not know the user came back: refused, it is decided once the
// resync has written the ping back, and cancelled by it. A ping before
// the deadline does not count (it cannot cancel that silence), nor one
// Redis has (the resync wrote it, or another device's renewal is newer:
// the decision cancels the close anyway), nor a renewal merely in
// flight with Redis in reach: it lands as any ping that crosses a
// decision. A failed read of Redis's renewal counts as unheard. An
// undated close is not judged by renewals, and does not ask.
func (g *Gateway) unwrittenHere(ctx context.Context, uid string, deadlineMS int64) bool {
	if !g.reach.resyncOwed() {
		return false
	}
	now, redisNow := time.Since(g.start), g.redisNowMS()
	pinged := false
	for _, c := range g.hub.lookup(uid) {
		if c.grant.Load() >= 0 {
			continue
		}
		// When it pinged, by Redis's clock, as far as this instance knows.
		at := redisNow - (now - time.Duration(c.pingAt.Load())).Milliseconds()
		pinged = pinged || at > deadlineMS
	}
	if !pinged {
		return false
	}
	renewed, err := g.store.LastRenewed(ctx, uid)
	return err != nil || renewed.UnixMilli() <= deadlineMS
}

// closeOver judges again, in its push's own route, a close stage's guide
// whose last judgement (req.CheckedMS) is older than recheckAge: it
// reports whether its close is cancelled, deciding that now if the user
// renewed after the deadline. A close applied already, or not over, is
// not: it goes on. Any other guide is not judged here.
func (g *Gateway) closeOver(ctx context.Context, req push.Request) (bool, error) {
	if !req.Final || req.DeadlineMS <= 0 || g.redisNowMS()-req.CheckedMS <= recheckAge.Milliseconds() {
		return false, nil
	}
	cctx, cancel := context.WithTimeout(ctx, g.cfg.WriteTimeout)
	defer cancel()
	return g.store.CancelCloseIfOver(cctx, req.UID, req.ID, req.DeadlineMS, pushedTTL)
}

// closeAppliedAt reads when req's close was applied (see
// session.Store.CloseAppliedAt); 0 when not known: none kept (a close
// decided by a gateway before it kept the time), or, with read false,
// Redis failing.
func (g *Gateway) closeAppliedAt(ctx context.Context, req push.Request) (at int64, read bool) {
	cctx, cancel := context.WithTimeout(ctx, g.cfg.WriteTimeout)
	defer cancel()
	at, err := g.store.CloseAppliedAt(cctx, req.UID, req.ID)
	if err != nil {
		g.log.Warn("read when a close stage was applied", "uid", req.UID, "guide_id", req.ID, "err", err)
		return 0, false
	}
	return at, true
}
