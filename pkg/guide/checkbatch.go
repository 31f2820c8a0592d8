package guide

import (
	"context"
	"time"

	"github.com/stillthere/stillthere/pkg/session"
)

// checkBatcher gathers the session checks of the records in flight into
// one pipelined round trip: while one batch is out, the checks asked for
// meanwhile queue, and go together as the next. One check waits for
// nobody: alone, it goes at once. In a storm one round trip per record
// was most of what the consumer asked of Redis, and of the syscalls of
// this process. Its run goroutine is the loop's, started and stopped
// with it; process goroutines only ask.
type checkBatcher struct {
	reqs    chan checkReq
	checkFn func(ctx context.Context, uids []string) ([]session.Check, []error)
	timeout time.Duration // bounds one batch's round trip
	max     int           // most checks in one batch
}

type checkReq struct {
	uid   string
	reply chan checkReply // capacity 1: the batcher never blocks on it
}

type checkReply struct {
	check sessionCheck
	err   error
}

func newCheckBatcher(check func(ctx context.Context, uids []string) ([]session.Check, []error), timeout time.Duration, max int) *checkBatcher {
	return &checkBatcher{reqs: make(chan checkReq, max), checkFn: check, timeout: timeout, max: max}
}

// check asks for uid's check and waits for it, or for ctx.
func (b *checkBatcher) check(ctx context.Context, uid string) (sessionCheck, error) {
	req := checkReq{uid: uid, reply: make(chan checkReply, 1)}
	select {
	case b.reqs <- req:
	case <-ctx.Done():
		return sessionCheck{}, ctx.Err()
	}
	select {
	case r := <-req.reply:
		return r.check, r.err
	case <-ctx.Done():
		return sessionCheck{}, ctx.Err()
	}
}

// run answers checks until ctx is done. The loop stops it only once its
// sends under way have settled, so none waits for it in vain.
func (b *checkBatcher) run(ctx context.Context) {
	batch := make([]checkReq, 0, b.max)
	uids := make([]string, 0, b.max)
	for {
		batch, uids = batch[:0], uids[:0]
		select {
		case <-ctx.Done():
			return
		case req := <-b.reqs:
			batch = append(batch, req)
		}
	more:
		for len(batch) < b.max {
			select {
			case req := <-b.reqs:
				batch = append(batch, req)
			default:
				break more
			}
		}
		for _, req := range batch {
			uids = append(uids, req.uid)
		}
		cctx, cancel := context.WithTimeout(ctx, b.timeout)
		got, errs := b.checkFn(cctx, uids)
		cancel()
		for i, req := range batch {
			req.reply <- checkReply{check: checkOf(got[i]), err: errs[i]}
		}
		metricCheckBatch.Observe(float64(len(batch)))
	}
}
