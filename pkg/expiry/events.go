package expiry

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stillthere/stillthere/pkg/outage"
)

// expiredPattern matches the expired keyevent channel of every database.
const expiredPattern = "__keyevent@*__:expired"

// parseKeyeventChannel splits "__keyevent@<db>__:<event>".
func parseKeyeventChannel(ch string) (db int, event string, ok bool) {
	rest, ok := strings.CutPrefix(ch, "__keyevent@")
	if !ok {
		return 0, "", false
	}
	num, event, ok := strings.Cut(rest, "__:")
	if !ok || num == "" || len(num) > 5 || strings.Trim(num, "0123456789") != "" || event == "" {
		return 0, "", false
	}
	db, err := strconv.Atoi(num)
	if err != nil {
		return 0, "", false
	}
	return db, event, true
}

// ensureNotify makes sure a Redis node publishes expired keyevents: its
// notify-keyspace-events must include E (keyevent channels) and x or A.
// The setting is per node and not replicated, so every master is checked.
func ensureNotify(ctx context.Context, node *redis.Client) error {
	addr := node.Options().Addr
	got, err := node.ConfigGet(ctx, "notify-keyspace-events").Result()
	if err != nil {
		return fmt.Errorf("redis %s: read notify-keyspace-events: %w (grant CONFIG, or set it to include \"Ex\" yourself)", addr, err)
	}
	flags := got["notify-keyspace-events"]
	if hasExpiredEvents(flags) {
		return nil
	}
	want := mergeNotifyFlags(flags)
	if err := node.ConfigSet(ctx, "notify-keyspace-events", want).Err(); err != nil {
		return fmt.Errorf("redis %s: notify-keyspace-events is %q and setting it to %q failed: %w (set it to include \"Ex\" in the server's config)", addr, flags, want, err)
	}
	return nil
}

func hasExpiredEvents(flags string) bool {
	return strings.Contains(flags, "E") && (strings.Contains(flags, "x") || strings.Contains(flags, "A"))
}

func mergeNotifyFlags(flags string) string {
	if !strings.Contains(flags, "E") {
		flags += "E"
	}
	if !strings.Contains(flags, "x") && !strings.Contains(flags, "A") {
		flags += "x"
	}
	return flags
}

// masterRefresh is how often the listener re-reads which nodes are
// masters, besides right after a subscription breaks.
const masterRefresh = 5 * time.Second

// followMasters keeps one subscription to expired events on every Redis
// master: on the single node, or on each cluster master as the cluster's
// slot map names them. It re-reads the map every masterRefresh and at once
// when a subscription breaks, so after a failover it subscribes to the
// promoted replica and drops the old master, and after resharding to the
// new masters. It returns an error only for a node that refuses CONFIG.
func (l *Listener) followMasters(ctx context.Context, out chan<- string) error {
	type sub struct {
		cancel context.CancelFunc
		done   chan struct{}
	}
	subs := make(map[string]*sub)
	fatal := make(chan error, 1)
	broken := make(chan struct{}, 1)
	defer func() {
		for _, s := range subs {
			s.cancel()
			<-s.done
		}
		metricSubscriptions.Set(0)
	}()
	t := time.NewTicker(masterRefresh)
	defer t.Stop()
	mastersDown := outage.NewLog(l.log, "list redis masters", 0)
	for {
		addrs, err := l.masterAddrs(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			mastersDown.Fail(err)
		default:
			mastersDown.OK()
			for addr, s := range subs {
				if !slices.Contains(addrs, addr) {
					l.log.Info("redis node is no longer a master; unsubscribing", "node", addr)
					s.cancel()
					<-s.done
					delete(subs, addr)
				}
			}
			for _, addr := range addrs {
				if subs[addr] != nil {
					continue
				}
				sctx, cancel := context.WithCancel(ctx)
				s := &sub{cancel: cancel, done: make(chan struct{})}
				subs[addr] = s
				go func() {
					defer close(s.done)
					if err := l.subscribe(sctx, addr, out, broken); err != nil {
						select {
						case fatal <- err:
						default:
						}
					}
				}()
			}
			metricSubscriptions.Set(float64(len(subs)))
		}
		select {
		case <-ctx.Done():
			return nil
		case err := <-fatal:
			return err
		case <-broken:
		case <-t.C:
		}
	}
}

// masterAddrs lists the addresses of the nodes that publish expired
// events: the single node, or the cluster's masters as its slot map says.
func (l *Listener) masterAddrs(ctx context.Context) ([]string, error) {
	switch c := l.rdb.(type) {
	case *redis.Client:
		return []string{c.Options().Addr}, nil
	case *redis.ClusterClient:
		// The masters the client knows from the slot map it keeps.
		var mu sync.Mutex
		var addrs []string
		err := c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			mu.Lock()
			defer mu.Unlock()
			if a := m.Options().Addr; !slices.Contains(addrs, a) {
				addrs = append(addrs, a)
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("cluster masters: %w", err)
		}
		slices.Sort(addrs)
		return addrs, nil
	default:
		return nil, fmt.Errorf("unsupported redis client %T", l.rdb)
	}
}

// nodeClient is a client of its own for one node's subscription, with the
// credentials and TLS of the listener's client. Its own, so that the
// cluster client closing a node it no longer lists cannot cut it off, and
// without client-side caching, whose invalidations would share the line.
func (l *Listener) nodeClient(addr string) *redis.Client {
	var o redis.Options
	switch c := l.rdb.(type) {
	case *redis.Client:
		o = *c.Options()
	case *redis.ClusterClient:
		co := c.Options()
		o = redis.Options{
			Username:            co.Username,
			Password:            co.Password,
			CredentialsProvider: co.CredentialsProvider,
			TLSConfig:           co.TLSConfig,
			Dialer:              co.Dialer,
			DialTimeout:         co.DialTimeout,
			Protocol:            co.Protocol,
		}
	}
	o.Addr = addr
	o.DB = 0
	o.PoolSize = 1
	return redis.NewClient(&o)
}

// subscribe delivers the keys of expired events from the node at addr to
// out until ctx is done, resubscribing after errors and telling broken
// each time a subscription breaks. It reads the subscription itself
// instead of go-redis's Channel, which drops messages when its buffer
// stays full: here a slow pipeline stalls the socket instead, and if Redis
// cuts off the subscriber for that, the sweep finds what was missed.
func (l *Listener) subscribe(ctx context.Context, addr string, out chan<- string, broken chan<- struct{}) error {
	node := l.nodeClient(addr)
	defer node.Close()
	log := l.log.With("node", addr)
	down := outage.NewLog(log, "keyspace events (the sweep covers what they miss)", 0)
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		if err := ensureNotify(ctx, node); err != nil {
			if ctx.Err() != nil {
				break
			}
			if isConfigDenied(err) {
				return err
			}
			down.Fail(fmt.Errorf("unavailable, retrying: %w", err))
			metricSubscribeErrors.Inc()
			select {
			case broken <- struct{}{}:
			default:
			}
			sleep(ctx, backoff)
			backoff = min(backoff*2, 5*time.Second)
			continue
		}
		err := l.receive(ctx, node, out)
		if ctx.Err() != nil {
			break
		}
		metricSubscribeErrors.Inc()
		down.Fail(fmt.Errorf("subscription broken, resubscribing: %w", err))
		select {
		case broken <- struct{}{}:
		default:
		}
		sleep(ctx, backoff)
		backoff = min(backoff*2, 5*time.Second)
	}
	return nil
}

func (l *Listener) receive(ctx context.Context, node *redis.Client, out chan<- string) error {
	ps := node.PSubscribe(ctx, expiredPattern)
	defer ps.Close()
	// A blocked read does not watch ctx; closing the subscription ends it.
	stop := context.AfterFunc(ctx, func() { ps.Close() })
	defer stop()
	if _, err := ps.Receive(ctx); err != nil { // the subscription confirmation
		return err
	}
	for {
		msg, err := ps.ReceiveMessage(ctx)
		if err != nil {
			return err
		}
		if _, event, ok := parseKeyeventChannel(msg.Channel); !ok || event != "expired" {
			continue
		}
		uid, err := l.store.Keyspace().ParseSessionKey(msg.Payload)
		if err != nil {
			continue // another application's key
		}
		select {
		case out <- uid:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// isConfigDenied reports whether Redis refused CONFIG itself, as managed
// services do (an ACL without it, or the command renamed away): retrying
// cannot help, so the listener fails with the node's name.
func isConfigDenied(err error) bool {
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return false
	}
	msg := rerr.Error()
	return strings.HasPrefix(msg, "NOPERM") || strings.Contains(msg, "unknown command")
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
