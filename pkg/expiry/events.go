package expiry

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
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
// notify-keyspace-events must hold E (keyevent channels) and x or A.
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

// subscribe delivers the keys of expired events from one node to out until
// ctx is done. It reads the subscription itself instead of go-redis's
// Channel, which drops messages when its buffer stays full: here a slow
// pipeline holds the socket instead, and if Redis cuts off the subscriber
// for that, the sweep finds what was missed.
func (l *Listener) subscribe(ctx context.Context, node *redis.Client, out chan<- string) error {
	log := l.log.With("node", node.Options().Addr)
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		if err := ensureNotify(ctx, node); err != nil {
			if ctx.Err() != nil {
				break
			}
			if isConfigDenied(err) {
				return err
			}
			log.Warn("keyspace events unavailable, retrying", "err", err)
			metricSubscribeErrors.Inc()
			sleep(ctx, backoff)
			backoff = min(backoff*2, 5*time.Second)
			continue
		}
		err := l.receive(ctx, node, out)
		if ctx.Err() != nil {
			break
		}
		metricSubscribeErrors.Inc()
		log.Warn("keyspace event subscription broken, resubscribing", "err", err)
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
