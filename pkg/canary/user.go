package canary

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/gorilla/websocket"

	"github.com/stillthere/stillthere/pkg/activity"
	"github.com/stillthere/stillthere/pkg/chatsim"
	"github.com/stillthere/stillthere/pkg/frame"
	"github.com/stillthere/stillthere/pkg/promise"
	"github.com/stillthere/stillthere/pkg/token"
)

// Ways a user signals, and outcomes of a signal, as metric labels.
const (
	viaPing     = "ping"
	viaActivity = "activity"

	outcomeAnswered = "answered"
	outcomeRefused  = "refused"
	outcomeNoAnswer = "no_answer"
	outcomeRejected = "rejected"
)

// sink names the one device of a canary user in its deliveries.
const sink = "canary-device"

// role is what one synthetic user does.
type role struct {
	name   string // in its uids: stay, leave, feed-stay, feed-leave
	via    string // viaPing or viaActivity
	leaves bool
	n      int // which of its role
}

// users are the synthetic users cfg asks for.
func (c *Canary) users() []role {
	var out []role
	for _, r := range []struct {
		role
		count int
	}{
		{role{name: "stay", via: viaPing}, c.cfg.Stayers},
		{role{name: "leave", via: viaPing, leaves: true}, c.cfg.Leavers},
		{role{name: "feed-stay", via: viaActivity}, c.cfg.FeedStayers},
		{role{name: "feed-leave", via: viaActivity, leaves: true}, c.cfg.FeedLeavers},
	} {
		for n := range r.count {
			u := r.role
			u.n = n
			out = append(out, u)
		}
	}
	return out
}

// runUser runs a user's cycles, each as a new uid, until ctx is done. A
// cycle that could not connect waits a ping period before the next.
func (c *Canary) runUser(ctx context.Context, r role, start time.Duration) {
	if !sleep(ctx, start) {
		return
	}
	for cycle := 0; ctx.Err() == nil; cycle++ {
		uid := fmt.Sprintf("%s-%s-%s-%d-%d", c.cfg.UIDPrefix, c.run, r.name, r.n, cycle)
		if err := c.cycle(ctx, r, uid); err != nil {
			c.log.Warn("canary: cycle failed", "uid", uid, "err", err)
			if !sleep(ctx, c.cfg.pingEvery()) {
				return
			}
		}
	}
}

// cycle is one life of a user: connect, be there, and (a leaver) go
// silent and take the stages, or (a stayer) leave after StayFor. Its
// history ends when its connection does.
func (c *Canary) cycle(ctx context.Context, r role, uid string) error {
	tok, err := token.MintFor([]byte(c.cfg.TokenSecret), uid, c.cfg.Segment, c.cfg.tokenLife(),
		token.Issued{Issuer: c.cfg.TokenIssuer, Audience: c.cfg.TokenAudience})
	if err != nil {
		return err
	}
	var readers sync.WaitGroup
	u := &chatsim.User{UID: uid, Token: tok, TTL: c.cfg.TTL, Jitter: c.cfg.Jitter, Readers: &readers,
		Dialer: &websocket.Dialer{HandshakeTimeout: c.cfg.AnswerTimeout}}
	conn, err := u.Connect(ctx, c.cfg.URL)
	if err != nil {
		dialsTotal.WithLabelValues("failed").Inc()
		return fmt.Errorf("connect: %w", err)
	}
	dialsTotal.WithLabelValues("ok").Inc()
	s := &session{c: c, r: r, uid: uid, conn: conn}
	// A stop cuts the connection, which ends any wait on it.
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer func() {
		stop()
		conn.Close() // no-op when it ended already
		readers.Wait()
		s.drain()
		c.rec.end(uid, time.Now())
	}()
	if r.leaves {
		s.leave(ctx)
	} else {
		s.stay(ctx)
	}
	return s.err
}

// session is one cycle's connection, owned by the user's goroutine.
type session struct {
	c    *Canary
	r    role
	uid  string
	conn *chatsim.Conn
	// err is what cut the cycle short on the canary's side: an activity
	// call rejected.
	err error
	// warnedTTL: a pong's TTL that the canary was not told was logged.
	warnedTTL bool
}

// stay signals every ping period for StayFor, then leaves with a normal
// close, which ends the session.
func (s *session) stay(ctx context.Context) {
	until := time.Now().Add(s.c.cfg.StayFor)
	for time.Now().Before(until) {
		if !s.signal(ctx) {
			return
		}
		s.drain()
		if !s.wait(ctx, s.c.cfg.pingEvery()) {
			return
		}
	}
	s.conn.Leave(s.c.cfg.AnswerTimeout)
}

// leave signals LeavePings times, then goes silent with the connection
// open and takes the silence's stages, until the last (a close stage
// ends the connection), or the cycle's time is up.
func (s *session) leave(ctx context.Context) {
	end := time.Now().Add(s.c.cfg.cycleTimeout())
	for i := range s.c.cfg.LeavePings {
		if !s.signal(ctx) {
			return
		}
		s.drain()
		if i < s.c.cfg.LeavePings-1 && !s.wait(ctx, s.c.cfg.pingEvery()) {
			return
		}
	}
	silencesTotal.WithLabelValues(s.r.via).Inc()
	last := len(s.c.cfg.StageDelays) + 1
	for ctx.Err() == nil {
		f, err := s.conn.Next(time.Until(end))
		if err != nil {
			return // the gateway closed it (after a close stage), or time is up
		}
		if f.Type != frame.TypeGuide {
			continue
		}
		s.guide(f)
		if f.Stage >= last && !f.Final {
			// The last stage, a reminder: the connection stays, so wait
			// a slack for a repeat before leaving.
			s.wait(ctx, s.c.cfg.Slack)
			s.conn.Leave(s.c.cfg.AnswerTimeout)
			return
		}
	}
}

// wait waits d, or until ctx is done or the connection ends; it reports
// whether the connection may go on.
func (s *session) wait(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-s.conn.Gone():
		return false
	case <-t.C:
		return true
	}
}

// drain records the frames the connection kept since the last drain.
func (s *session) drain() {
	for {
		f, err := s.conn.Next(0)
		if err != nil {
			return
		}
		if f.Type == frame.TypeGuide {
			s.guide(f)
		}
	}
}

// guide records a guide frame as a delivery, and acks it as a client
// does.
func (s *session) guide(f chatsim.Frame) {
	role := "stayer"
	if s.r.leaves {
		role = "leaver"
	}
	guidesTotal.WithLabelValues(role).Inc()
	d := promise.Delivery{UID: s.uid, ID: f.ID, Stage: max(f.Stage, 1), At: f.At, Sink: sink}
	if f.DeadlineMS > 0 {
		d.Deadline = time.UnixMilli(f.DeadlineMS).Add(-time.Duration(s.c.redisAhead.Load()))
	}
	s.c.rec.delivery(d)
	s.conn.Ack(f.ID) // a failed write shows as the connection's end
}

// signal sends one signal the user's way and records it with its
// outcome. It reports whether the cycle may go on.
func (s *session) signal(ctx context.Context) bool {
	if s.r.via == viaActivity {
		return s.active(ctx)
	}
	cfg := s.c.cfg
	sent := time.Now()
	a, err := s.conn.PingWait(cfg.AnswerTimeout)
	sig := promise.Signal{UID: s.uid, Kind: promise.Ping, Sent: sent}
	outcome := outcomeAnswered
	switch {
	case err != nil:
		// It may or may not have renewed: the most it would have set.
		sig.Outcome, sig.Deadline, outcome = promise.NoAnswer, sent.Add(cfg.TTL+cfg.Jitter), outcomeNoAnswer
	case a.Unavailable:
		sig.Outcome, sig.Deadline, outcome = promise.Refused, sent.Add(cfg.TTL), outcomeRefused
	default:
		sig.Sent, sig.Answered, sig.Outcome, sig.Deadline = a.Sent, a.At, promise.Answered, a.Deadline
		switch {
		case sig.Deadline.IsZero():
			sig.Deadline = a.Low()
		case a.TTL > 0:
			if !cfg.grants(a.TTL) {
				ttlMismatches.Inc()
			}
			if !cfg.grants(a.TTL) && !s.warnedTTL {
				s.warnedTTL = true // once a cycle
				s.c.log.Warn("canary: the canary segment's policy grants another TTL than canary-ttl (and canary-jitter): set them alike",
					"granted", a.TTL, "canary_ttl", cfg.TTL, "canary_jitter", cfg.Jitter, "segment", cfg.Segment)
			}
			// The deadline is by Redis's clock: judged by ours, as
			// early as the round trip allows (a.Low()).
			ahead := redisAhead(a)
			s.c.setRedisAhead(ahead)
			sig.Deadline = a.Deadline.Add(-ahead)
		}
	}
	signalsTotal.WithLabelValues(viaPing, outcome).Inc()
	s.c.rec.signal(sig)
	return !errors.Is(err, chatsim.ErrGone)
}

// active reports the user active through the activity API and records
// it: a 200 is answered (the deadline is at least the TTL past the send:
// the jitter's share is not told), a 503 refused, no answer or any other
// 5xx without an answer. A 4xx is the canary's configuration at fault (its
// activity secret, say): it is counted and not recorded, and it ends the
// cycle, whose error runUser logs before it waits to start over. Were
// the cycle to go on, the service, which never heard from the user, would
// rightly guide it, and the guide, for no silence the history holds,
// would be judged false: a page for the canary's own fault.
func (s *session) active(ctx context.Context) bool {
	cfg := s.c.cfg
	sent := time.Now()
	body, err := json.Marshal(map[string][]activity.Event{"events": {{
		UID: s.uid, Kind: activity.Active, Seg: cfg.Segment, AtMS: sent.UnixMilli(),
	}}})
	if err != nil {
		panic(err) // a fixed shape of strings and ints
	}
	status, err := s.c.post(ctx, body)
	sig := promise.Signal{UID: s.uid, Kind: promise.Ping, Sent: sent}
	var outcome string
	switch {
	case ctx.Err() != nil:
		return false
	case err == nil && status == http.StatusOK:
		sig.Outcome, sig.Deadline, sig.Answered, outcome = promise.Answered, sent.Add(cfg.TTL), time.Now(), outcomeAnswered
	case err == nil && status == http.StatusServiceUnavailable:
		sig.Outcome, sig.Deadline, outcome = promise.Refused, sent.Add(cfg.TTL), outcomeRefused
	case err == nil && status/100 == 4:
		signalsTotal.WithLabelValues(viaActivity, outcomeRejected).Inc()
		s.err = fmt.Errorf("activity call rejected with HTTP %d: the canary's activity secret or URL", status)
		return false
	default:
		sig.Outcome, sig.Deadline, outcome = promise.NoAnswer, sent.Add(cfg.TTL+cfg.Jitter), outcomeNoAnswer
	}
	signalsTotal.WithLabelValues(viaActivity, outcome).Inc()
	s.c.rec.signal(sig)
	return true
}

// post sends an activity batch and returns the answer's status.
func (c *Canary) post(ctx context.Context, body []byte) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.cfg.ActivityURL, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+c.cfg.ActivitySecret)
	resp, err := c.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	return resp.StatusCode, nil
}

// redisAhead is how far Redis's clock, which names every deadline the
// service grants and guides, is ahead of the canary's (behind, when
// negative), as a pong bounds it: the renewal it answers happened at its
// deadline less its TTL by Redis's clock, and somewhere between the
// ping's send and the pong's arrival by ours, so Redis is ahead by at
// most that renewal time less the send. The canary takes that most: a
// deadline taken into its clock by it is the earliest the pong allows
// (chatsim.Answer.Low), never later than it was, whatever the round trip.
// Taking any less (the renewal at the pong's arrival, or no skew at all
// within the trip) puts the deadline later than it was by as much as the
// pong's way back: on a busy node a guide on time by Redis's clock comes
// "before its deadline", and the close it brings ends the history before
// that deadline too, so that the guide is for no silence: false both
// ways, a page for a service that kept its promise. The price is the
// other way and bounded: a guide judged later than it came by at most the
// ping's way in (under the answer timeout), within the slack, or at worst
// late, which burns the budget and pages no one.
// Without it a skew of a second or more between the canary's node and
// Redis's makes guides on time by Redis's clock look early (false) or
// late.
func redisAhead(a chatsim.Answer) time.Duration {
	return a.Deadline.Add(-a.TTL).Sub(a.Sent)
}

// sleep waits d or until ctx is done; it reports whether ctx is still on.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
