package kafka_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/stillthere/stillthere/pkg/kafka"
	"github.com/stillthere/stillthere/pkg/kafka/kafkatest"
)

// TestProduceDeadLetters: a batch of refused records reaches the
// dead-letter topic whole, each once, in order, with its reason and
// where it was read. A dead-letter topic whose records may be smaller
// than the batch the client sends them in takes each alone; one too
// large alone goes without its value, saying how large it was.
func TestProduceDeadLetters(t *testing.T) {
	kc := kafkatest.StartFake(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(kc.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	max := "3000"
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, 1, 1, map[string]*string{"max.message.bytes": &max}, "dlq"); err != nil {
		t.Fatal(err)
	}
	var refused []kafka.Refused
	for i := range 60 {
		size := 100
		if i == 10 || i == 40 {
			size = 5000 // past the topic's bound alone
		}
		refused = append(refused, kafka.Refused{
			Record: &kgo.Record{Topic: "activity", Partition: 3, Offset: int64(100 + i), Key: []byte("u1"), Value: noise(size)},
			Reason: fmt.Sprint("bad ", i),
		})
	}
	failed, err := kafka.ProduceDeadLetters(ctx, cl, refused, "dlq")
	if err != nil || len(failed) != 0 {
		t.Fatalf("%d failed, %v; want all produced", len(failed), err)
	}

	rd, err := kgo.NewClient(kgo.SeedBrokers(kc.ListenAddrs()...), kgo.ConsumeTopics("dlq"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	var got []*kgo.Record
	for len(got) < len(refused) && ctx.Err() == nil {
		got = append(got, rd.PollFetches(ctx).Records()...)
	}
	if len(got) != len(refused) {
		t.Fatalf("%d dead letters, want %d", len(got), len(refused))
	}
	header := func(r *kgo.Record, k string) string {
		for _, h := range r.Headers {
			if h.Key == k {
				return string(h.Value)
			}
		}
		return ""
	}
	seen := map[string]bool{}
	for _, r := range got {
		off := header(r, kafka.HeaderDLQOffset)
		if seen[off] {
			t.Errorf("offset %s dead-lettered twice", off)
		}
		seen[off] = true
		var i int
		fmt.Sscan(off, &i)
		i -= 100
		if reason := header(r, kafka.HeaderDLQReason); reason != fmt.Sprint("bad ", i) {
			t.Errorf("offset %s: reason %q", off, reason)
		}
		cut := header(r, kafka.HeaderDLQValueCut)
		if i == 10 || i == 40 {
			if cut != "5000" || len(r.Value) != 0 {
				t.Errorf("offset %s, too large alone: value of %d bytes, cut %q; want none, cut 5000", off, len(r.Value), cut)
			}
		} else if cut != "" || len(r.Value) != 100 {
			t.Errorf("offset %s: value of %d bytes, cut %q; want its 100 bytes", off, len(r.Value), cut)
		}
	}
}

// noise is n bytes that do not compress: the client compresses batches,
// and a bound on records holds for them compressed.
func noise(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rand.IntN(256))
	}
	return b
}
