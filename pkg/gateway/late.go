package gateway

import (
	"context"
	"slices"
	"sync"
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
// A close stage is judged again only before anything took it (in the
// push's own route): once routed, another connection may have applied its
// close, and a device connected then is told (see inactive.go). Its
// reminder, judged again on the way, may have been dropped by then on
// this instance; a close must never come before its reminder on a device,
// so the reminders of a silence dropped here are kept for a while
// (lateStages), and go out before its close stage should it still come.

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
		metricPushes.WithLabelValues("came_back").Inc()
		return true
	}
	req.CheckedMS = now
	return false
}

// lateStages are the reminders this instance dropped as came back, by
// silence (user and deadline), until a later stage of that silence takes
// them or keepFor has passed.
type lateStages struct {
	keepFor time.Duration
	mu      sync.Mutex
	m       map[silenceKey][]lateStage
}

type silenceKey struct {
	uid        string
	deadlineMS int64
}

type lateStage struct {
	req push.Request
	at  time.Time
}

func newLateStages(keepFor time.Duration) *lateStages {
	return &lateStages{keepFor: keepFor, m: map[silenceKey][]lateStage{}}
}

// dropped keeps req, a reminder dropped as came back, and forgets those
// kept longer than keepFor.
func (l *lateStages) dropped(req push.Request) {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	for k, v := range l.m {
		if now.Sub(v[len(v)-1].at) > l.keepFor {
			delete(l.m, k)
		}
	}
	k := silenceKey{req.UID, req.DeadlineMS}
	if !slices.ContainsFunc(l.m[k], func(s lateStage) bool { return s.req.ID == req.ID }) {
		l.m[k] = append(l.m[k], lateStage{req: req, at: now})
	}
}

// laterStage returns the kept reminders of req's silence, oldest stage
// first, when req is its close stage, and forgets them: they go out
// before it.
func (l *lateStages) laterStage(req push.Request) []push.Request {
	if !req.Final || req.DeadlineMS <= 0 {
		return nil
	}
	l.mu.Lock()
	k := silenceKey{req.UID, req.DeadlineMS}
	kept := l.m[k]
	delete(l.m, k)
	l.mu.Unlock()
	out := make([]push.Request, 0, len(kept))
	for _, s := range kept {
		if s.req.Stage < req.Stage {
			out = append(out, s.req)
		}
	}
	slices.SortFunc(out, func(a, b push.Request) int { return a.Stage - b.Stage })
	return out
}
