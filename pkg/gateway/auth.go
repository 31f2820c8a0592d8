package gateway

import (
	"errors"
	"time"

	"github.com/stillthere/stillthere/pkg/frame"
	"github.com/stillthere/stillthere/pkg/token"
)

// A connection lives as long as its token. When the token expires, the
// gateway closes the connection with frame.CloseTokenExpired (4001),
// unless the client has sent a fresh token for the same user and segment
// in an auth frame first: a browser refreshes its token without
// reconnecting. No renewal is written for a ping that arrives after the
// token expired. "Expired" allows the verifier's leeway for clock skew
// (token.Leeway, 5s) after the token's exp, as the upgrade did.
//
// The expiry is one timer per connection (time.AfterFunc: no goroutine
// until it fires). Only the timer's own callback re-arms it, under mu, so
// the connection's reader never touches it; serve stops it on the way out.

// armExpiry starts the timer for the token's expiry.
func (c *conn) armExpiry() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	c.expiry = time.AfterFunc(time.Until(c.tokenEnd()), c.expiryDue)
}

// tokenEnd is when the connection's token ends, leeway included.
func (c *conn) tokenEnd() time.Time { return time.UnixMilli(c.expiresMS.Load()).Add(token.Leeway) }

// stopExpiry stops the timer; serve calls it once c.closed is set, so the
// timer is not re-armed after.
func (c *conn) stopExpiry() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.expiry != nil {
		c.expiry.Stop()
	}
}

// expiryDue runs when the timer fires: a token refreshed meanwhile moves
// it on, else the connection ends.
func (c *conn) expiryDue() {
	if time.Until(c.tokenEnd()) > 0 {
		c.armExpiry()
		return
	}
	c.expire()
}

// tokenExpired reports whether the connection's token has expired.
func (c *conn) tokenExpired() bool { return !time.Now().Before(c.tokenEnd()) }

// expire closes the connection for its expired token, once. The reader
// ends on the client's close frame, on any other frame (handle checks
// revoked), or at the linger deadline set here, whichever is first.
func (c *conn) expire() {
	if !c.revoked.CompareAndSwap(false, true) {
		return
	}
	metricTokens.WithLabelValues("expired").Inc()
	c.log.Debug("token expired, closing")
	c.closeWith(frame.CloseTokenExpired, "token expired")
	c.ws.NetConn().SetReadDeadline(time.Now().Add(lingerTimeout))
}

// refresh takes the token of an auth frame. It must verify and name the
// connection's user and segment (a client changes segments by
// reconnecting). The connection then lasts until the later of the two
// tokens' expiries. A refused token changes nothing: the client is told,
// and the connection keeps the token it had.
func (c *conn) refresh(raw string) {
	claims, err := c.g.verifier.Verify(raw)
	switch {
	case err != nil:
	case claims.UID != c.uid:
		err = errors.New("token is for another user")
	case claims.Segment != c.segment:
		err = errors.New("token is for another segment; reconnect to change segments")
	}
	if err != nil {
		metricTokens.WithLabelValues("refused").Inc()
		c.enqueue(frame.Error(frame.CodeBadToken, err.Error()))
		return
	}
	exp := claims.Expires.UnixMilli()
	for {
		old := c.expiresMS.Load()
		if exp <= old {
			exp = old
			break
		}
		if c.expiresMS.CompareAndSwap(old, exp) {
			break
		}
	}
	metricTokens.WithLabelValues("refreshed").Inc()
	c.enqueue(frame.AuthOK(exp))
}
