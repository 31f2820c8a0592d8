package gateway

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// TestProtocolPingsOnlyToQuietClients: the gateway pings a connection only
// once its client has been quiet for most of the idle timeout. A client
// that sends frames of its own more often is never pinged; a silent one
// is, answers, and stays open, as does the talker.
func TestProtocolPingsOnlyToQuietClients(t *testing.T) {
	const idle = 3 * time.Second
	tg := startGateway(t, func(c *Config) { c.IdleTimeout = idle })
	talker, quiet := dialAnswering(t, tg, "talker"), dialAnswering(t, tg, "quiet")
	// The talker pings every tenth of the timeout, over 8/3 of it: the
	// cadence is what is tested, not a wait for something. The quiet
	// client is pinged by then about every 0.8-0.9 of it: twice or more.
	for end := time.Now().Add(8 * time.Second); time.Now().Before(end); {
		if err := talker.ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"ping"}`)); err != nil {
			t.Fatalf("talker's ping: %v", err)
		}
		select {
		case err := <-talker.ended:
			t.Fatalf("the talker's connection ended: %v", err)
		case err := <-quiet.ended:
			t.Fatalf("the quiet client's connection ended, though it answered every ping: %v", err)
		case <-time.After(idle / 10):
		}
	}
	// A ping to the talker would take it being unheard from for 0.8 of the
	// timeout (2.4 s); one is allowed for a host that starved the test
	// that long. Pinged regardless, as every connection was every 0.9 of
	// the timeout, it would have had two or three.
	if n := talker.pings.Load(); n > 1 {
		t.Errorf("the talker, heard from every %v, got %d protocol pings; want none", idle/10, n)
	}
	if n := quiet.pings.Load(); n < 2 {
		t.Errorf("the quiet client got %d protocol pings in 8s under a %v idle timeout; want 2 or more", n, idle)
	}
	if len(tg.hub.lookup("talker")) != 1 || len(tg.hub.lookup("quiet")) != 1 {
		t.Error("a client that was heard from within the idle timeout was dropped")
	}
}

// answering is a client connection that reads on, answers the gateway's
// protocol pings, and counts them.
type answering struct {
	ws    *websocket.Conn
	pings atomic.Int32 // protocol pings from the gateway
	ended chan error   // why reading ended
}

// dialAnswering connects uid as an answering client.
func dialAnswering(t *testing.T, tg *testGateway, uid string) *answering {
	t.Helper()
	cl := &answering{ws: tg.dial(t, uid), ended: make(chan error, 1)}
	cl.ws.SetPingHandler(func(data string) error {
		cl.pings.Add(1)
		return cl.ws.WriteControl(websocket.PongMessage, []byte(data), time.Now().Add(time.Second))
	})
	go func() {
		for {
			if _, _, err := cl.ws.ReadMessage(); err != nil {
				cl.ended <- err
				return
			}
		}
	}()
	return cl
}

// TestPingRoundKeepsItsPace: pingAll's shards take their turns by the
// clock, however its ticks come. A ticker drops the ticks its reader was
// too busy for; a round that moved one shard per tick it got would last
// as many times its visit as ticks were lost, and ping quiet clients past
// their deadlines.
func TestPingRoundKeepsItsPace(t *testing.T) {
	const turn = 10 * time.Millisecond
	const round = hubShards * turn
	for _, tc := range []struct {
		name string
		tick time.Duration // when pingAll gets to run: every tick
	}{
		{"on time", turn},
		{"a turn and a half apart", turn * 3 / 2},
		{"three turns apart", 3 * turn},
		{"a quarter round apart", round / 4},
		{"a round and a half apart", round * 3 / 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := pingRound{turn: turn}
			last := make([]time.Duration, hubShards) // each shard's last visit
			for now := tc.tick; now <= 20*round; now += tc.tick {
				first, n := r.due(now)
				if n > hubShards {
					t.Fatalf("at %v: %d shards visited in one tick, more than a round", now, n)
				}
				for i := range n {
					s := (first + i) % hubShards
					// A shard waits at most a round, and what a tick
					// found it late by, or a tick's wait after a pause.
					if gap := now - last[s]; gap > max(round, tc.tick)+tc.tick {
						t.Fatalf("at %v: shard %d visited %v after its last visit; want at most %v", now, s, gap, max(round, tc.tick)+tc.tick)
					}
					last[s] = now
				}
			}
			for s, at := range last {
				if 20*round-at > max(round, tc.tick)+tc.tick {
					t.Fatalf("shard %d last visited at %v of %v", s, at, 20*round)
				}
			}
		})
	}
	t.Run("after a pause", func(t *testing.T) {
		r := pingRound{turn: turn}
		r.due(turn)
		first, n := r.due(10 * round) // ten rounds without a tick
		if n != hubShards {
			t.Fatalf("after a pause of ten rounds: %d shards from %d visited; want each once", n, first)
		}
		if _, n := r.due(10*round + turn); n != 1 {
			t.Fatalf("a turn after the catch-up: %d shards visited; want the one whose turn came", n)
		}
	})
}
