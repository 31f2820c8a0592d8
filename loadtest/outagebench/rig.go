package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"sync"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/stillthere/stillthere/pkg/config"
	"github.com/stillthere/stillthere/pkg/expiry"
	"github.com/stillthere/stillthere/pkg/guide"
	"github.com/stillthere/stillthere/pkg/kafka/kafkatest"
	"github.com/stillthere/stillthere/pkg/redisserver"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/tcpproxy"
)

// keyPrefix is the run's Redis key prefix.
const keyPrefix = "ob"

// rig is the pipeline under test: redis-server with its append-only file,
// a TCP proxy in front of it for the gateways, embedded Kafka, the
// gateway processes, and in this process the expiry listener, a guide
// consumer with the webhook sender, and the webhook. The listener and the
// consumer reach Redis directly.
type rig struct {
	redis *redisserver.Server
	proxy *tcpproxy.Proxy
	kafka *kfake.Cluster
	hook  *webhook
	gws   *gateways
	rdb   *redis.Client // reads the control keys for the report
	ks    session.Keyspace
	token string // the gateways' token secret, for the users' tokens
	dir   string

	cancel context.CancelFunc // ends the listener and the consumer
	wg     sync.WaitGroup
	closes []func() // in reverse order of start
}

func secret() string {
	var b [32]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// env is a lookup over settings given by flag name.
func env(kv map[string]string) config.Lookup {
	return func(name string) (string, bool) {
		for k, v := range kv {
			if config.EnvName(k) == name {
				return v, true
			}
		}
		return "", false
	}
}

func startRig(ctx context.Context, s settings, logs *tally) (r *rig, err error) {
	r = &rig{token: secret()}
	defer func() {
		if err != nil {
			r.close()
		}
	}()
	if r.dir, err = os.MkdirTemp("", "outagebench-"); err != nil {
		return r, err
	}
	r.closes = append(r.closes, func() { os.RemoveAll(r.dir) })
	if r.redis, err = redisserver.Start(ctx, redisserver.Options{Dir: r.dir + "/redis", AOF: true}); err != nil {
		return r, fmt.Errorf("redis-server: %w", err)
	}
	r.closes = append(r.closes, func() { r.redis.Close() })
	if r.proxy, err = tcpproxy.Start(r.redis.Addr); err != nil {
		return r, err
	}
	r.closes = append(r.closes, func() { r.proxy.Close() })
	r.rdb = redis.NewClient(&redis.Options{Addr: r.redis.Addr})
	r.closes = append(r.closes, func() { r.rdb.Close() })
	r.ks, _ = session.NewKeyspace(keyPrefix)
	if r.kafka, err = kafkatest.NewFake(); err != nil {
		return r, err
	}
	r.closes = append(r.closes, r.kafka.Close)
	if r.hook, err = startWebhook(); err != nil {
		return r, err
	}
	r.closes = append(r.closes, r.hook.close)

	pctx, cancel := context.WithCancel(ctx)
	r.cancel = cancel
	r.closes = append(r.closes, func() { cancel(); r.wg.Wait() })
	if err := r.startListener(pctx, s, logs); err != nil {
		return r, err
	}
	if err := r.startConsumer(pctx, logs); err != nil {
		return r, err
	}

	r.gws, err = newGateways(s.gatewayBin, s.gateways, []string{
		"STILLTHERE_REDIS_ADDRS=" + r.proxy.Addr(),
		"STILLTHERE_TOKEN_SECRET=" + r.token,
		"STILLTHERE_PUSH_SECRET=" + secret(),
		"STILLTHERE_KEY_PREFIX=" + keyPrefix,
		"STILLTHERE_SESSION_TTL=" + s.ttl.String(),
		"STILLTHERE_SESSION_JITTER=" + s.jitter.String(),
		"STILLTHERE_LOG_LEVEL=info",
		"STILLTHERE_LOG_FORMAT=json",
	}, logs)
	if err != nil {
		return r, err
	}
	r.closes = append(r.closes, r.gws.stop)
	return r, r.gws.start(ctx)
}

func (r *rig) startListener(ctx context.Context, s settings, logs *tally) error {
	cfg, err := expiry.LoadConfig(nil, env(map[string]string{
		"redis-addrs":         r.redis.Addr,
		"key-prefix":          keyPrefix,
		"kafka-brokers":       r.kafka.ListenAddrs()[0],
		"listener-admin-addr": "127.0.0.1:0",
		"spool-dir":           r.dir + "/spool",
		"outage-grace":        s.grace.String(),
	}))
	if err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(logs.writer("listener"), nil))
	l, err := expiry.Open(ctx, cfg, log)
	if err != nil {
		return fmt.Errorf("expiry listener: %w", err)
	}
	r.wg.Go(func() {
		defer l.Close()
		if err := l.Run(ctx); err != nil {
			log.Error("listener stopped", "err", err)
		}
	})
	return nil
}

func (r *rig) startConsumer(ctx context.Context, logs *tally) error {
	cfg, err := guide.LoadConfig(nil, env(map[string]string{
		"redis-addrs":         r.redis.Addr,
		"key-prefix":          keyPrefix,
		"kafka-brokers":       r.kafka.ListenAddrs()[0],
		"consumer-admin-addr": "127.0.0.1:0",
		"sender":              guide.SenderWebhook,
		"webhook-url":         r.hook.url,
		"webhook-secret":      webhookSecret,
	}))
	if err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(logs.writer("consumer"), nil))
	c, err := guide.Open(ctx, cfg, log)
	if err != nil {
		return fmt.Errorf("guide consumer: %w", err)
	}
	r.wg.Go(func() {
		defer c.Close()
		if err := c.Run(ctx); err != nil {
			log.Error("consumer stopped", "err", err)
		}
	})
	return nil
}

// close stops everything, the last started first.
func (r *rig) close() {
	for i := len(r.closes) - 1; i >= 0; i-- {
		r.closes[i]()
	}
	r.closes = nil
}

// blindIntervals reads the blind intervals the control keys hold.
func (r *rig) blindIntervals(ctx context.Context) []session.BlindInterval {
	members, err := r.rdb.ZRange(ctx, r.ks.BlindKey(), 0, -1).Result()
	if err != nil {
		return nil
	}
	var out []session.BlindInterval
	for _, m := range members {
		if b, err := session.ParseBlindInterval(m); err == nil {
			out = append(out, b)
		}
	}
	return out
}
