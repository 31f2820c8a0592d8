package kafka

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Dead-letter record headers.
const (
	HeaderDLQReason = "dlq-reason" // why the record was dead-lettered
	// Where it was read: topic, partition and offset, in decimal.
	HeaderDLQTopic     = "dlq-topic"
	HeaderDLQPartition = "dlq-partition"
	HeaderDLQOffset    = "dlq-offset"
	// HeaderDLQValueCut, on a dead letter without a value, is the size of
	// the value it had: too large for the dead-letter topic with the
	// headers added, it was left out.
	HeaderDLQValueCut = "dlq-value-cut"
)

// maxDLQReason bounds a dead letter's reason header.
const maxDLQReason = 1024

// DeadLetter is r as it goes to the dead-letter topic: its key, value and
// headers, with the reason and where it was read in headers of its own.
func DeadLetter(r *kgo.Record, topic, reason string) *kgo.Record {
	if len(reason) > maxDLQReason {
		reason = reason[:maxDLQReason]
	}
	return &kgo.Record{
		Topic: topic,
		Key:   r.Key,
		Value: r.Value,
		Headers: append(append([]kgo.RecordHeader(nil), r.Headers...),
			kgo.RecordHeader{Key: HeaderDLQReason, Value: []byte(reason)},
			kgo.RecordHeader{Key: HeaderDLQTopic, Value: []byte(r.Topic)},
			kgo.RecordHeader{Key: HeaderDLQPartition, Value: fmt.Appendf(nil, "%d", r.Partition)},
			kgo.RecordHeader{Key: HeaderDLQOffset, Value: fmt.Appendf(nil, "%d", r.Offset)},
		),
	}
}

// ProduceDeadLetter produces r's dead letter to topic. One too large for
// the topic with its headers goes without its value (HeaderDLQValueCut
// says how large it was), so that a record near the size limit cannot
// stop its partition: it still says where the record is, and why.
func ProduceDeadLetter(ctx context.Context, cl *kgo.Client, r *kgo.Record, topic, reason string) error {
	d := DeadLetter(r, topic, reason)
	err := cl.ProduceSync(ctx, d).FirstErr()
	if !errors.Is(err, kerr.MessageTooLarge) && !errors.Is(err, kerr.RecordListTooLarge) {
		return err
	}
	cut := DeadLetter(&kgo.Record{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Key: r.Key}, topic, reason)
	cut.Headers = append(cut.Headers, kgo.RecordHeader{Key: HeaderDLQValueCut, Value: []byte(strconv.Itoa(len(r.Value)))})
	return cl.ProduceSync(ctx, cut).FirstErr()
}
