package session

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
)

// Scripts in pipelines, on a Redis Cluster whose slots move.
//
// Every script declares each key it touches in KEYS, so a node checks
// them all before it runs the script. While a slot migrates, the source
// answers ASK when it holds none of them, and either node answers
// TRYAGAIN when they are split between the two or some do not exist (a
// session key that ran out, an empty hold set): the script then runs
// nowhere rather than read a key where it no longer is. The refused call
// never ran, so sending it again is safe.
//
// go-redis v9 follows MOVED and ASK in a pipeline, up to MaxRedirects
// times, but retries TRYAGAIN only when it is the reply to the first
// command of a node's batch, and then it resends the whole batch: with
// the commands of it that were answered ASK or MOVED, which it has
// queued for their new node already. Those then run twice, on two
// connections at once that race to write their replies (v9.23.0, seen
// by the race detector mid-migration). So on a cluster runScripts marks
// its calls as not to be resent by go-redis (a batch holding one is not),
// and resends those a moving slot refused itself; an ASK that leads to
// TRYAGAIN surfaces as that error too. And a slot moved to a node that
// never ran a script answers its EVALSHA with NOSCRIPT: runScripts
// resends those with the source.

const (
	// slotRetryPause is the first pause before sending again calls a
	// moving slot refused; it doubles up to slotRetryPauseMax.
	slotRetryPause    = 5 * time.Millisecond
	slotRetryPauseMax = 100 * time.Millisecond
	// DefaultSlotRetry is how long renewals and route writes are sent
	// again while their slot moves: a slot of a bucket holds a few
	// thousand keys, which redis-cli moves in well under a second. A
	// gateway counts a round trip over a second as an outage, so this
	// fits under it.
	DefaultSlotRetry = 750 * time.Millisecond
)

// slotMoving reports whether err is a Redis Cluster's refusal of a
// command whose slot is moving or has moved: TRYAGAIN, ASK, MOVED.
func slotMoving(err error) bool {
	if err == nil {
		return false
	}
	if redis.IsTryAgainError(err) {
		return true
	}
	_, ask := redis.IsAskError(err)
	_, moved := redis.IsMovedError(err)
	return ask || moved
}

// noRetry is a script call go-redis does not resend itself.
type noRetry struct{ *redis.Cmd }

func (noRetry) NoRetry() bool { return true }

// noRetryPipe queues the scripts' EVAL and EVALSHA as noRetry.
type noRetryPipe struct{ redis.Pipeliner }

func (p noRetryPipe) Eval(ctx context.Context, src string, keys []string, args ...any) *redis.Cmd {
	return p.eval(ctx, "eval", src, keys, args)
}

func (p noRetryPipe) EvalSha(ctx context.Context, sha string, keys []string, args ...any) *redis.Cmd {
	return p.eval(ctx, "evalsha", sha, keys, args)
}

func (p noRetryPipe) eval(ctx context.Context, name, payload string, keys []string, args []any) *redis.Cmd {
	cmdArgs := make([]any, 0, 3+len(keys)+len(args))
	cmdArgs = append(cmdArgs, name, payload, len(keys))
	for _, k := range keys {
		cmdArgs = append(cmdArgs, k)
	}
	cmd := redis.NewCmd(ctx, append(cmdArgs, args...)...)
	if len(keys) > 0 {
		cmd.SetFirstKeyPos(3)
	}
	p.Process(ctx, noRetry{cmd})
	return cmd
}

// scriptCall is the i-th script call of a pipeline: the script, its keys
// and its arguments.
type scriptCall func(i int) (*redis.Script, []string, []any)

// runScripts runs n script calls in one pipeline and returns their
// replies in order. Each is sent by SHA; those a node had not cached
// (first use, a restarted node, a slot moved to a node that never ran
// the script) go again at once with the source, which caches it. Those
// a moving slot refused go again after a pause that grows, for as long as
// within allows since the first send; past it, or once ctx is done, their
// errors stay. Calls sent again keep their order.
func (s *Store) runScripts(ctx context.Context, n int, call scriptCall, within time.Duration) []*redis.Cmd {
	cmds := make([]*redis.Cmd, n)
	pending := make([]int, n)
	for i := range pending {
		pending[i] = i
	}
	start := time.Now()
	pause := slotRetryPause
	bySHA := true
	for {
		// Errors are per command; Pipelined's own is the first of them.
		s.rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
			var p redis.Pipeliner = pipe
			if _, cluster := s.rdb.(*redis.ClusterClient); cluster {
				// A single Redis keeps go-redis's resending of a pipeline
				// whose connection broke.
				p = noRetryPipe{pipe}
			}
			for _, i := range pending {
				script, keys, args := call(i)
				if bySHA {
					cmds[i] = script.EvalSha(ctx, p, keys, args...)
				} else {
					cmds[i] = script.Eval(ctx, p, keys, args...)
				}
			}
			return nil
		})
		bySHA = false
		again := pending[:0:0]
		moving := false
		late := time.Since(start)+pause > within
		for _, i := range pending {
			switch err := cmds[i].Err(); {
			case redis.HasErrorPrefix(err, "NOSCRIPT"):
				again = append(again, i)
			case slotMoving(err) && !late:
				again = append(again, i)
				moving = true
			}
		}
		if len(again) == 0 {
			return cmds
		}
		if moving {
			select {
			case <-ctx.Done():
				return cmds
			case <-time.After(pause):
			}
			pause = min(2*pause, slotRetryPauseMax)
		}
		pending = again
	}
}

// runScriptsOverlapped is runScripts in two pipelines at once, each of
// half the calls: Redis runs the first half's scripts while the second's
// are built and sent, and the second's while the first's replies are
// read, so that it does not wait between one batch and the next. The
// calls of each half keep their order; a caller whose order matters
// across calls (two calls of one user) must not split them.
func (s *Store) runScriptsOverlapped(ctx context.Context, n int, call scriptCall, within time.Duration) []*redis.Cmd {
	if n < 2 {
		return s.runScripts(ctx, n, call, within)
	}
	h := n / 2
	var second []*redis.Cmd
	done := make(chan struct{})
	go func() {
		defer close(done)
		second = s.runScripts(ctx, n-h, func(i int) (*redis.Script, []string, []any) { return call(h + i) }, within)
	}()
	first := s.runScripts(ctx, h, call, within)
	<-done
	return append(first, second...)
}
