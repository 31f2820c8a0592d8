//go:build !linux

package wsread

import (
	"context"
	"errors"
	"net"
	"sync"
)

var errNoEpoll = errors.New("wsread: epoll mode needs Linux")

const epollSupported = false

// poller is the epoll mode's engine. It does not exist here: New refuses
// ModeEpoll and no connection is ever in batch mode, so these are never
// called.
type poller struct{ pongs sync.WaitGroup }

func newPoller(*Server) (*poller, error)    { return nil, errNoEpoll }
func (p *poller) run(context.Context) error { return errNoEpoll }
func (p *poller) close()                    {}
func (p *poller) serve(c *Conn)             { c.h.Closed(net.ErrClosed) }
func (p *poller) dispatch(*Conn)            {}
func (p *poller) deregister(*Conn)          {}
func (p *poller) borrow(*Conn) *readBuf     { return nil }
func (p *poller) giveBack(*Conn, *readBuf)  {}
