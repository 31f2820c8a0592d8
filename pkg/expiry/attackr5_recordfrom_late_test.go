package expiry

import (
	"bytes"
	"context"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/gateway"
	"github.com/stillthere/stillthere/pkg/session"
)

// TestAttackR5RecordFromLateAnswer: the fix of the round before. A
// restoring resync records the outage it follows as a blind interval of
// its instance, from the outage's start (lapseFrom) to now, so that a
// lapsed grant restored at its own deadline, at or after that start, is
// held for the grace. recordFrom measures the outage's length on the local
// clock (time.Since(from)) and only then asks Redis for its time
// (RecordBlindFor, as it was: TIME, start = Redis's now less that length): however
// long the answer takes is cut off the start of the interval, while the
// lapsed deadline, written by the resync's own script, is not moved. The
// answer may well be slower than the resync's: TIME waits on the control
// connection (one, shared with the heartbeat), and on a cluster goes to
// any master, not the bucket's. Here every TIME on gateway A's link is
// answered 0.9 s late: the interval starts 0.9 s after the outage did,
// after the deadline of device 1's grant, which ran out a quarter second
// into the outage. Nothing else holds that deadline (the scenario of
// TestAttackR4LapsedRestoreHeldForTheOtherDevice: both gateways cut off,
// Redis restarted empty, gateway A back first; A's heartbeat is the
// default 1 s, so 0.9 s late is no missed beat), and the user is guided
// at once while device 2 pings gateway B, still cut off.
func TestAttackR5RecordFromLateAnswer(t *testing.T) {
	h := newHarness(t)
	const (
		ttl  = 2 * time.Second
		beat = time.Second // gateway A's heartbeat interval, the default: a lease of 3 s
		late = 900 * time.Millisecond
	)
	pa, pb := h.redisProxy(), h.redisProxy()
	slow := startTimeDelay(t, pa.Addr()) // A's link: Redis's answer to a TIME, once armed, is late
	gwA := h.startAttackGateway(slow.addr(), ttl, func(c *gateway.Config) { c.HeartbeatInterval = beat })
	ctx := context.Background()
	alive := h.store.Keyspace().AliveKey()
	// A's heartbeat, by the lease it asks for (B's is 300 ms).
	var instA string
	lastBeat := func() int64 {
		v, err := h.rdb.HGet(ctx, alive, instA).Result()
		if err != nil {
			return 0
		}
		last, _, _ := strings.Cut(v, ":")
		ms, _ := strconv.ParseInt(last, 10, 64)
		return ms
	}
	waitFor(t, waitLong, "gateway A's first heartbeat", func() bool {
		all, err := h.rdb.HGetAll(ctx, alive).Result()
		if err != nil {
			return false
		}
		for inst, v := range all {
			if strings.HasSuffix(v, ":"+strconv.FormatInt((3*beat).Milliseconds(), 10)) {
				instA = inst
				return true
			}
		}
		return false
	})
	nextBeat := func() int64 {
		was := lastBeat()
		var now int64
		waitFor(t, waitLong, "gateway A's next heartbeat", func() bool { now = lastBeat(); return now != was })
		return now
	}
	gwB := h.startAttackGateway(pb.Addr(), ttl, nil)
	stop := h.start(h.config(ModeSweep))
	defer stop()

	const uid = "two-devices-late-time"
	// Device 1 pings a quarter second after one of A's heartbeats: its
	// grant runs out a quarter second after the second heartbeat from
	// then, the first to fail below, whose sending starts the outage as A
	// tells it (lapseFrom).
	nextBeat()
	// Real time must pass: the gateway's heartbeats run on the clock, and
	// the ping is placed a quarter second after one; no state to wait on.
	time.Sleep(250 * time.Millisecond)
	d1 := time.Now().Add(ttl) // device 1's deadline, a moment early
	silent := startPinger(t, gwA, uid, 0)
	waitPongs(t, 1, silent)
	pinging := startPinger(t, gwB, uid, ttl/5)
	waitPongs(t, 2, pinging)
	nextBeat() // the heartbeat before device 1's deadline: the last to get through
	pa.Cut()
	pb.Cut()
	h.untilRedis(d1.Add(500 * time.Millisecond))
	if err := h.rdb.FlushAll(ctx).Err(); err != nil { // Redis restarted empty
		t.Fatal(err)
	}
	blind := h.store.Keyspace().BlindKey()
	waitFor(t, waitLong, "the listener to record the data loss", func() bool {
		n, err := h.rdb.ZCard(ctx, blind).Result()
		return err == nil && n > 0
	})

	slow.arm(late)
	pa.Restore()
	// The restore is in the index until the listener holds it (the hold
	// set), which may be before this looks: on a busy host it was found
	// only once the hold released it, past the grace, and the guide then
	// was taken for one within it (as TestAttackR4LapsedRestoreHeldForTheOtherDevice).
	waitFor(t, waitLong, "gateway A's resync to restore device 1's lapsed grant", func() bool { return h.inIndex(uid) || h.inHold(uid) })
	restored := time.Now()
	if !slow.fired() {
		t.Fatal("no TIME went through A's link: the case tells nothing")
	}
	var recorded []session.BlindInterval
	for _, b := range h.blindList(ctx) {
		if b.Reason == session.BlindGateway {
			recorded = append(recorded, b)
		}
	}
	if eventually(testGrace/2, func() bool { return len(byUID(h.events())[uid]) > 0 }) {
		t.Errorf("guided %v after gateway A's resync restored device 1's lapsed grant (deadline %v), while device 2 pinged gateway B (still cut off): the outage A recorded, %+v, starts after that deadline",
			time.Since(restored).Round(10*time.Millisecond), d1.Format("15:04:05.000"), recorded)
	}
	slow.disarm()
	pb.Restore()
	waitFor(t, waitLong, "gateway B's resync to restore device 2's grant", func() bool {
		v, err := h.rdb.ZScore(ctx, h.store.Keyspace().IndexKey(session.Bucket(uid)), uid).Result()
		return err == nil && time.UnixMilli(int64(v)).After(h.redisNow())
	})
}

// timeDelay forwards TCP connections to target and, while armed, holds
// each TIME command it sees (go-redis writes it as "*1\r\n$4\r\ntime\r\n")
// for the armed delay before passing it on: Redis answers it that late,
// and what follows it on its connection. Nothing else is delayed.
type timeDelay struct {
	ln     net.Listener
	target string
	delay  atomic.Int64 // ns; 0: not armed
	hit    atomic.Bool
	mu     sync.Mutex
	conns  []net.Conn
	wg     sync.WaitGroup
}

var timeCommand = []byte("*1\r\n$4\r\ntime\r\n")

func startTimeDelay(t *testing.T, target string) *timeDelay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d := &timeDelay{ln: ln, target: target}
	d.wg.Add(1)
	go d.accept()
	t.Cleanup(d.close)
	return d
}

func (d *timeDelay) addr() string { return d.ln.Addr().String() }

func (d *timeDelay) arm(delay time.Duration) { d.delay.Store(int64(delay)) }

func (d *timeDelay) disarm() { d.delay.Store(0) }

func (d *timeDelay) fired() bool { return d.hit.Load() }

func (d *timeDelay) accept() {
	defer d.wg.Done()
	for {
		c, err := d.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", d.target)
		if err != nil {
			c.Close()
			continue
		}
		d.mu.Lock()
		d.conns = append(d.conns, c, s)
		d.mu.Unlock()
		d.wg.Add(2)
		go func() { // Redis to the client, as it comes
			defer d.wg.Done()
			io.Copy(c, s)
			c.Close()
			s.Close()
		}()
		go func() { // the client to Redis, a TIME held once armed
			defer d.wg.Done()
			defer c.Close()
			defer s.Close()
			buf := make([]byte, 64<<10)
			for {
				n, err := c.Read(buf)
				if n > 0 {
					if bytes.Contains(buf[:n], timeCommand) {
						if delay := d.delay.Load(); delay > 0 {
							d.hit.Store(true)
							// Real time must pass: Redis's late answer is the
							// fault itself, to a real gateway process.
							time.Sleep(time.Duration(delay))
						}
					}
					if _, werr := s.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
	}
}

func (d *timeDelay) close() {
	d.ln.Close()
	d.mu.Lock()
	for _, c := range d.conns {
		c.Close()
	}
	d.mu.Unlock()
	d.wg.Wait()
}
