// Package topictest reads the timeout topic back in tests: every event on
// it, checked for its schema and its uid key.
package topictest

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// Events reads the topic from its start to its current end offsets.
func Events(t testing.TB, brokers []string, topic string) []timeoutevent.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	var want int64
	ends.Each(func(o kadm.ListedOffset) { want += o.Offset })
	var out []timeoutevent.Event
	for int64(len(out)) < want {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %d of %d events: %v", len(out), want, ctx.Err())
		}
		fs.EachRecord(func(r *kgo.Record) {
			ev, err := timeoutevent.Parse(r.Value)
			if err != nil {
				t.Errorf("bad event on topic: %v", err)
			}
			if string(r.Key) != ev.UID {
				t.Errorf("event for %q keyed %q", ev.UID, r.Key)
			}
			out = append(out, ev)
		})
	}
	return out
}
