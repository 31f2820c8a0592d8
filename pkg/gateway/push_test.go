package gateway

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/redis/go-redis/v9"

	"github.com/stillthere/stillthere/pkg/push"
	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/token"
)

// pushGuide calls tg's push endpoint the way the guide consumer does:
// through the contract's own client.
func (tg *testGateway) pushGuide(t *testing.T, req push.Request) (push.Response, error) {
	t.Helper()
	c := push.NewClient("http://"+tg.PushAddr().String()+push.Path, pushSecret, &http.Client{Timeout: 15 * time.Second})
	return c.Push(context.Background(), req)
}

// mustPush pushes req and wants it settled with status.
func (tg *testGateway) mustPush(t *testing.T, req push.Request, status push.Status) push.Response {
	t.Helper()
	res, err := tg.pushGuide(t, req)
	if err != nil || res.Status != status {
		t.Fatalf("push %s to %s: %+v, %v; want %s", req.ID, req.UID, res, err, status)
	}
	return res
}

// redisNowMS is Redis's clock, which deadlines are written by.
func redisNowMS(t *testing.T, rdb redis.UniversalClient) int64 {
	t.Helper()
	now, err := rdb.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return now.UnixMilli()
}

// readGuide reads the next frame and wants it to be guide id.
func readGuide(t *testing.T, ws *websocket.Conn, id string) map[string]any {
	t.Helper()
	m := readJSON(t, ws)
	if m["type"] != "guide" || m["id"] != id {
		t.Fatalf("got %v, want guide %s", m, id)
	}
	return m
}

func TestPushContract(t *testing.T) {
	tg := startGateway(t, func(c *Config) { c.GuideMaxAge = time.Minute })
	ctx := context.Background()
	ks := tg.store.Keyspace()

	t.Run("claimed but not done answers retry, never duplicate", func(t *testing.T) {
		// Another push of the id is under way (or its gateway died with
		// it): its outcome is not known yet.
		tg.rdb.Set(ctx, ks.DeliveredKey("hana", "h1"), "c:another-push", claimTTL)
		req := push.Request{ID: "h1", UID: "hana", Text: "Still there?"}
		_, err := tg.pushGuide(t, req)
		var e *push.Error
		if !errors.As(err, &e) || e.Status != push.Retry || e.Code != http.StatusConflict || e.RetryAfter < time.Second {
			t.Fatalf("push of a claimed id: %v; want retry, 409, with Retry-After", err)
		}
		if push.IsRejected(err) {
			t.Fatal("a claimed id was rejected")
		}
		// The other push gave up and released it: the retry goes through.
		tg.rdb.Del(ctx, ks.DeliveredKey("hana", "h1"))
		tg.mustPush(t, req, push.Queued)
		tg.mustPush(t, req, push.Duplicate)
	})
	t.Run("ids are scoped by uid", func(t *testing.T) {
		a, b := sameBucketUIDs()
		for _, uid := range []string{a, b} {
			tg.mustPush(t, push.Request{ID: "same-id", UID: uid, Text: "t"}, push.Queued)
		}
		for _, uid := range []string{a, b} {
			tg.mustPush(t, push.Request{ID: "same-id", UID: uid, Text: "t"}, push.Duplicate)
		}
	})
	t.Run("unknown fields are ignored", func(t *testing.T) {
		code, out := tg.push(t, pushSecret, map[string]any{"id": "u1", "uid": "ivan", "text": "t", "priority": "high"})
		if code != http.StatusOK || out["status"] != "queued" {
			t.Fatalf("push with a field from a newer consumer: %d %v, want 200 queued", code, out)
		}
	})
	t.Run("stale when the user renewed after the deadline", func(t *testing.T) {
		deadline := redisNowMS(t, tg.rdb) - 1000
		if _, err := tg.store.Renew(ctx, "jo", "default", time.Minute, session.ClockPresence); err != nil {
			t.Fatal(err)
		}
		tg.mustPush(t, push.Request{ID: "j1", UID: "jo", Text: "t", DeadlineMS: deadline}, push.Stale)
		// Without a deadline (an older consumer) it cannot tell.
		tg.mustPush(t, push.Request{ID: "j2", UID: "jo", Text: "t"}, push.Queued)
	})
	t.Run("too old for the inbox", func(t *testing.T) {
		deadline := redisNowMS(t, tg.rdb) - time.Minute.Milliseconds() - 1000
		tg.mustPush(t, push.Request{ID: "k1", UID: "kai", Text: "t", DeadlineMS: deadline}, push.TooOld)
		if n, _ := tg.rdb.LLen(ctx, ks.InboxKey("kai")).Result(); n != 0 {
			t.Fatalf("a too old guide was kept: inbox of %d", n)
		}
		// Delivered to a connection, it is not too old: the consumer
		// counts its max age from when the timeout was confirmed.
		ws := tg.dial(t, "kai")
		tg.mustPush(t, push.Request{ID: "k2", UID: "kai", Text: "t", DeadlineMS: deadline}, push.Delivered)
		readGuide(t, ws, "k2")
	})
	t.Run("an older gateway's inbox entry is handed over", func(t *testing.T) {
		tg.rdb.LPush(ctx, ks.InboxKey("lea"), `{"id":"old-1","uid":"lea","text":"Are you still there?"}`)
		ws := tg.dial(t, "lea")
		if m := readGuide(t, ws, "old-1"); m["deadline_ms"] != nil {
			t.Fatalf("guide without a known deadline carries one: %v", m)
		}
		// Reading on answers the ping sent after the guide: the proof
		// that it got there, which takes it out of the inbox.
		pingPong(t, ws)
		waitUntil(t, "the entry leaves the inbox", func() bool { return tg.rdb.LLen(ctx, ks.InboxKey("lea")).Val() == 0 })
	})
}

// sameBucketUIDs returns two uids that share a bucket, so their keys share
// a hash tag: scoping by bucket alone would mix them up.
func sameBucketUIDs() (string, string) {
	for i := 1; ; i++ {
		b := "user-" + strconv.Itoa(i)
		if session.Bucket(b) == session.Bucket("user-0") {
			return "user-0", b
		}
	}
}

// TestInboxKeptUntilWritten: a connection that drops before its inbox
// guides are written leaves them for the next connect (issue case 7).
func TestInboxKeptUntilWritten(t *testing.T) {
	pl := newPipeListener()
	tg := startGatewayHooked(t, []string{redistest.Start(t).Addr}, redistest.Prefix(t),
		slog.New(slog.NewTextHandler(io.Discard, nil)), nil,
		func(g *Gateway) { g.publicLn.Close(); g.publicLn = pl })
	ctx := context.Background()
	ks := tg.store.Keyspace()
	for i := range 3 {
		tg.mustPush(t, push.Request{ID: "m" + strconv.Itoa(i), UID: "mia", Text: "t"}, push.Queued)
	}

	// Over a pipe a write completes only when the client reads all of it:
	// this client drops in the middle of the first guide.
	nc := pl.dial(t, "mia").NetConn()
	if _, err := nc.Read(make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	nc.Close()
	waitUntil(t, "the gateway lets the connection go", func() bool {
		return len(tg.hub.lookup("mia")) == 0 && tg.rdb.HLen(ctx, ks.InboxLeaseKey("mia")).Val() == 0
	})
	if n := tg.rdb.LLen(ctx, ks.InboxKey("mia")).Val(); n != 3 {
		t.Fatalf("inbox holds %d guides after a connection that wrote none, want 3", n)
	}

	ws := pl.dial(t, "mia")
	for i := range 3 {
		readGuide(t, ws, "m"+strconv.Itoa(i))
	}
	pingPong(t, ws)
	waitUntil(t, "written guides leave the inbox", func() bool { return tg.rdb.LLen(ctx, ks.InboxKey("mia")).Val() == 0 })
}

// TestInboxLargerThanSendQueue: the handover is bounded by the send queue,
// so a large inbox does not cut its client off (issue case 7).
func TestInboxLargerThanSendQueue(t *testing.T) {
	tg := startGateway(t, func(c *Config) {
		c.SendQueue = 4
		c.InboxSize = 20
	})
	for i := range 20 {
		tg.mustPush(t, push.Request{ID: "n" + strconv.Itoa(i), UID: "noa", Text: "t"}, push.Queued)
	}
	ws := tg.dial(t, "noa")
	for i := range 20 {
		readGuide(t, ws, "n"+strconv.Itoa(i))
	}
	pingPong(t, ws)
	waitUntil(t, "the inbox empties", func() bool {
		return tg.rdb.LLen(context.Background(), tg.store.Keyspace().InboxKey("noa")).Val() == 0
	})
}

// TestInboxMaxAgeAndStale: inbox guides are not handed over past the
// guide max age counted from their deadline, nor once their user renewed
// after their deadline; those handed over carry their deadline (issue
// case 8). Each part starts with guides as an older consumer sends them,
// without a deadline: then both count from when the guide was kept.
func TestInboxMaxAgeAndStale(t *testing.T) {
	tg := startGateway(t, func(c *Config) { c.GuideMaxAge = 2 * time.Second })
	ctx := context.Background()
	// nextMS waits for Redis's clock, the one guides are kept and
	// renewals made by, to tick past the millisecond it is in.
	nextMS := func() {
		t.Helper()
		from := redisNowMS(t, tg.rdb)
		waitUntil(t, "Redis's next millisecond", func() bool { return redisNowMS(t, tg.rdb) > from })
	}
	renew := func(uid string) {
		t.Helper()
		nextMS() // after what was kept before
		if _, err := tg.store.Renew(ctx, uid, "default", time.Minute, session.ClockPresence); err != nil {
			t.Fatal(err)
		}
		nextMS() // what is kept next is kept later
	}

	t.Run("max age", func(t *testing.T) {
		tg.mustPush(t, push.Request{ID: "o-undated-old", UID: "olga", Text: "t"}, push.Queued)
		if pttl := tg.rdb.PTTL(ctx, tg.store.Keyspace().InboxKey("olga")).Val(); pttl <= 0 || pttl > 2*time.Second {
			t.Errorf("inbox TTL %v, want within the max age", pttl)
		}
		// Real time must pass: the guide's max age runs out as its inbox
		// key's TTL does, by Redis's clock.
		waitUntil(t, "olga's inbox to run out", func() bool {
			return tg.rdb.Exists(ctx, tg.store.Keyspace().InboxKey("olga")).Val() == 0
		})
		tg.mustPush(t, push.Request{ID: "o-undated-new", UID: "olga", Text: "t"}, push.Queued)
		ws := tg.dial(t, "olga")
		if m := readGuide(t, ws, "o-undated-new"); m["deadline_ms"] != nil {
			t.Errorf("guide frame %v carries a deadline nobody gave", m)
		}
		pingPong(t, ws)

		now := redisNowMS(t, tg.rdb)
		tg.mustPush(t, push.Request{ID: "o-old", UID: "olav", Text: "t", DeadlineMS: now - 1500}, push.Queued)
		tg.mustPush(t, push.Request{ID: "o-new", UID: "olav", Text: "t", DeadlineMS: now}, push.Queued)
		waitUntil(t, "o-old past its max age", func() bool { return redisNowMS(t, tg.rdb) > now+500 })
		ws = tg.dial(t, "olav")
		if m := readGuide(t, ws, "o-new"); m["deadline_ms"] != float64(now) {
			t.Errorf("guide frame %v, want deadline_ms %d", m, now)
		}
		pingPong(t, ws)
	})
	t.Run("stale", func(t *testing.T) {
		tg.mustPush(t, push.Request{ID: "p-undated", UID: "pia", Text: "t"}, push.Queued)
		// The user renews on a device of theirs: that silence is over.
		renew("pia")
		tg.mustPush(t, push.Request{ID: "p-undated-later", UID: "pia", Text: "t"}, push.Queued)
		ws := tg.dial(t, "pia")
		readGuide(t, ws, "p-undated-later")
		pingPong(t, ws)

		tg.mustPush(t, push.Request{ID: "q-stale", UID: "quinn", Text: "t", DeadlineMS: redisNowMS(t, tg.rdb) - 100}, push.Queued)
		renew("quinn")
		tg.mustPush(t, push.Request{ID: "q-later", UID: "quinn", Text: "t", DeadlineMS: redisNowMS(t, tg.rdb)}, push.Queued)
		ws = tg.dial(t, "quinn")
		readGuide(t, ws, "q-later")
		pingPong(t, ws)
		waitUntil(t, "the stale guide leaves the inbox", func() bool {
			return tg.rdb.LLen(ctx, tg.store.Keyspace().InboxKey("quinn")).Val() == 0
		})
	})
}

// pipeListener hands the gateway the server ends of in-memory pipes. A
// write to a pipe completes only when the other end reads it, so a test
// controls exactly what counts as written to a socket.
type pipeListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return pipeAddr{} }

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "pipe" }

// dial connects uid over a pipe.
func (l *pipeListener) dial(t *testing.T, uid string) *websocket.Conn {
	t.Helper()
	tok, err := token.Mint([]byte(tokenSecret), uid, "", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	d := websocket.Dialer{
		HandshakeTimeout: 5 * time.Second,
		NetDial: func(string, string) (net.Conn, error) {
			server, client := net.Pipe()
			select {
			case l.conns <- server:
				return client, nil
			case <-l.done:
				return nil, net.ErrClosed
			}
		},
	}
	ws, _, err := d.Dial("ws://pipe/v1/ws", http.Header{"Authorization": {"Bearer " + tok}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ws.Close() })
	return ws
}
