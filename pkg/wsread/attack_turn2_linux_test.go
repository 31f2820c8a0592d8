//go:build linux

package wsread

import (
	"bytes"
	"fmt"
	"sync"
	"testing"
	"time"
)

// flood has a client write small messages on c without a pause until stop
// is closed, so that its socket holds more than one turn reads whenever
// the connection is re-armed.
func flood(t *testing.T, c *rawClient, stop <-chan struct{}, wg *sync.WaitGroup) {
	var chunk bytes.Buffer
	for chunk.Len() < 64<<10 {
		chunk.Write(masked(opText, true, "flood"))
	}
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := c.nc.Write(chunk.Bytes()); err != nil {
				return // the server went away: the test reports it
			}
		}
	})
}

// TestAttackPutBackStarves: two connections stream messages (each handle
// reads a bounded part of what their sockets hold, so each is ready again
// as soon as it is re-armed) and a third sends one ping. A worker that
// takes two events handles the first and puts the second back; putting
// it back (EPOLL_CTL_MOD) queues it behind every event ready meanwhile,
// and the first is re-armed behind it once handled. With the ready list
// [x, ping, y] the next take is (x, ping): ping goes to the tail behind
// y, x is re-armed behind ping: [y, ping, x], and so on: the ping stays
// second forever and is put back on every turn while the other two are
// read turn after turn. With more workers and more streams the ready
// list is reshuffled the same way, and a ping put back lands behind the
// streams again and again. A ping that waits for the streams to end is
// a session that expires while its client pings. The ping must be read
// while the others stream: a fair turn reads it within a few handles of
// the streams, milliseconds; the bound is far above that, for a busy
// machine, as a ping put back waits for as long as the streams last.
func TestAttackPutBackStarves(t *testing.T) {
	for _, tc := range []struct{ workers, streams int }{{1, 2}, {2, 5}, {4, 9}} {
		workers := tc.workers
		t.Run(fmt.Sprint(workers, " workers, ", tc.streams, " streams"), func(t *testing.T) {
			ts := startServer(t, Config{Mode: ModeEpoll, Workers: workers, ReadLimit: 4096}, nil)
			stop := make(chan struct{})
			var wg sync.WaitGroup
			defer func() { close(stop); wg.Wait() }()
			var floods []*recorder
			for range tc.streams {
				c := dialRaw(t, ts.url, nil)
				floods = append(floods, ts.next(t))
				flood(t, c, stop, &wg)
			}
			pinger := dialRaw(t, ts.url, nil)
			pr := ts.next(t)
			waitFor(t, "registration", func() bool { pr.c.mu.Lock(); defer pr.c.mu.Unlock(); return pr.c.registered })
			for _, r := range floods {
				waitFor(t, "both streams read", func() bool { return len(r.messages()) > 1000 })
			}
			const rounds = 20
			for i := range rounds {
				pinger.write(t, masked(opText, true, fmt.Sprint("ping", i)))
				sent := time.Now()
				if !holdsWithin(10*time.Second, func() bool { return len(pr.messages()) > i }) {
					t.Errorf("round %d: a ping not read within 10s while %d other connections stream (%d and %d of their messages read)",
						i, len(floods), len(floods[0].messages()), len(floods[1].messages()))
					// Not lost: read once the streams stop.
					close(stop)
					wg.Wait()
					stop = make(chan struct{})
					waitFor(t, "the ping once the streams stopped", func() bool { return len(pr.messages()) > i })
					t.Logf("round %d: read %v after it was sent, once the streams stopped", i, time.Since(sent))
					return
				}
			}
		})
	}
}
