package gateway

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// The instance channel. Other instances route a guide for a user connected
// here by SPUBLISH on this instance's shard channel, and count it
// delivered when Redis says someone subscribes (see deliverElsewhere). So
// the subscription is a promise to the others, and Redis can take it away
// without breaking the connection: when the channel's slot changes owner
// (a reshard moving it, a graceful CLUSTER FAILOVER, as rolling upgrades
// and managed services do), the old owner sends SUNSUBSCRIBE and keeps
// the connection. This instance keeps the subscription itself:
//
//   - listen reads it, one connection at a time. An unsubscribe push, a
//     broken connection, or a failed probe ends that connection's
//     subscription; listen closes it and subscribes on a fresh one, where
//     the slot map says the channel lives: at once, then with backoff, and
//     on a cluster with the slot map reloaded after each failure (an old
//     owner answers MOVED). It counts as subscribed only once Redis
//     confirmed it where publishers count it (at the slot's master, not
//     at a replica, which confirms it too), and then registers its users'
//     routes again.
//   - probeChannel checks it every channelProbeEvery, as the others see
//     it: it publishes a probe on the channel through the shared client,
//     the way routed guides go. No subscriber there means the subscription
//     is gone where publishers look; a probe counted but not read within
//     channelProbeWait means the connection is dead one way (half-open).
//   - while it is not subscribed, readyz fails and
//     stillthere_gateway_channel_subscribed is 0.
//
// Nothing routed meanwhile is taken for delivered: a guide published while
// the channel has no subscriber is counted by nobody, the publisher tries
// again for publishRetries*publishRetryWait (more than a resubscription
// takes) and then answers retry, and the consumer pushes it again. Guides
// published before an unsubscribe push come before it on the same
// connection, and are read before listen lets it go. One hole stays: a
// guide counted on a connection that breaks before it is read goes with
// it, as Pub/Sub has no acknowledgement. (go-redis connects a failed
// subscription again by itself; listen unsubscribes it before letting it
// go, so that no guide is counted on a subscription nobody reads.)

const (
	// channelConfirmTimeout bounds the wait for Redis to confirm a
	// subscription after a loss: an attempt on a connection that Redis
	// never answers (a partition) holds up the next for this long once it
	// heals. The first, on start, waits channelStartTimeout: a gateway
	// that cannot subscribe does not start.
	channelConfirmTimeout = 2 * time.Second
	channelStartTimeout   = 30 * time.Second
	// channelRetryFirst and channelRetryMax bound the backoff between
	// failed subscriptions; the first after a loss is at once.
	channelRetryFirst = 25 * time.Millisecond
	channelRetryMax   = time.Second
	// channelDrainWait is how long guides already sent on a subscription
	// that is let go are waited for.
	channelDrainWait = 50 * time.Millisecond
	// channelProbeEvery is how often the subscription is checked.
	channelProbeEvery = time.Second
	// channelProbeWait is how long a probe may take to come back: longer
	// than a routed guide of a user who just left holds the reader (one
	// inbox write, bounded by write-timeout's default), so that a busy
	// reader is not taken for a dead connection.
	channelProbeWait = 10 * time.Second
	// probePrefix starts a probe's payload; a routed guide is JSON.
	probePrefix = "probe:"
)

// Why a subscription ended, the reason label of
// stillthere_gateway_channel_lost_total.
const (
	lostUnsubscribed = "unsubscribed"  // Redis sent an unsubscribe push
	lostBroken       = "broken"        // the connection failed
	lostNoSubscriber = "no_subscriber" // a probe reached no subscriber
	lostProbe        = "probe_lost"    // a probe was counted but never read
)

// channelEvent is what one message on the subscription's connection means.
type channelEvent int

const (
	eventOther        channelEvent = iota // a pong, or another channel's message
	eventGuide                            // a guide routed here
	eventProbe                            // this instance's probe
	eventSubscribed                       // Redis confirmed the subscription
	eventUnsubscribed                     // Redis took it away
)

// classify says what msg, read from the subscription to channel, means.
func classify(msg any, channel string) channelEvent {
	switch m := msg.(type) {
	case *redis.Subscription:
		switch {
		case strings.HasSuffix(m.Kind, "unsubscribe"):
			return eventUnsubscribed
		case m.Kind == "ssubscribe" && m.Channel == channel && m.Count > 0:
			return eventSubscribed
		}
	case *redis.Message:
		if m.Channel != channel {
			return eventOther
		}
		if strings.HasPrefix(m.Payload, probePrefix) {
			return eventProbe
		}
		return eventGuide
	}
	return eventOther
}

// channelRetry is the pause before the attempt-th subscription after a
// loss (0 the first).
func channelRetry(attempt int) time.Duration {
	if attempt == 0 {
		return 0
	}
	d := channelRetryFirst
	for i := 1; i < attempt && d < channelRetryMax; i++ {
		d *= 2
	}
	return min(d, channelRetryMax)
}

// instanceChannel is the state of the subscription: listen writes it,
// probeChannel and readyz read it, and a probe or the stop may close the
// subscription under listen's reads.
type instanceChannel struct {
	mu        sync.Mutex
	sub       *redis.PubSub // being confirmed or read; nil between
	downSince time.Time     // when it was lost; zero while subscribed
	stopped   bool
	lostWhy   string        // a probe's verdict on sub, which it closed
	probe     string        // the payload of the probe under way
	heard     chan struct{} // closed when listen read it
}

// track makes sub the subscription, unconfirmed, so that a stop closes it.
func (c *instanceChannel) track(sub *redis.PubSub) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return false
	}
	c.sub, c.lostWhy = sub, ""
	return true
}

// up notes that Redis confirmed sub.
func (c *instanceChannel) up(sub *redis.PubSub) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sub == sub {
		c.downSince = time.Time{}
		metricChannelSubscribed.Set(1)
	}
}

// down closes sub, which ended for why (or for the reason a probe gave
// when it closed it), and marks the channel unsubscribed. It returns the
// reason.
func (c *instanceChannel) down(sub *redis.PubSub, why string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sub == sub {
		if c.lostWhy != "" {
			why = c.lostWhy
		}
		c.sub, c.lostWhy = nil, ""
		if c.probe != "" {
			// The probe under way judged sub: it waits no more.
			close(c.heard)
			c.probe = ""
		}
		if c.downSince.IsZero() {
			c.downSince = time.Now()
		}
		metricChannelSubscribed.Set(0)
	}
	sub.Close()
	return why
}

// drop closes sub for why, if it is still the subscription: its reader
// then fails, and listen subscribes again.
func (c *instanceChannel) drop(sub *redis.PubSub, why string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sub == sub && c.lostWhy == "" {
		c.lostWhy = why
		sub.Close()
	}
}

// stop closes the subscription, and any to come.
func (c *instanceChannel) stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stopped = true
	if c.sub != nil {
		c.sub.Close()
	}
}

// startProbe returns the confirmed subscription and a new probe's payload,
// with the channel that closes when listen reads it; nil while the channel
// is not subscribed.
func (c *instanceChannel) startProbe() (*redis.PubSub, string, <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sub == nil || !c.downSince.IsZero() || c.lostWhy != "" {
		return nil, "", nil
	}
	c.probe, c.heard = probePrefix+newToken(), make(chan struct{})
	return c.sub, c.probe, c.heard
}

// heardProbe notes that listen read payload.
func (c *instanceChannel) heardProbe(payload string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if payload == c.probe && c.probe != "" {
		close(c.heard)
		c.probe = ""
	}
}

// err says why the channel is not subscribed, for readyz.
func (c *instanceChannel) err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.downSince.IsZero() {
		return nil
	}
	return fmt.Errorf("instance channel not subscribed since %s", c.downSince.UTC().Format(time.RFC3339))
}

// channelName is this instance's channel.
func (g *Gateway) channelName() string { return g.store.Keyspace().InstanceChannel(g.instance) }

// subscribe subscribes to the instance channel on a connection of its own,
// and returns once Redis confirmed it where publishers count it, within
// timeout.
func (g *Gateway) subscribe(ctx context.Context, timeout time.Duration) (*redis.PubSub, error) {
	name := g.channelName()
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	node, err := g.channelMaster(rctx)
	if err != nil {
		return nil, fmt.Errorf("subscribe to the instance channel: %w", err)
	}
	sub := g.rdb.SSubscribe(ctx, name)
	if !g.channel.track(sub) {
		sub.Close()
		return nil, errors.New("gateway stopping")
	}
	msg, err := sub.Receive(rctx)
	if err == nil && classify(msg, name) != eventSubscribed {
		err = fmt.Errorf("unexpected answer %v", msg)
	}
	if err == nil && node != nil {
		err = g.atMaster(rctx, node)
	}
	if err == nil {
		err = g.counted(rctx, sub)
	}
	if err != nil {
		g.channel.down(sub, "")
		return nil, fmt.Errorf("subscribe to the instance channel: %w", err)
	}
	g.channel.up(sub)
	return sub, nil
}

// channelMaster is the node a cluster client's slot map names as the
// master of the channel's slot, where its subscription goes; nil on a
// single Redis.
func (g *Gateway) channelMaster(ctx context.Context) (*redis.Client, error) {
	cc, ok := g.rdb.(*redis.ClusterClient)
	if !ok {
		return nil, nil
	}
	return cc.MasterForKey(ctx, g.channelName())
}

// atMaster checks that node, where a subscription was just confirmed, is
// still named by the slot map and is a master. A replica confirms
// SSUBSCRIBE for its master's slots, and answers SPUBLISH from publishers
// whose slot map is late, but publishers that know the master count
// nobody there. After a failover the old master, a replica now, is the
// node a late slot map names.
func (g *Gateway) atMaster(ctx context.Context, node *redis.Client) error {
	now, err := g.channelMaster(ctx)
	if err != nil {
		return err
	}
	if now.Options().Addr != node.Options().Addr {
		return fmt.Errorf("the slot map changed while subscribing: %s, then %s", node.Options().Addr, now.Options().Addr)
	}
	role, err := node.Do(ctx, "ROLE").Slice()
	if err != nil {
		return fmt.Errorf("role of %s: %w", node.Options().Addr, err)
	}
	if len(role) == 0 || role[0] != "master" {
		return fmt.Errorf("confirmed by %s, not a master (role %v)", node.Options().Addr, role)
	}
	return nil
}

// counted checks that a publisher counts the subscription just confirmed,
// before anything else on it is read: where the shared client publishes
// (as the others do), the subscription must be counted. A subscription
// confirmed where publishers do not count it (see atMaster) would take
// guides that their publishers count as reaching nobody, and push again.
// Then the guides already come on it are read, lest one counted in a role
// change just before is lost, and it is let go.
func (g *Gateway) counted(ctx context.Context, sub *redis.PubSub) error {
	n, err := g.rdb.SPublish(ctx, g.channelName(), probePrefix+newToken()).Result()
	switch {
	case err != nil:
		return fmt.Errorf("check the subscription: %w", err)
	case n > 0:
		return nil
	}
	name := g.channelName()
	for {
		msg, err := sub.ReceiveTimeout(ctx, channelDrainWait)
		if err != nil {
			break
		}
		if classify(msg, name) == eventGuide {
			g.routedIn(ctx, msg.(*redis.Message).Payload)
		}
	}
	return errors.New("confirmed where publishers do not count it (a replica, or a node the slot map names late)")
}

// resubscribe subscribes again after a loss, until it is confirmed or ctx
// is done (nil).
func (g *Gateway) resubscribe(ctx context.Context) *redis.PubSub {
	for attempt := 0; ; attempt++ {
		if wait := channelRetry(attempt); wait > 0 {
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(wait):
			}
		}
		sub, err := g.subscribe(ctx, channelConfirmTimeout)
		if err == nil {
			return sub
		}
		if ctx.Err() != nil {
			return nil
		}
		g.channelLog.Fail(err)
		g.log.Debug("subscribe to the instance channel", "attempt", attempt, "err", err)
		// The slot map may name the channel's old owner, which answers
		// MOVED, or is a replica now.
		g.reloadSlots(ctx)
	}
}

// reloadSlots has a cluster client read the slot map again, in the
// background, so that a later command goes where the cluster names now.
// It reports whether the client is a cluster's.
func (g *Gateway) reloadSlots(ctx context.Context) bool {
	cc, ok := g.rdb.(*redis.ClusterClient)
	if ok {
		cc.ReloadState(ctx)
	}
	return ok
}

// listen takes guides other instances route here until ctx is done, on
// sub (confirmed by Open) and on each subscription after it. See the
// comment at the top of this file.
func (g *Gateway) listen(ctx context.Context, sub *redis.PubSub) {
	stop := context.AfterFunc(ctx, g.channel.stop)
	defer stop()
	defer g.channel.stop()
	pctx, cancel := context.WithCancel(ctx)
	var probes sync.WaitGroup
	probes.Go(func() { g.probeChannel(pctx) })
	defer func() {
		cancel()
		probes.Wait()
	}()
	for {
		why := g.read(ctx, sub)
		if why != lostUnsubscribed && ctx.Err() == nil {
			g.letGo(ctx, sub)
		}
		why = g.channel.down(sub, why)
		if ctx.Err() != nil {
			return
		}
		metricChannelLost.WithLabelValues(why).Inc()
		g.channelLog.Fail(fmt.Errorf("instance channel lost: %s", why))
		if sub = g.resubscribe(ctx); sub == nil {
			return
		}
		g.channelLog.OK()
		// A push that met no subscriber meanwhile answered retry; one
		// that took this instance for dead dropped it from routes.
		g.log.Info("instance channel subscribed again; registering users again", "lost", why)
		g.routes.markAll()
	}
}

// read reads sub until its subscription ends, and returns why.
func (g *Gateway) read(ctx context.Context, sub *redis.PubSub) string {
	name := g.channelName()
	for {
		msg, err := sub.Receive(ctx)
		if err != nil {
			return lostBroken
		}
		switch classify(msg, name) {
		case eventGuide:
			g.routedIn(ctx, msg.(*redis.Message).Payload)
		case eventProbe:
			g.channel.heardProbe(msg.(*redis.Message).Payload)
		case eventUnsubscribed:
			return lostUnsubscribed
		}
	}
}

// letGo ends sub's subscription, where it still stands, before sub is
// closed. A read that fails has go-redis connect sub again at once and
// send SSUBSCRIBE there, unread: publishers count that subscriber, and a
// guide they route to it meanwhile would go when sub is closed, counted
// as delivered. Unsubscribing takes it off go-redis's list, so it is
// never subscribed again; what came before the confirmation is routed
// in. A subscription a probe closed, or whose connection is down,
// answers nothing, and the wait is short.
func (g *Gateway) letGo(ctx context.Context, sub *redis.PubSub) {
	name := g.channelName()
	uctx, cancel := context.WithTimeout(ctx, channelDrainWait)
	defer cancel()
	if err := sub.SUnsubscribe(uctx, name); err != nil {
		return
	}
	for {
		msg, err := sub.ReceiveTimeout(uctx, channelDrainWait)
		if err != nil {
			return
		}
		switch classify(msg, name) {
		case eventGuide:
			g.routedIn(ctx, msg.(*redis.Message).Payload)
		case eventUnsubscribed:
			return
		}
	}
}

// probeChannel checks the subscription every channelProbeEvery until ctx
// is done.
func (g *Gateway) probeChannel(ctx context.Context) {
	t := time.NewTicker(channelProbeEvery)
	defer t.Stop()
	var uncounted *redis.PubSub
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		uncounted = g.probe(ctx, uncounted)
	}
}

// probe publishes one probe on the channel, as a routed guide is
// published, and closes the subscription if nobody subscribes where the
// probe went, or if it was counted but not read in time. It returns the
// subscription when the probe counted nobody on it but it is judged on
// the next probe: uncounted is the last one's. A probe that Redis did not
// take judges nothing: that is an outage of Redis, which reach reports.
func (g *Gateway) probe(ctx context.Context, uncounted *redis.PubSub) *redis.PubSub {
	sub, payload, heard := g.channel.startProbe()
	if sub == nil {
		return nil
	}
	pctx, cancel := context.WithTimeout(ctx, channelProbeWait)
	n, err := g.rdb.SPublish(pctx, g.channelName(), payload).Result()
	cancel()
	switch {
	case err != nil:
		return nil
	case n == 0:
		// On a cluster, a late slot map sends the probe to a replica,
		// which counts only its own subscribers: the map is read again,
		// and the next probe judges.
		if sub != uncounted && g.reloadSlots(ctx) {
			return sub
		}
		g.channel.drop(sub, lostNoSubscriber)
		return nil
	}
	// Counted: the wait for it starts now, whatever the publish took.
	wait := time.NewTimer(channelProbeWait)
	defer wait.Stop()
	select {
	case <-heard:
	case <-ctx.Done():
	case <-wait.C:
		g.channel.drop(sub, lostProbe)
	}
	return nil
}
