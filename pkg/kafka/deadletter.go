package kafka

import (
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Dead-letter record headers.
const (
	HeaderDLQReason = "dlq-reason" // why the record was dead-lettered
	// Where it was read: topic, partition and offset, in decimal.
	HeaderDLQTopic     = "dlq-topic"
	HeaderDLQPartition = "dlq-partition"
	HeaderDLQOffset    = "dlq-offset"
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
