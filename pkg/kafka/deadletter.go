package kafka

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"

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
	err := cl.ProduceSync(ctx, DeadLetter(r, topic, reason)).FirstErr()
	if !tooLarge(err) {
		return err
	}
	return cl.ProduceSync(ctx, cutDeadLetter(r, topic, reason)).FirstErr()
}

// Refused is a record refused, and why: what ProduceDeadLetters takes.
type Refused struct {
	Record *kgo.Record
	Reason string
}

// ProduceDeadLetters produces the dead letters of refused to topic, as
// ProduceDeadLetter does each, all at once: a batch of thousands refused
// (a platform's release that writes a field wrong) waits one round trip,
// not one each. It returns those that failed, in the order given, to be
// produced again, and the first error.
func ProduceDeadLetters(ctx context.Context, cl *kgo.Client, refused []Refused, topic string) (failed []Refused, err error) {
	errs := make([]error, len(refused))
	var wg sync.WaitGroup
	wg.Add(len(refused))
	for i, rf := range refused {
		cl.Produce(ctx, DeadLetter(rf.Record, topic, rf.Reason), func(_ *kgo.Record, e error) {
			errs[i] = e
			wg.Done()
		})
	}
	wg.Wait()
	for i, e := range errs {
		if tooLarge(e) {
			// The batch it went in was too large, or it alone: alone,
			// then without its value if it must.
			e = ProduceDeadLetter(ctx, cl, refused[i].Record, topic, refused[i].Reason)
		}
		if e != nil {
			failed = append(failed, refused[i])
			err = cmp.Or(err, e)
		}
	}
	return failed, err
}

// tooLarge says whether a produce failed for the record's size.
func tooLarge(err error) bool {
	return errors.Is(err, kerr.MessageTooLarge) || errors.Is(err, kerr.RecordListTooLarge)
}

// cutDeadLetter is r's dead letter without its value.
func cutDeadLetter(r *kgo.Record, topic, reason string) *kgo.Record {
	cut := DeadLetter(&kgo.Record{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Key: r.Key}, topic, reason)
	cut.Headers = append(cut.Headers, kgo.RecordHeader{Key: HeaderDLQValueCut, Value: []byte(strconv.Itoa(len(r.Value)))})
	return cut
}
